"""What a hybrid model's linear-attention layers add to an iteration (Qwen3-Next's Gated DeltaNet).

The inner cost model prices everything else over the whole model: every layer's projections
(Gated DeltaNet's in_proj_qkvz, in_proj_ba and out_proj among them: sim/cost/composer.gemm_shapes,
ModelSpec.linear_params_total), the MoE, the all-reduces, and softmax attention in the
`ModelSpec.attention_layers` that have it. This adds, per linear-attention layer and iteration, the
recurrent kernels vLLM runs there (its GatedDeltaNet forward):

- prefill chunks: `causal_conv1d_fn` + `chunk_gated_delta_rule` over the iteration's b chunks at
  their mean length s = tokens / b. Neither reads the cached context (a chunk starts from the
  request's state), so a chunk costs what its own tokens cost, wherever it sits in its prompt.
- decodes: `causal_conv1d_update` + `fused_recurrent_gated_delta_rule` at the n decoding sequences.

**Measured** where the GPU's kernel tables time the model's heads per GPU (sim/tables/<gpu>/gdn.csv:
vLLM 0.24's kernels, timed by NVIDIA AIConfigurator at key/value head dims 128 and conv 4; bilinear in
(chunks, length) and piecewise-linear in sequences, monotone, as the composer reads its tables).
Else **estimated**, a stated roofline at RooflineCost's efficiencies (70% of the bf16 peak, 85% of
HBM bandwidth):

- decode: each sequence reads and writes its state: 2 x linear_state_bytes per layer, from HBM;
- prefill: max(FLOPs / peak, bytes / bandwidth) with, per token and value head, 6 x dk x dv FLOPs
  (its output against the state, the delta against the state, the state's update) plus
  2 x C x (dk + dv) for the attention within chunks of C = 64 tokens, and the state read and
  written once per chunk, the chunk's q, k, v read once.
"""
from __future__ import annotations

from collections import Counter
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from sim.cost.batch import BatchStats
from sim.cost.step_cost import CostModel, StepCost, as_cost_model
from sim.presets.memory import linear_state_bytes

PREFILL_KERNELS = ("causal_conv1d_fn", "chunk_gated_delta_rule_flashinfer")
DECODE_KERNELS = ("causal_conv1d_update", "fused_recurrent_gated_delta_rule_packed_decode")
CHUNK = 64                    # tokens per chunk of the chunked delta rule (its kernels' chunk size)
COMPUTE_EFFICIENCY = 0.7      # RooflineCost's defaults
BANDWIDTH_EFFICIENCY = 0.85


class MeasuredKernels:
    """The Gated DeltaNet kernels of one GPU at one (key heads, value heads) per GPU, from gdn.csv
    (ms, as measured). ValueError where the table has no rows for them."""

    measured = True

    def __init__(self, frame: pd.DataFrame, model, tensor_parallel_size: int, where: str = ""):
        from sim.cost.composer import _Curve, _Grid  # (the composer's monotone lookups)

        lin, tp = model.linear_attention, tensor_parallel_size
        nk, nv = lin.num_key_heads // tp, lin.num_value_heads // tp
        rows = frame[(frame["num_k_heads"] == nk) & (frame["num_v_heads"] == nv)
                     & (frame["head_k_dim"] == lin.key_head_dim) & (frame["head_v_dim"] == lin.value_head_dim)
                     & (frame["d_conv"] == lin.conv_kernel)]
        missing = [k for k in PREFILL_KERNELS + DECODE_KERNELS if not (rows["kernel"] == k).any()]
        if missing:
            raise ValueError(f"{where}no Gated DeltaNet rows for {nk} key / {nv} value heads per GPU of "
                             f"{lin.key_head_dim} x {lin.value_head_dim}, conv {lin.conv_kernel} ({missing[0]})")
        self._prefill = [_Grid(rows[rows["kernel"] == k], "batch_size", "seq_len") for k in PREFILL_KERNELS]
        self._decode = [_Curve(g["batch_size"].to_numpy(), g["latency_ms"].to_numpy())
                        for g in (rows[rows["kernel"] == k] for k in DECODE_KERNELS)]
        self.extrapolated: Counter = Counter()
        self.heads = (nk, nv)

    def prefill_s(self, chunks: int, tokens: int) -> float:
        """One layer's prefill kernels for `chunks` chunks of `tokens` tokens in all, seconds."""
        length = tokens / chunks
        return sum(g(chunks, length, self.extrapolated, "linear-attention prefill") for g in self._prefill) / 1e3

    def decode_s(self, seqs: int) -> float:
        return sum(c(seqs, self.extrapolated, "linear-attention decode") for c in self._decode) / 1e3


class RooflineKernels:
    """The stated estimate of the module docstring, for a GPU without measured rows."""

    measured = False

    def __init__(self, model, hardware, tensor_parallel_size: int):
        lin, tp = model.linear_attention, tensor_parallel_size
        byte_s = hardware.hbm_bandwidth * BANDWIDTH_EFFICIENCY
        flop_s = hardware.bf16_flops * COMPUTE_EFFICIENCY
        state = linear_state_bytes(model, tp)
        dk, dv, heads = lin.key_head_dim, lin.value_head_dim, lin.num_value_heads // tp
        self._decode_s_per_seq = 2 * state / byte_s
        self._prefill_s_per_token = max(heads * (6 * dk * dv + 2 * CHUNK * (dk + dv)) / flop_s,
                                        (2 * state / CHUNK + lin.conv_dim // tp * model.dtype_bytes) / byte_s)

    def prefill_s(self, chunks: int, tokens: int) -> float:
        return self._prefill_s_per_token * tokens

    def decode_s(self, seqs: int) -> float:
        return self._decode_s_per_seq * seqs


def gdn_table(folder: Path | None) -> pd.DataFrame | None:
    """A GPU's gdn.csv (None: no tables, or none measured there)."""
    path = None if folder is None else Path(folder) / "gdn.csv"
    return pd.read_csv(path) if path is not None and path.is_file() else None


@lru_cache(maxsize=32)
def kernels_for(model, hardware, tensor_parallel_size: int):
    """Measured kernels where the hardware preset's tables time the model's heads per GPU, else the
    roofline's: (kernels, why not measured or None). Kept for the process: a scenario asks when it
    loads (its notice) and again for each run it builds (a plan builds hundreds)."""
    from sim.cost.composer import SYSTEMS, TABLES  # (the one place preset and tables meet)
    from sim.presets.hardware import is_preset

    if not is_preset(hardware) or hardware.name not in SYSTEMS:
        return RooflineKernels(model, hardware, tensor_parallel_size), f"no kernel tables for {hardware.name}"
    frame = gdn_table(TABLES / SYSTEMS[hardware.name])
    if frame is None:
        return RooflineKernels(model, hardware, tensor_parallel_size), f"no Gated DeltaNet table for {hardware.name}"
    try:
        return MeasuredKernels(frame, model, tensor_parallel_size), None
    except ValueError as e:
        return RooflineKernels(model, hardware, tensor_parallel_size), str(e)


class LinearAttentionCost(StepCost):
    """`inner`'s step plus `layers` linear-attention layers' recurrent kernels (module docstring)."""

    def __init__(self, inner: CostModel, kernels, layers: int):
        self.inner, self.kernels, self.layers = as_cost_model(inner), kernels, layers
        self._decode: dict[int, float] = {}  # num_decodes -> seconds (decode runs repeat it)

    def extra_s(self, stats: BatchStats) -> float:
        """Seconds the linear-attention kernels add to an iteration of `stats`."""
        out = 0.0
        n = stats.num_decodes
        if n:
            s = self._decode.get(n)
            if s is None:
                s = self._decode[n] = self.layers * self.kernels.decode_s(n)
            out += s
        chunks = len(stats.prefill_lens)
        if chunks:
            out += self.layers * self.kernels.prefill_s(chunks, stats.prefill_tokens)
        return out

    def step_times(self, stats: BatchStats, steps: int = 1) -> np.ndarray:
        # (a run of decodes: the same sequences every iteration, so the same kernels' time)
        return self.inner.step_times(stats, steps) + self.extra_s(stats)

    def step_time(self, stats: BatchStats) -> float:
        return self.inner.step_time(stats) + self.extra_s(stats)

    def decode_line(self, stats: BatchStats) -> tuple[float, float, int, int, float] | None:
        return None  # (a + e/s would not round to step_times' floats: the runs take step_times)

    def decode_times(self, stats: BatchStats, steps: int) -> list[float] | None:
        times = self.inner.decode_times(stats, steps)
        if times is None:
            return None
        extra = self.extra_s(stats)
        return [t + extra for t in times]  # (step_times' array + extra, element by element)


def describe(kernels, layers: int) -> str:
    """One line for notices: what priced the linear-attention layers."""
    if kernels.measured:
        nk, nv = kernels.heads
        return (f"{layers} Gated DeltaNet layers' kernels measured (vLLM 0.24, AIConfigurator tables, "
                f"{nk} key / {nv} value heads per GPU)")
    return f"{layers} Gated DeltaNet layers' kernels estimated (a stated roofline: sim/cost/linear_attention.py)"

