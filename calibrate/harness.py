"""Time the model step over a designed grid of batch shapes, fit, and write profile YAML + CSV.

    shapes = grid_shapes(GRIDS[name], model, seed)            # fit shapes + held-out shapes
    rows   = measure(step, shapes, ...)                       # warm-up, then medians of repeats
    fit    = fit_step_model(rows[split == "fit"])             # calibrate/fit.py
    error  = heldout_error(fit, rows[split == "heldout"])
    write CSV (one row per shape) and the profile YAML next to it

Fit shapes: decode-only batches (batch x context), single prefill chunks (chunk x earlier
context), several prefill chunks at once, and mixed batches (a chunk plus decodes). Held-out
shapes are random scheduler-like batches (a token budget shared by decodes of scattered contexts
and at most one prefill chunk), never used in the fit.

Timing: on CUDA, `torch.cuda.Event`s around `ModelStep.run` after a synchronize, so a step
counts host input preparation, kernel launches and the token read-back, as an engine iteration
does. On the CPU, `time.process_time` (CPU seconds of this process) around the same call: on a
shared machine wall time would mostly measure the neighbours. Every shape is warmed up first (which
also pays Triton's compilation of that shape's kernel variants); the shapes run in a seeded
random order so that slow drifts spread over the grid instead of biasing one region.
"""
from __future__ import annotations

import contextlib
import datetime
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sim.cost import prefill_attention_work
from sim.models import ModelSpec

from .fit import fit_step_model, heldout_error, relative_errors, write_profile
from .model import ATTENTION_BACKENDS, ModelStep, batch_stats, blocks_needed, synthetic_chunks

PARTS = ("gemm", "kv_write", "attn_decode", "attn_prefill")
CSV_COLUMNS = ("split", "kind", "shape", "num_seqs", "total_tokens", "prefill_tokens", "num_decodes",
               "decode_context_sum", "prefill_attention_work", "median_ms", "min_ms", "iqr_ms",
               "repeats", *(f"{p}_ms" for p in PARTS), "rest_ms", "instrumented_ms",
               "predicted_ms", "error_pct")

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
DEFAULTS = {"cuda": {"grid": "full", "warmup": 3, "repeats": 10},
            "cpu": {"grid": "small", "warmup": 3, "repeats": 10}}
RESERVE_BYTES = 6 * 2**30  # CUDA memory kept free for activations, logits and the allocator
CPU_CACHE_BYTES = 2**30    # KV cache size limit on the CPU
CPU_WEIGHT_BYTES = 2**32   # larger models are refused on the CPU (hours per grid, or out of memory)


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


class SectionTimer:
    """`timer(name)` context managers for ModelStep.logits: sums time per section over a step.
    CUDA: event pairs, read after the step has synchronised; CPU: process_time."""

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
            t = time.process_time()
            yield
            self.spans.append((name, t, time.process_time()))

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
    t = time.process_time()
    step.run(chunks, timer)
    return (time.process_time() - t) * 1e3


def measure(step: ModelStep, shapes: list[Shape], *, warmup: int, repeats: int, seed: int,
            parts: list[Shape] = (), progress: Callable[[int, int], None] | None = None) -> pd.DataFrame:
    """One row per shape: BatchStats features and the median/min/IQR of `repeats` timed steps.

    Each shape first runs `warmup` untimed steps. The timed steps then go in `repeats` rounds, each
    round running every shape once in a fresh random order, so that a slow stretch of time (a busy
    neighbour, a clock change) lands on one sample of many shapes rather than on every sample of
    one shape. Shapes in `parts` (which must be among `shapes`) then run `repeats` more times with
    a SectionTimer: median time in GEMMs, KV writes, decode and prefill attention, and the rest
    (norms, rotary, activations, embedding, sampling, host work)."""
    rng = np.random.default_rng([seed, 7])
    batches = [_chunks(step, shape, seed + i) for i, shape in enumerate(shapes)]
    total = len(shapes) * (1 + repeats) + len(parts)
    done = 0
    for i in rng.permutation(len(shapes)):
        for _ in range(warmup):
            step.run(batches[i])
        done += 1
        if progress:
            progress(done, total)
    times = np.zeros((len(shapes), repeats))
    for r in range(repeats):
        for i in rng.permutation(len(shapes)):
            times[i, r] = time_step(step, batches[i])
            done += 1
            if progress:
                progress(done, total)
    q75, q25 = np.percentile(times, [75, 25], axis=1)
    rows = [{**_features(chunks, shape), "median_ms": float(np.median(t)), "min_ms": float(t.min()),
             "iqr_ms": float(hi - lo), "repeats": repeats}
            for chunks, shape, t, hi, lo in zip(batches, shapes, times, q75, q25)]
    for shape in parts:
        row = rows[shapes.index(shape)]
        runs = []
        for _ in range(repeats):
            timer = SectionTimer(step.device.type == "cuda")
            ms = time_step(step, batches[shapes.index(shape)], timer)
            runs.append({**timer.totals_ms(), "instrumented": ms})
        med = pd.DataFrame(runs).median()
        row.update({f"{p}_ms": float(med[p]) for p in PARTS})
        row["instrumented_ms"] = float(med["instrumented"])
        row["rest_ms"] = float(med["instrumented"] - sum(med[p] for p in PARTS))
        done += 1
        if progress:
            progress(done, total)
    return pd.DataFrame(rows).reindex(columns=list(CSV_COLUMNS))


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
    from sim.batch import BatchStats
    from sim.cost import RooflineCost
    from sim.hardware import HARDWARE_PRESETS

    cost = RooflineCost(model, HARDWARE_PRESETS["h100-sxm"])
    total = 0.0
    for s in shapes:
        st = BatchStats(prefill_lens=np.array(s.prefill_lens, dtype=np.int64),
                        prefill_contexts=np.array(s.prefill_contexts, dtype=np.int64),
                        num_decodes=len(s.decode_contexts),
                        decode_context_sum=sum(s.decode_contexts) + len(s.decode_contexts))
        total += float(cost.step_times(st)[0]) * runs_per_shape
    return total


# ---- the whole calibration ------------------------------------------------------------------

class CalibrationError(ValueError):
    """A bad request (unknown model or grid, no CUDA, unwritable output): one-line message."""


def calibrate(model: str, device: str, out: Path, *, grid: str | None = None,
              repeats: int | None = None, warmup: int | None = None, seed: int = 0,
              attention: str | None = None, block_size: int = 16,
              progress: Callable[[int, int], None] | None = None,
              log: Callable[[str], None] = print) -> dict:
    """Measure `model` on `device` over a grid, fit, write `out` (profile YAML) and the CSV next
    to it (`out` with suffix .csv). Returns a summary (paths, shapes, wall time, held-out error)."""
    import torch

    from sim.models import MODEL_PRESETS

    start = time.perf_counter()
    if model not in MODEL_PRESETS:
        raise CalibrationError(f"unknown model {model!r}; allowed: {', '.join(MODEL_PRESETS)}")
    spec = MODEL_PRESETS[model]
    try:
        dev = torch.device(device)
    except RuntimeError:
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise CalibrationError(f"--device {device!r}: allowed: cpu, cuda, cuda:N")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise CalibrationError(f"--device {device}: CUDA is not available on this machine "
                               f"(torch {torch.__version__}); use --device cpu --model tiny")
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        raise CalibrationError(f"--device {device}: only {torch.cuda.device_count()} CUDA devices")
    defaults = DEFAULTS[dev.type]
    grid = grid or defaults["grid"]
    if grid not in GRIDS:
        raise CalibrationError(f"unknown grid {grid!r}; allowed: {', '.join(GRIDS)}")
    repeats = defaults["repeats"] if repeats is None else repeats
    warmup = defaults["warmup"] if warmup is None else warmup
    if repeats < 1 or warmup < 0:
        raise CalibrationError(f"--repeats must be >= 1 and --warmup >= 0, got {repeats}, {warmup}")
    if attention not in (None, *ATTENTION_BACKENDS):
        raise CalibrationError(f"unknown attention {attention!r}; allowed: {', '.join(ATTENTION_BACKENDS)}")
    out, csv_path = Path(out), Path(out).with_suffix(".csv")
    _check_writable(out)

    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    shapes = grid_shapes(GRIDS[grid], seed)
    num_blocks, shapes, skipped = _fit_in_memory(spec, shapes, block_size, dev, dtype)
    parts = [p for p in parts_shapes(GRIDS[grid]) if p in shapes]
    step = ModelStep(spec, device=str(dev), dtype=dtype, num_blocks=num_blocks,
                     block_size=block_size, seed=seed, attention=attention)
    runs = warmup + repeats
    plan = (f"calibrate: {spec.name} on {dev} ({_dtype_name(dtype)}, attention={step.attention}, "
            f"grid={grid}): {len(shapes)} shapes x ({warmup} warm-up + {repeats} timed) = "
            f"{len(shapes) * runs} steps, + {len(parts)} x {repeats} instrumented")
    if skipped:
        plan += f"; {skipped} shapes skipped (KV cache does not fit)"
    log(plan)
    if dev.type == "cuda":
        est = estimate_seconds(spec, shapes, runs) + estimate_seconds(spec, parts, repeats)
        log(f"calibrate: roofline estimate for an H100: {est:.0f} s of steps, plus Triton "
            f"compilation (~1-2 min on a fresh cache) and model set-up")

    rows = measure(step, shapes, warmup=warmup, repeats=repeats, seed=seed, parts=parts,
                   progress=progress)
    fit_rows, held = rows[rows["split"] == "fit"], rows[rows["split"] == "heldout"]
    fit = fit_step_model(fit_rows)
    mape, worst = heldout_error(fit, held) if len(held) else (None, None)
    rows["predicted_ms"] = fit.predict(rows) * 1e3
    rows["error_pct"] = relative_errors(fit, rows) * 100
    meta = _metadata(spec, step, grid, shapes, parts, rows, repeats, warmup, seed, csv_path,
                     mape, worst, skipped)
    rows.to_csv(csv_path, index=False, float_format="%.6g")
    write_profile(out, fit, meta)  # last: a profile on disk means a complete calibration
    wall = time.perf_counter() - start
    return {"profile": out, "csv": csv_path, "shapes": len(shapes), "skipped": skipped,
            "wall_s": wall, "heldout_mape": mape, "heldout_max_error": worst,
            "fit_mape": float(np.abs(relative_errors(fit, fit_rows)).mean()), "fit": fit}


def _check_writable(out: Path) -> None:
    if out.is_dir():
        raise CalibrationError(f"--out {out}: is a directory; give a file name ending in .yaml")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        probe = out.parent / f".{out.name}.probe"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise CalibrationError(f"--out {out}: cannot write there ({exc.strerror or exc})") from None


def _fit_in_memory(spec: ModelSpec, shapes: list[Shape], block_size: int, dev, dtype):
    """(num_blocks, shapes whose KV fits, number skipped). CUDA: memory free after the weights
    minus RESERVE_BYTES; CPU: CPU_CACHE_BYTES."""
    import torch

    elem = torch.empty((), dtype=dtype).element_size()
    block_bytes = 2 * spec.num_layers * block_size * spec.kv_dim * elem
    if dev.type == "cuda":
        free = torch.cuda.mem_get_info(dev)[0]
        budget = free - spec.num_params * elem - RESERVE_BYTES
        if budget < block_bytes:
            raise CalibrationError(f"{spec.name} needs {spec.num_params * elem / 1e9:.1f} GB of "
                                   f"weights; {free / 1e9:.1f} GB are free on {dev}")
    else:
        if spec.num_params * elem > CPU_WEIGHT_BYTES:
            raise CalibrationError(f"{spec.name} has {spec.num_params * elem / 1e9:.1f} GB of weights "
                                   f"in {_dtype_name(dtype)}; CPU calibration is for small models "
                                   f"such as tiny")
        budget = CPU_CACHE_BYTES
    cap = budget // block_bytes
    kept = [s for s in shapes if s.blocks(block_size) <= cap]
    if not kept:
        raise CalibrationError(f"no grid shape fits a KV cache of {cap} blocks on {dev}")
    return max(s.blocks(block_size) for s in kept), kept, len(shapes) - len(kept)


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _device_name(dev) -> str:
    import torch

    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"CPU: {cpu} ({torch.get_num_threads()} threads)"


def _metadata(spec, step, grid, shapes, parts, rows, repeats, warmup, seed, csv_path, mape,
              worst, skipped) -> dict:
    import torch

    try:
        import triton
        triton_version = str(triton.__version__)
    except ImportError:
        triton_version = None
    kinds = pd.Series([s.kind for s in shapes]).value_counts().to_dict()
    split = {}
    for shape in parts:
        r = rows[rows["shape"] == shape.label].iloc[0]
        split[shape.label] = {k: round(float(r[f"{k}_ms"]), 4) for k in (*PARTS, "rest", "instrumented")}
    cpu = step.device.type == "cpu"
    notes = (f"Measured by servesim calibrate (calibrate/harness.py): random weights, "
             f"attention={step.attention}, block_size={step.block_size}, timing="
             f"{'process CPU time' if cpu else 'CUDA events'} around ModelStep.run (host input "
             f"preparation + forward + greedy token read-back), median of {repeats} after "
             f"{warmup} warm-up steps per shape. Raw rows and the time split: {csv_path.name}.")
    if cpu:
        notes += " CPU measurement: NOT representative of any GPU."
    return {
        "device": _device_name(step.device), "model": spec.name, "dtype": _dtype_name(step.dtype),
        "tensor_parallel_size": 1, "measured": True, "torch": str(torch.__version__),
        "triton": triton_version, "date": datetime.date.today().isoformat(),
        "grid": {"name": grid, "shapes": {k: int(v) for k, v in kinds.items()},
                 "skipped_for_memory": skipped, "repeats": repeats, "warmup": warmup, "seed": seed,
                 "block_size": step.block_size, "attention": step.attention, "csv": csv_path.name,
                 **{k: v for k, v in GRIDS[grid].items() if k not in ("parts", "heldout")},
                 "time_split_ms": split},
        "heldout_mape": None if mape is None else round(mape, 5),
        "heldout_max_error": None if worst is None else round(worst, 5),
        "notes": notes,
    }
