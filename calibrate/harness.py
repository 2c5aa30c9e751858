"""A calibration end to end: check the request, time the model step over a grid of batch shapes,
fit, and write the profile YAML + CSV.

    shapes = grid_shapes(GRIDS[name], seed)                   # calibrate/grid.py
    rows   = measure(step, shapes, ...)                       # calibrate/timing.py
    fit    = fit_step_model(rows[split == "fit"])             # calibrate/fit.py
    error  = heldout_error(fit, rows[split == "heldout"])
    write CSV (one row per shape) and the profile YAML next to it
"""
from __future__ import annotations

import contextlib
import datetime
import platform
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from sim.files import probe_writable, write_file
from sim.presets.models import ModelSpec

from .fit import fit_step_model, heldout_error, relative_errors, write_profile
from .grid import GRIDS, Shape, estimate_seconds, grid_shapes, parts_shapes
from .model import ATTENTION_BACKENDS, ModelStep
from .timing import PARTS, measure

# repeats: shuffled rounds; burst: timed steps per shape and round, after one left-out step
DEFAULTS = {"cuda": {"grid": "full", "warmup": 3, "repeats": 6, "burst": 3},
            "cpu": {"grid": "small", "warmup": 3, "repeats": 8, "burst": 3}}
RESERVE_BYTES = 6 * 2**30  # CUDA memory kept free for activations, logits and the allocator
CPU_CACHE_BYTES = 2**30    # KV cache size limit on the CPU
CPU_WEIGHT_BYTES = 2**32   # larger models are refused on the CPU (hours per grid, or out of memory)



# ---- the whole calibration ------------------------------------------------------------------

class CalibrationError(ValueError):
    """A bad request (unknown model or grid, no CUDA, unwritable output): one-line message."""


def calibrate(model: str, device: str, out: Path, *, grid: str | None = None,
              repeats: int | None = None, burst: int | None = None, warmup: int | None = None,
              seed: int = 0,
              attention: str | None = None, block_size: int = 16,
              progress: Callable[[int, int], None] | None = None,
              log: Callable[[str], None] = print) -> dict:
    """Measure `model` on `device` over a grid, fit, write `out` (profile YAML) and the CSV next
    to it (`out` with suffix .csv). Returns a summary (paths, shapes, wall time, held-out error)."""
    import torch

    from sim.presets.models import MODEL_PRESETS

    start = time.perf_counter()
    if model not in MODEL_PRESETS:
        raise CalibrationError(f"--model: unknown model {model!r}; allowed: "
                               f"{', '.join(MODEL_PRESETS)}")
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
    use_device(dev)
    defaults = DEFAULTS[dev.type]
    grid = grid or defaults["grid"]
    if grid not in GRIDS:
        raise CalibrationError(f"--grid: unknown grid {grid!r}; allowed: {', '.join(GRIDS)}")
    repeats = defaults["repeats"] if repeats is None else repeats
    burst = defaults["burst"] if burst is None else burst
    warmup = defaults["warmup"] if warmup is None else warmup
    if repeats < 1 or burst < 1 or warmup < 0:
        raise CalibrationError(f"--repeats and --burst must be >= 1 and --warmup >= 0, got "
                               f"{repeats}, {burst}, {warmup}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise CalibrationError(f"--seed: {seed} is not an integer >= 0")
    if attention not in (None, *ATTENTION_BACKENDS):
        raise CalibrationError(f"--attention: unknown attention {attention!r}; allowed: "
                               f"{', '.join(ATTENTION_BACKENDS)}")
    out, csv_path = Path(out), Path(out).with_suffix(".csv")
    _check_writable(out)

    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    shapes = grid_shapes(GRIDS[grid], seed)
    num_blocks, shapes, skipped = _fit_in_memory(spec, shapes, block_size, dev, dtype)
    parts = [p for p in parts_shapes(GRIDS[grid]) if p in shapes]
    step = ModelStep(spec, device=str(dev), dtype=dtype, num_blocks=num_blocks,
                     block_size=block_size, seed=seed, attention=attention)
    runs = warmup + repeats * (1 + burst)
    plan = (f"calibrate: {spec.name} on {dev} ({_dtype_name(dtype)}, attention={step.attention}, "
            f"grid={grid}): {len(shapes)} shapes x ({warmup} warm-up + {repeats} rounds x "
            f"(1 + {burst} timed)) = {len(shapes) * runs} steps, + {len(parts)} x {1 + repeats} "
            f"instrumented")
    if skipped:
        plan += f"; {skipped} shapes skipped (KV cache does not fit)"
    log(plan)
    if dev.type == "cuda":
        est = estimate_seconds(spec, shapes, runs) + estimate_seconds(spec, parts, 1 + repeats)
        log(f"calibrate: roofline estimate for an H100: {est:.0f} s of steps, plus Triton "
            f"compilation (~1-2 min on a fresh cache) and model set-up")

    rows = measure(step, shapes, warmup=warmup, repeats=repeats, burst=burst, seed=seed, parts=parts,
                   progress=progress)
    fit_rows, held = rows[rows["split"] == "fit"], rows[rows["split"] == "heldout"]
    fit = fit_step_model(fit_rows)
    mape, worst = heldout_error(fit, held) if len(held) else (None, None)
    rows["predicted_ms"] = fit.predict(rows) * 1e3
    rows["error_pct"] = relative_errors(fit, rows) * 100
    meta = _metadata(spec, step, grid, shapes, parts, rows, repeats, burst, warmup, seed, csv_path,
                     mape, worst, skipped)
    out.unlink(missing_ok=True)  # never an old profile beside the new measurements
    write_file(csv_path, rows.to_csv(index=False, float_format="%.6g"))
    write_profile(out, fit, meta)  # last: a profile on disk means a complete calibration
    wall = time.perf_counter() - start
    return {"profile": out, "csv": csv_path, "shapes": len(shapes), "skipped": skipped,
            "wall_s": wall, "heldout_mape": mape, "heldout_max_error": worst,
            "fit_mape": float(np.abs(relative_errors(fit, fit_rows)).mean()), "fit": fit}


def use_device(dev) -> None:
    """Make `cuda:N` the current device: CUDA events record on the current device's stream and
    Triton launches on the current device. Plain `cuda` already is the current one (and
    torch.cuda.set_device refuses a device without an index)."""
    import torch

    if dev.type == "cuda" and dev.index is not None:
        torch.cuda.set_device(dev.index)


def _check_writable(out: Path) -> None:
    if out.is_dir():
        raise CalibrationError(f"--out {out}: is a directory; give a file name ending in .yaml")
    if out.suffix not in (".yaml", ".yml"):
        raise CalibrationError(f"--out {out}: give a file name ending in .yaml (the measurements "
                               f"go next to it, with .csv)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        probe_writable(out.parent)
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


def _metadata(spec, step, grid, shapes, parts, rows, repeats, burst, warmup, seed, csv_path, mape,
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
             f"{'thread CPU time' if cpu else 'CUDA events'} around ModelStep.run (host input "
             f"preparation + forward + greedy token read-back), {warmup} warm-up steps per "
             f"shape, then {repeats} shuffled rounds, each running a shape 1 + {burst} times in a "
             f"row: median of the {repeats * burst} later steps (the first one, after another "
             f"shape, is cold_ms in the CSV). Raw rows and the time split: {csv_path.name}.")
    if cpu:
        notes += " CPU measurement: NOT representative of any GPU."
    return {
        "device": _device_name(step.device), "model": spec.name, "dtype": _dtype_name(step.dtype),
        "tensor_parallel_size": 1, "measured": True, "torch": str(torch.__version__),
        "triton": triton_version, "date": datetime.date.today().isoformat(),
        "grid": {"name": grid, "shapes": {k: int(v) for k, v in kinds.items()},
                 "skipped_for_memory": skipped, "repeats": repeats, "burst": burst,
                 "warmup": warmup, "seed": seed, "block_size": step.block_size, "csv": csv_path.name,
                 **{k: v for k, v in GRIDS[grid].items() if k not in ("parts", "heldout")}},
        "attention": step.attention,
        "time_split_ms": split,
        "heldout_mape": None if mape is None else round(mape, 5),
        "heldout_max_error": None if worst is None else round(worst, 5),
        "notes": notes,
    }
