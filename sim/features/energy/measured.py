"""A GPU's busy power by utilisation, from kernels timed with the board's power measured.

AIConfigurator 0.12 measured board power beside latency for three B200 tables (context and
generation attention, the fused MoE; vLLM 0.22.0), imported as sim/tables/<gpu>/power.csv by
calibrate/aic_import.py (kernels of at least 0.3 ms: a shorter one's reading is not its steady
draw). Each row's utilisation is the same quantity the energy model computes per iteration,
max(compute, memory), here from the kernel's own work over its latency:

    context attention (causal prefill)  FLOPs  2 x batch x heads x head_dim x isl^2
                                        bytes  batch x isl x (2 heads + 2 kv_heads) x head_dim x e
    generation attention (decode)       FLOPs  4 x batch x heads x head_dim x kv_len
                                        bytes  batch x kv_len x 2 kv_heads x head_dim x e
    fused MoE                           FLOPs  6 x tokens x topk x hidden x inter / tp
                                        bytes  min(experts, tokens x topk) x 3 x hidden x inter / tp x e

(kv_len = isl + step; e the dtype's bytes; compute over the GPU's dense bf16 peak, as the energy
model does for every iteration). The curve is the rows' median power in utilisation bins (each
kernel one sample: a time-weighted mean would let a few 10-ms kernels decide a bin), made
non-decreasing (a busier GPU does not draw less: the dips are different kernel mixes), read
linearly between the bins' median utilisations; below the first it holds the first bin's value, a
busy GPU's floor. Only where a GPU's tables carry power: elsewhere the stated model.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from sim.cost.composer import SYSTEMS, TABLES, isotonic

DTYPE_BYTES = {"bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "fp8_block": 1.0, "int8": 1.0, "int4_wo": 0.5}
# utilisation bins the curve is read at (edges; the last bin takes everything from 0.9 up, clipped to 1)
EDGES = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
MIN_ROWS = 20  # a bin with fewer measured kernels is left out


@dataclass(frozen=True)
class BusyPower:
    """Busy power (W) of one GPU against utilisation: W at each point of `u`, between them linear."""
    u: tuple[float, ...]
    watts: tuple[float, ...]
    rows: int           # measured kernels it was built from
    source: str         # where they came from (the tables' folder and package)

    def __call__(self, u: np.ndarray) -> np.ndarray:
        return np.interp(np.clip(u, 0.0, 1.0), self.u, self.watts)


def utilisation(rows: pd.DataFrame, peak_flops: float, hbm_bandwidth: float) -> np.ndarray:
    """Each power.csv row's max(compute, memory) utilisation, from its shape and latency (above)."""
    nan = np.full(len(rows), np.nan)  # (a column no row's op has)
    f = {c: rows[c].to_numpy(dtype=np.float64) if c in rows else nan for c in (
        "batch_size", "isl", "step", "num_heads", "num_kv_heads", "head_dim", "num_tokens",
        "hidden_size", "inter_size", "topk", "num_experts", "tp")}
    e = rows["dtype"].map(DTYPE_BYTES).to_numpy(dtype=np.float64)
    op = rows["op"].to_numpy()
    b, h, kvh, d = f["batch_size"], f["num_heads"], f["num_kv_heads"], f["head_dim"]
    kv_len = f["isl"] + f["step"]
    flops = np.select([op == "context_attention", op == "generation_attention", op == "moe"], [
        2 * b * h * d * f["isl"] ** 2,
        4 * b * h * d * kv_len,
        6 * f["num_tokens"] * f["topk"] * f["hidden_size"] * f["inter_size"] / f["tp"]], np.nan)
    moved = np.select([op == "context_attention", op == "generation_attention", op == "moe"], [
        b * f["isl"] * (2 * h + 2 * kvh) * d * e,
        b * kv_len * 2 * kvh * d * e,
        np.minimum(f["num_experts"], f["num_tokens"] * f["topk"]) * 3 * f["hidden_size"] * f["inter_size"]
        / f["tp"] * e], np.nan)
    seconds = rows["latency_ms"].to_numpy(dtype=np.float64) / 1e3
    return np.maximum(flops / (seconds * peak_flops), moved / (seconds * hbm_bandwidth))


def curve(rows: pd.DataFrame, peak_flops: float, hbm_bandwidth: float, source: str) -> BusyPower | None:
    """The busy-power curve of measured rows (power.csv's columns); None: too few to bin."""
    u = np.clip(utilisation(rows, peak_flops, hbm_bandwidth), 0.0, 1.0)
    ok = np.isfinite(u)
    u, watts = u[ok], rows["power_w"].to_numpy(dtype=np.float64)[ok]
    which = np.clip(np.searchsorted(EDGES, u, side="right") - 1, 0, len(EDGES) - 2)
    bins = [k for k in range(len(EDGES) - 1) if (which == k).sum() >= MIN_ROWS]
    if len(bins) < 2:
        return None
    centre = [float(np.median(u[which == k])) for k in bins]
    median = isotonic(np.array([np.median(watts[which == k]) for k in bins]))
    return BusyPower(tuple(centre), tuple(float(x) for x in median), int(np.isin(which, bins).sum()), source)


@lru_cache(maxsize=16)  # (a pure function of shipped files: read once per process, not per run)
def _shipped(folder: str, peak_flops: float, hbm_bandwidth: float) -> BusyPower | None:
    path = Path(folder) / "power.csv"
    if not path.is_file():
        return None
    rows = pd.read_csv(path)
    return curve(rows, peak_flops, hbm_bandwidth, f"{len(rows):,} kernels timed with the board's power measured "
                 f"(AIConfigurator 0.12, sim/tables/{Path(folder).name}/power.csv)")


def shipped(hardware) -> BusyPower | None:
    """The measured curve of a GPU preset whose kernel tables carry power; None elsewhere."""
    system = SYSTEMS.get(hardware.name)
    if system is None:
        return None
    return _shipped(str(TABLES / system), float(hardware.bf16_flops), float(hardware.hbm_bandwidth))
