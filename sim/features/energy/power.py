"""Power per iteration and a run's energy: J per token, average and peak W, kWh, cost and carbon.

    a GPU during an iteration   measured where the GPU's kernel tables carry board power (B200:
                                sim/features/energy/measured.py, busy power by utilisation from
                                9,725 kernels), else the stated model
                                P = idle_w + (tdp_w - idle_w) x u;  u = max(compute, memory)
                                utilisation of that iteration, in [0, 1]; either way within
                                [idle_w, tdp_w]
    a GPU between iterations    idle_w
    the host (CPUs, memory, NICs, fans)   host_w_per_gpu, all the time
    the facility                (GPUs + hosts) x pue

where compute utilisation is the iteration's useful FLOPs over (its length x the GPU's dense bf16
peak) and memory utilisation its weight reads over (its length x HBM bandwidth), each per GPU
(a replica's TP/PP GPUs share its work evenly). The board's TDP is the datasheet's (GPU_TDP_W,
with its source); idle_w is IDLE_FRACTION of it; host_w_per_gpu HOST_W_PER_GPU. Each is an
assumption a scenario's `energy:` section replaces (`power_model: stated` keeps the stated model
on a GPU with measured power too):

    energy: {pue: 1.2, usd_per_kwh: 0.12, gco2_per_kwh: 380, host_w_per_gpu: 150,
             idle_w: 70, tdp_w: 700, power_model: auto}

`usd_per_kwh` and `gco2_per_kwh` may also be hourly lists (hour h of the run, from its start, takes
entry h mod the list's length: 24 entries are a day's tariff or grid carbon intensity); the run's
energy is then split by hour (each iteration in the hour it starts; idle and host power evenly).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.config.checks import _choice, _num, check_fields
from sim.config.errors import ScenarioError
from sim.features.energy.measured import BusyPower, shipped

# board power (W) per GPU preset: the vendors' datasheet TDP / max board power
GPU_TDP_W: dict[str, tuple[float, str]] = {
    "h100-sxm": (700.0, "NVIDIA H100 SXM5 datasheet: up to 700 W"),
    "h200": (700.0, "NVIDIA H200 SXM datasheet: up to 700 W"),
    "a100-80gb": (400.0, "NVIDIA A100 80GB SXM datasheet: 400 W"),
    "l40s": (350.0, "NVIDIA L40S datasheet: 350 W max board power"),
    "b200": (1000.0, "NVIDIA HGX B200: 1,000 W a GPU"),
    "b300": (1100.0, "NVIDIA HGX B300: 1,100 W a GPU"),
    "gb200": (1200.0, "NVIDIA GB200 NVL72: 1,200 W a Blackwell GPU"),
    "gb300": (1400.0, "NVIDIA GB300 NVL72: 1,400 W a Blackwell Ultra GPU"),
    "rtx-pro-6000": (600.0, "NVIDIA RTX PRO 6000 Blackwell Server Edition: 600 W max board power"),
    "mi300x": (750.0, "AMD Instinct MI300X datasheet: 750 W"),
    "mi325x": (1000.0, "AMD Instinct MI325X datasheet: 1,000 W"),
    "mi355x": (1400.0, "AMD Instinct MI355X datasheet: 1,400 W"),
}
IDLE_FRACTION = 0.1     # an idle GPU with a model loaded draws ~10% of its TDP (assumption)
HOST_W_PER_GPU = 150.0  # an 8-GPU server's CPUs, memory, NICs and fans, ~1.2 kW, per GPU (assumption)
DEFAULT_PUE = 1.2       # a modern data centre's power usage effectiveness (assumption)


@dataclass(frozen=True)
class EnergyConfig:
    """A scenario's `energy:` section, resolved (None: the preset's or the default above)."""
    pue: float = DEFAULT_PUE
    host_w_per_gpu: float = HOST_W_PER_GPU
    idle_w: float | None = None
    tdp_w: float | None = None
    usd_per_kwh: float | tuple[float, ...] | None = None    # USD per kWh, or hourly
    gco2_per_kwh: float | tuple[float, ...] | None = None   # grid carbon intensity, g per kWh, or hourly
    power_model: str = "auto"  # auto: measured busy power where the GPU's tables carry it; stated: never


KEYS = ("pue", "host_w_per_gpu", "idle_w", "tdp_w", "usd_per_kwh", "gco2_per_kwh", "power_model")
POWER_MODELS = ("auto", "stated")
HOURLY = ("usd_per_kwh", "gco2_per_kwh")  # a number, or a list of hourly values
_CAPS = {"pue": 5.0, "host_w_per_gpu": 1e5, "idle_w": 1e5, "tdp_w": 1e5, "usd_per_kwh": 100.0,
         "gco2_per_kwh": 5000.0}


def parse_energy(v: Any, where: str) -> EnergyConfig:
    """The `energy:` section (None: the defaults)."""
    if v is None:
        return EnergyConfig()
    if not isinstance(v, dict):
        raise ScenarioError(f"{where}: must be a mapping with keys among {', '.join(KEYS)}")
    check_fields(v, where, KEYS, ())
    out: dict[str, Any] = {}
    for k in KEYS:
        if v.get(k) is None:
            continue
        if k == "power_model":
            out[k] = _choice(v[k], f"{where}.{k}", POWER_MODELS)
        elif k in HOURLY and isinstance(v[k], list):
            if not 1 <= len(v[k]) <= 8760:
                raise ScenarioError(f"{where}.{k}: an hourly list needs 1 to 8,760 entries, got {len(v[k])}")
            out[k] = tuple(_num(x, f"{where}.{k}[{i}]", 0, cap=_CAPS[k]) for i, x in enumerate(v[k]))
        else:
            out[k] = _num(v[k], f"{where}.{k}", 0, open_lo=k in ("tdp_w",), cap=_CAPS[k])
    if "pue" in out and out["pue"] < 1:
        raise ScenarioError(f"{where}.pue: {out['pue']:g} is under 1 (facility power over IT power is at least 1)")
    cfg = EnergyConfig(**out)
    if cfg.idle_w is not None and cfg.tdp_w is not None and cfg.idle_w > cfg.tdp_w:
        raise ScenarioError(f"{where}.idle_w: {cfg.idle_w:g} W is above tdp_w ({cfg.tdp_w:g} W)")
    return cfg


def board(config: EnergyConfig, hardware) -> tuple[float, float, str] | None:
    """(tdp_w, idle_w, where they came from) of one GPU; None: no preset and none given."""
    preset = GPU_TDP_W.get(hardware.name)
    if config.tdp_w is not None:
        tdp, source = config.tdp_w, "energy.tdp_w (scenario)"
    elif preset is not None:
        tdp, source = preset
    else:
        return None
    idle = config.idle_w if config.idle_w is not None else IDLE_FRACTION * tdp
    return tdp, min(idle, tdp), source


def basis(config: EnergyConfig, hardware) -> str:
    """How a run on `hardware` is powered: 'measured busy power' (the GPU's tables carry board
    power and `power_model` is auto) or 'modelled' (the stated line); idle, host and PUE are stated
    either way. What the plans print beside a kW figure."""
    return "measured busy power" if config.power_model == "auto" and shipped(hardware) is not None else "modelled"


def run_energy(steps, duration_s: float, replicas: float, gpus: float, flops_per_token: float,
               weight_bytes: float, peak_flops: float, hbm_bandwidth: float, hardware,
               config: EnergyConfig, output_tokens: float, completed: int,
               shortest: np.ndarray | None = None, busy: BusyPower | None = None) -> dict:
    """summary.json's `energy` from steps.csv's frame (per row: replica, duration_s, count,
    prefill_tokens, decode_tokens) over a run of `duration_s` on `replicas` engines of `gpus` GPUs
    in all; `shortest`: each row's shortest iteration (shortest_iterations), for the peak (the
    shortest iteration of a fast-forwarded row draws the most; without them, each row's mean).
    `busy`: the GPU's measured busy power by utilisation (measured.shipped), which then prices
    the iterations in place of the stated line. A GPU with no board power known: only a `source`
    saying so (the run is not refused)."""
    known = board(config, hardware)
    if known is None:
        return {"source": f"not computed: the GPU {hardware.name!r} has no preset board power; give "
                          f"energy: {{tdp_w: W}} in the scenario"}
    tdp, idle, source = known
    per_replica = gpus / replicas if replicas else 0.0  # GPUs an engine holds
    dur = steps["duration_s"].to_numpy(dtype=np.float64)  # s, the row's iterations together
    count = steps["count"].to_numpy(dtype=np.float64)
    u = utilisation(steps, dur, count, per_replica, flops_per_token, weight_bytes, peak_flops, hbm_bandwidth)

    def draw(u: np.ndarray) -> np.ndarray:  # W a GPU draws in an iteration at utilisation u
        return np.clip(busy(u), idle, tdp) if busy is not None else idle + (tdp - idle) * u

    busy_w = draw(u)                                      # W a GPU draws in the row's iterations
    peak_w = busy_w
    if shortest is not None and len(shortest) == len(dur) and len(dur):
        # an iteration's u is (its work) / (its length): the row's shortest draws the most
        per = np.where(count > 0, dur / np.maximum(count, 1), 0.0)  # the row's mean iteration
        with np.errstate(divide="ignore", invalid="ignore"):
            peak_u = np.clip(np.where(shortest > 0, u * per / shortest, u), 0.0, 1.0)
        peak_w = draw(peak_u)
    busy_j = float((busy_w * dur).sum()) * per_replica    # J, every GPU of the engine
    idle_s = max(0.0, duration_s * replicas - float(dur.sum()))  # engine-seconds with no iteration
    idle_j = idle_s * idle * per_replica
    gpu_j = busy_j + idle_j
    host_j = config.host_w_per_gpu * gpus * duration_s
    facility_j = (gpu_j + host_j) * config.pue
    kwh = facility_j / 3.6e6
    rest = (f"TDP {tdp:g} W ({source}), idle {idle:g} W, host {config.host_w_per_gpu:g} W a GPU, PUE "
            f"{config.pue:g} (sim/features/energy/power.py")
    out: dict = {
        "source": (f"measured busy power: each iteration's max(compute, memory) utilisation read on the curve "
                   f"of {busy.source}: {busy.watts[0]:.0f} W at u {busy.u[0]:.2f} to {busy.watts[-1]:.0f} W at "
                   f"u {busy.u[-1]:.2f}; stated: {rest}; idle, host and PUE not measured)" if busy is not None else
                   f"modelled: idle + (TDP - idle) x max(compute, memory) utilisation per iteration; {rest}; "
                   "not validated against a power meter)"),
        "power_source": "measured" if busy is not None else "modelled",
        "gpu_j": gpu_j, "host_j": host_j, "facility_j": facility_j, "kwh": kwh,
        "gpu_avg_w": gpu_j / (gpus * duration_s) if gpus and duration_s > 0 else 0.0,
        "gpu_peak_w": float(peak_w.max()) if len(peak_w) else idle,
        "replica_avg_w": gpu_j / (replicas * duration_s) if replicas and duration_s > 0 else 0.0,
        "facility_avg_w": facility_j / duration_s if duration_s > 0 else 0.0,
        "j_per_output_token": facility_j / output_tokens if output_tokens else None,
        "j_per_request": facility_j / completed if completed else None,
    }
    out["power_over_time"] = power_over_time(steps, busy_w, duration_s, replicas, idle, tdp)
    if isinstance(config.usd_per_kwh, tuple) or isinstance(config.gco2_per_kwh, tuple):
        kwh_h = kwh_by_hour(steps, busy_w, dur, duration_s, replicas, gpus, idle, config)
        out["kwh_by_hour"] = [float(x) for x in kwh_h]

        def priced(rate) -> float:
            rates = np.resize(np.asarray(rate if isinstance(rate, tuple) else (rate,), dtype=np.float64), len(kwh_h))
            return float((kwh_h * rates).sum())
    else:
        def priced(rate) -> float:
            return kwh * float(rate)
    if config.usd_per_kwh is not None:
        out["usd"] = priced(config.usd_per_kwh)
        out["usd_per_million_output_tokens"] = out["usd"] / output_tokens * 1e6 if output_tokens else None
    if config.gco2_per_kwh is not None:
        out["kgco2"] = priced(config.gco2_per_kwh) / 1e3
    return out


def utilisation(steps, dur: np.ndarray, count: np.ndarray, per_replica: float, flops_per_token: float,
                weight_bytes: float, peak_flops: float, hbm_bandwidth: float) -> np.ndarray:
    """Each steps.csv row's utilisation of one GPU, max(compute, memory) in [0, 1]: its tokens'
    FLOPs and its iterations' weight reads, each GPU's share, over the row's `dur` (s)."""
    tokens = (steps["prefill_tokens"].to_numpy(dtype=np.float64)
              + steps["decode_tokens"].to_numpy(dtype=np.float64) * count)
    with np.errstate(divide="ignore", invalid="ignore"):
        compute = np.where(dur > 0, tokens * flops_per_token / max(per_replica, 1e-12) / (dur * peak_flops), 0.0)
        memory = np.where(dur > 0, count * weight_bytes / max(per_replica, 1e-12) / (dur * hbm_bandwidth), 0.0)
    return np.clip(np.maximum(compute, memory), 0.0, 1.0)


def kwh_by_hour(steps, busy_w: np.ndarray, dur: np.ndarray, duration_s: float, replicas: float, gpus: float,
                idle: float, config: EnergyConfig) -> np.ndarray:
    """The facility's kWh in each hour of the run (for hourly prices): each row's iterations in the
    hour they start; idle and host evenly."""
    per_replica = gpus / replicas if replicas else 0.0
    start = steps["start_s"].to_numpy(dtype=np.float64)
    hours = max(1, int(np.ceil(duration_s / 3600.0)))
    h = np.minimum((start - (start.min() if len(start) else 0.0)) // 3600, hours - 1).astype(np.int64)
    busy_h = np.bincount(h, weights=busy_w * dur * per_replica, minlength=hours)
    span = np.minimum(3600.0, duration_s - 3600.0 * np.arange(hours))  # s of the run in each hour
    busy_s_h = np.bincount(h, weights=dur, minlength=hours)
    idle_h = np.maximum(0.0, span * replicas - busy_s_h) * idle * per_replica
    return (busy_h + idle_h + config.host_w_per_gpu * gpus * span) * config.pue / 3.6e6


POWER_BINS = 240  # stretches of the run the power figure draws (summary.json's power_over_time)


def power_over_time(steps, busy_w: np.ndarray, duration_s: float, replicas: float, idle: float, tdp: float,
                    bins: int = POWER_BINS) -> dict:
    """A GPU's mean power in each of up to POWER_BINS equal stretches of the run (W; idle between
    iterations) and the mean batch size (requests in an iteration, over the engines) beside it:
    the energy figure's two lines. Each row's iterations are spread over their span."""
    if duration_s <= 0 or not len(steps) or not replicas:
        return {"bin_s": 0.0, "gpu_w": [], "batch": [], "idle_w": idle, "tdp_w": tdp}
    width = duration_s / bins
    start = steps["start_s"].to_numpy(dtype=np.float64)
    dur = steps["duration_s"].to_numpy(dtype=np.float64)
    t0 = float(start.min())
    edges = t0 + width * np.arange(bins + 1)
    lo, hi = start, start + dur
    # seconds of each row inside each bin: overlap of [lo, hi] with [edge_k, edge_k+1]
    first = np.clip(((lo - t0) // width).astype(np.int64), 0, bins - 1)
    last = np.clip(((hi - t0) // width).astype(np.int64), 0, bins - 1)
    busy_j, busy_s = np.zeros(bins), np.zeros(bins)
    seqs = steps["num_seqs"].to_numpy(dtype=np.float64) if "num_seqs" in steps else np.zeros(len(steps))
    seq_s = np.zeros(bins)
    for k in range(int((last - first).max()) + 1):  # rows span few bins: one pass per extra bin
        b = np.minimum(first + k, last)  # (a row past its last bin: counted nowhere, `ok` below)
        ok = first + k <= last
        inside = np.clip(np.minimum(hi, edges[b + 1]) - np.maximum(lo, edges[b]), 0.0, None) * ok
        np.add.at(busy_j, b[ok], (busy_w * inside)[ok])
        np.add.at(busy_s, b[ok], inside[ok])
        np.add.at(seq_s, b[ok], (seqs * inside)[ok])
    engine_s = width * replicas
    gpu_w = (busy_j + np.maximum(engine_s - busy_s, 0.0) * idle) / engine_s
    return {"bin_s": width, "start_s": t0, "gpu_w": [float(x) for x in gpu_w],
            "batch": [float(x) for x in seq_s / engine_s], "idle_w": idle, "tdp_w": tdp}


def shortest_iterations(count: np.ndarray, durations: np.ndarray) -> np.ndarray | None:
    """Each steps.csv row's shortest iteration, from every iteration's length in row order (the
    recorder's durations); None when they do not line up."""
    count = np.asarray(count, dtype=np.int64)
    if not len(count) or len(durations) != int(count.sum()) or (count < 1).any():
        return None
    return np.minimum.reduceat(durations, np.cumsum(count) - count)


def one_line(e: dict | None) -> str:
    if not e:
        return ""
    if "kwh" not in e:
        return f"energy: {e['source']}"
    cells = [f"{e['kwh']:.3g} kWh", f"GPU avg {e['gpu_avg_w']:.0f} W (peak {e['gpu_peak_w']:.0f} W)"]
    if e.get("j_per_output_token") is not None:
        cells.append(f"{e['j_per_output_token']:.3g} J per output token")
    if "usd" in e:
        cells.append(f"${e['usd']:.4g}")
    if "kgco2" in e:
        cells.append(f"{e['kgco2']:.3g} kgCO2")
    how = "measured busy power" if e.get("power_source") == "measured" else "modelled"
    return f"energy ({how}, facility): " + ", ".join(cells)
