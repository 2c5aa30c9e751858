"""The designed grid of batch shapes a calibration times, and the held-out batches it checks with.

Fit shapes: decode-only batches (batch x context), single prefill chunks (chunk x earlier
context), several prefill chunks at once, and mixed batches (a chunk plus decodes). Held-out
shapes are random scheduler-like batches (a token budget shared by decodes of scattered contexts
and at most one prefill chunk), never used in the fit.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.presets.models import ModelSpec

from .model import blocks_needed

# Grid name -> batch shapes. `full` is sized for a 7-8B model on one 80 GB GPU within a 10-minute
# calibration; `small` for the tiny model on a CPU (and a quick smoke run on a GPU).
GRIDS: dict[str, dict] = {
    "full": {
        "decode_batches": [1, 2, 4, 8, 16, 32, 64, 128, 256],
        "decode_contexts": [128, 512, 2048, 8192],
        "prefill_chunks": [16, 64, 256, 512, 1024, 2048, 4096, 8192],
        "prefill_contexts": [0, 2048, 8192],
        "multi_prefill": [[4, 256], [16, 128], [8, 512], [4, 2048]],       # [chunks, tokens each]
        "mixed_chunks": [512, 2048], "mixed_chunk_contexts": [0, 4096],
        "mixed_decodes": [8, 64, 192], "mixed_decode_context": 1024,
        "heldout": 16, "max_tokens": 8192, "max_seqs": 256, "max_context": 8192,
        "parts": [[[], 64, 2048], [[2048], 0, 0], [[512], 64, 1024]],   # [chunks, decodes, context]
    },
    "small": {
        "decode_batches": [1, 4, 16, 64],
        "decode_contexts": [16, 128, 512],
        "prefill_chunks": [8, 32, 128, 512],
        "prefill_contexts": [0, 256],
        "multi_prefill": [[4, 32], [8, 64]],
        "mixed_chunks": [64, 256], "mixed_chunk_contexts": [0],
        "mixed_decodes": [4, 16], "mixed_decode_context": 128,
        "heldout": 10, "max_tokens": 512, "max_seqs": 64, "max_context": 512,
        "parts": [[[], 16, 128], [[128], 0, 0], [[64], 16, 128]],
    },
}

@dataclass(frozen=True)
class Shape:
    kind: str                        # decode | prefill | mixed | heldout
    prefill_lens: tuple[int, ...]
    prefill_contexts: tuple[int, ...]
    decode_contexts: tuple[int, ...]  # tokens cached before each decode's new token

    @property
    def split(self) -> str:
        return "heldout" if self.kind == "heldout" else "fit"

    @property
    def label(self) -> str:
        parts = [f"P{n}@{c}" for n, c in zip(self.prefill_lens, self.prefill_contexts)]
        if self.decode_contexts:
            d = self.decode_contexts
            ctx = d[0] if len(set(d)) == 1 else f"~{round(sum(d) / len(d))}"
            parts.append(f"D{len(d)}@{ctx}")
        return "+".join(parts)

    def blocks(self, block_size: int) -> int:
        seqs = list(zip(self.prefill_lens, self.prefill_contexts)) + [(1, c) for c in self.decode_contexts]
        return blocks_needed(seqs, block_size)


def grid_shapes(grid: dict, seed: int = 0) -> list[Shape]:
    """Fit shapes of `grid`, then `grid["heldout"]` random scheduler-like shapes."""
    g, out = grid, []
    for b in g["decode_batches"]:
        for c in g["decode_contexts"]:
            out.append(Shape("decode", (), (), (c,) * b))
    for n in g["prefill_chunks"]:
        for c in g["prefill_contexts"]:
            out.append(Shape("prefill", (n,), (c,), ()))
    for k, n in g["multi_prefill"]:
        out.append(Shape("prefill", (n,) * k, (0,) * k, ()))
    for n in g["mixed_chunks"]:
        for c in g["mixed_chunk_contexts"]:
            for d in g["mixed_decodes"]:
                out.append(Shape("mixed", (n,), (c,), (g["mixed_decode_context"],) * d))
    return out + heldout_shapes(g, g["heldout"], seed)


def heldout_shapes(grid: dict, count: int, seed: int) -> list[Shape]:
    """Batches a chunked-prefill scheduler could form: up to max_seqs decodes with log-uniform
    contexts, plus (70% of the time) one prefill chunk filling part of the remaining token budget,
    after no context (half the time) or some."""
    rng = np.random.default_rng([seed, 6])
    max_ctx, budget = grid["max_context"], grid["max_tokens"]
    out = []
    while len(out) < count:
        n_dec = int(rng.integers(0, grid["max_seqs"] + 1)) if rng.random() < 0.85 else 0
        dec = np.exp(rng.uniform(np.log(16), np.log(max_ctx), n_dec)).astype(int)
        pre, pre_ctx = (), ()
        room = budget - n_dec
        if (rng.random() < 0.7 or n_dec == 0) and room >= 8:
            n = int(np.exp(rng.uniform(np.log(8), np.log(room))))
            c = int(rng.integers(1, max_ctx)) if rng.random() < 0.5 else 0
            pre, pre_ctx = (n,), (c,)
        if pre or n_dec:
            out.append(Shape("heldout", pre, pre_ctx, tuple(int(x) for x in dec)))
    return out


def parts_shapes(grid: dict) -> list[Shape]:
    """The grid's `parts` entries as Shapes equal to fit shapes (so the rows line up)."""
    out = []
    for chunks, decodes, ctx in grid["parts"]:
        kind = "mixed" if chunks and decodes else "prefill" if chunks else "decode"
        out.append(Shape(kind, tuple(chunks), (0,) * len(chunks), (ctx,) * decodes))
    return out


def estimate_seconds(model: ModelSpec, shapes: list[Shape], runs_per_shape: int) -> float:
    """Rough GPU time of a calibration: the roofline model of an H100 (with its 2 ms per-step
    overhead) for every warm-up and timed step. Compilation and model set-up come on top."""
    from sim.cost.batch import BatchStats
    from sim.cost.registry import RooflineCost
    from sim.presets.hardware import HARDWARE_PRESETS

    cost = RooflineCost(model, HARDWARE_PRESETS["h100-sxm"])
    total = 0.0
    for s in shapes:
        st = BatchStats(prefill_lens=np.array(s.prefill_lens, dtype=np.int64),
                        prefill_contexts=np.array(s.prefill_contexts, dtype=np.int64),
                        num_decodes=len(s.decode_contexts),
                        decode_context_sum=sum(s.decode_contexts) + len(s.decode_contexts))
        total += float(cost.step_times(st)[0]) * runs_per_shape
    return total
