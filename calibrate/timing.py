"""Timing model steps: one step's clock, a section timer for the time split, and the measurement
of a whole grid of shapes (one row of statistics per shape).

Clock: on CUDA, `torch.cuda.Event`s around `ModelStep.run` after a synchronize, so a step counts
host input preparation, kernel launches and the token read-back, as an engine iteration does. On
the CPU, `time.thread_time` (CPU seconds of the calling thread, which runs the step: torch uses
one thread) around the same call: on a shared machine wall time would mostly measure the
neighbours, and process time would also count other threads (a progress bar's refresh: ~3%).

Order: `repeats` rounds, each over every shape in a fresh random order (a slow stretch of time
then lands on one sample of many shapes, not on every sample of one shape), and within a round
each shape runs `1 + burst` times back to back. The first step of a burst follows a different
shape: caches hold that shape's data and code paths, which no engine iteration sees (an engine's
consecutive batches are alike). It is reported as `cold_ms` and left out; the `burst` steps after
it are the samples (`median_ms`, `min_ms`, `iqr_ms`).
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import numpy as np
import pandas as pd

from sim.cost.registry import prefill_attention_work

from .grid import Shape
from .model import ModelStep, batch_stats, synthetic_chunks

PARTS = ("gemm", "kv_write", "attn_decode", "attn_prefill")
CSV_COLUMNS = ("split", "kind", "shape", "num_seqs", "total_tokens", "prefill_tokens", "num_decodes",
               "decode_context_sum", "prefill_attention_work", "median_ms", "min_ms", "iqr_ms",
               "cold_ms", "repeats", *(f"{p}_ms" for p in PARTS), "rest_ms", "instrumented_ms",
               "predicted_ms", "error_pct")


class SectionTimer:
    """`timer(name)` context managers for ModelStep.logits: sums time per section over a step.
    CUDA: event pairs, read after the step has synchronised; CPU: thread_time."""

    def __init__(self, cuda: bool):
        self.cuda, self.spans = cuda, []

    @contextlib.contextmanager
    def __call__(self, name: str):
        import torch

        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self.spans.append((name, start, end))
        else:
            t = time.thread_time()
            yield
            self.spans.append((name, t, time.thread_time()))

    def totals_ms(self) -> dict[str, float]:
        out = dict.fromkeys(PARTS, 0.0)
        for name, a, b in self.spans:
            out[name] += a.elapsed_time(b) if self.cuda else (b - a) * 1e3
        return out


def time_step(step: ModelStep, chunks, timer=None) -> float:
    """Milliseconds of one `step.run(chunks)`, device work included."""
    import torch

    if step.device.type == "cuda":
        torch.cuda.synchronize(step.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step.run(chunks, timer)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    t = time.thread_time()
    step.run(chunks, timer)
    return (time.thread_time() - t) * 1e3


def measure(step: ModelStep, shapes: list[Shape], *, warmup: int, repeats: int, burst: int,
            seed: int, parts: list[Shape] = (),
            progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """One row per shape: BatchStats features and statistics of `repeats x burst` timed steps.

    Each shape first runs `warmup` untimed steps (this also pays Triton's compilation of its kernel
    variants). Then `repeats` rounds, each running every shape in a fresh random order, `1 + burst`
    times in a row: the first step (after another shape) is `cold_ms`, the next `burst` are the
    samples. Shapes in `parts` (which must be among `shapes`) then run once more, then `repeats`
    times with a SectionTimer: median time in GEMMs, KV writes, decode and prefill attention, and
    the rest (norms, rotary, activations, embedding, sampling, host work)."""
    if repeats < 1 or burst < 1:
        raise ValueError(f"repeats and burst must be >= 1, got {repeats}, {burst}")
    rng = np.random.default_rng([seed, 7])
    batches = [_chunks(step, shape, seed + i) for i, shape in enumerate(shapes)]
    total = len(shapes) * (1 + repeats) + len(parts)
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if progress:
            progress(done, total)

    for i in rng.permutation(len(shapes)):
        for _ in range(warmup):
            step.run(batches[i])
        tick()
    times = np.zeros((len(shapes), repeats, 1 + burst))
    for r in range(repeats):
        for i in rng.permutation(len(shapes)):
            for k in range(1 + burst):
                times[i, r, k] = time_step(step, batches[i])
            tick()
    rows = [{**_features(chunks, shape), **_stats(t[:, 1:].ravel()),
             "cold_ms": float(np.median(t[:, 0])), "repeats": t[:, 1:].size}
            for chunks, shape, t in zip(batches, shapes, times)]
    for shape in parts:
        rows[shapes.index(shape)].update(_time_split(step, batches[shapes.index(shape)], repeats))
        tick()
    return pd.DataFrame(rows).reindex(columns=list(CSV_COLUMNS))


def _stats(samples: np.ndarray) -> dict[str, float]:
    q25, q50, q75 = np.percentile(samples, [25, 50, 75])
    return {"median_ms": float(q50), "min_ms": float(samples.min()), "iqr_ms": float(q75 - q25)}


def _time_split(step: ModelStep, chunks, repeats: int) -> dict[str, float]:
    """Median ms per part over `repeats` instrumented steps (after one untimed step of the shape).
    The section timers add host work, so `instrumented_ms` is a little above `median_ms`."""
    step.run(chunks)
    runs = []
    for _ in range(repeats):
        timer = SectionTimer(step.device.type == "cuda")
        ms = time_step(step, chunks, timer)
        runs.append({**timer.totals_ms(), "instrumented": ms})
    med = pd.DataFrame(runs).median()
    return {**{f"{p}_ms": float(med[p]) for p in PARTS}, "instrumented_ms": float(med["instrumented"]),
            "rest_ms": float(med["instrumented"] - sum(med[p] for p in PARTS))}


def _chunks(step: ModelStep, shape: Shape, seed: int):
    return synthetic_chunks(list(shape.prefill_lens), list(shape.prefill_contexts),
                            list(shape.decode_contexts), vocab_size=step.spec.vocab_size,
                            block_size=step.block_size, num_blocks=step.num_blocks, seed=seed)


def _features(chunks, shape: Shape) -> dict:
    st = batch_stats(chunks)
    return {"split": shape.split, "kind": shape.kind, "shape": shape.label,
            "num_seqs": st.num_seqs, "total_tokens": st.total_tokens,
            "prefill_tokens": st.prefill_tokens, "num_decodes": st.num_decodes,
            "decode_context_sum": st.decode_context_sum,
            "prefill_attention_work": prefill_attention_work(st)}
