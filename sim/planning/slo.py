"""An SLO: parsed from `--slo`, and one simulation (or a point of several seeds) judged against it.

    slo = parse_slo("ttft_ms=500,tpot_ms=50,percentile=99")      # -> SLOConfig
    run = simulate_point(scenario, slo, warmup_fraction=0.1)      # one seed: small numbers only
    point = summarize_point([run, ...], pass_fraction=2 / 3)     # several seeds: means, min/max, met

A run meets the SLO when the SLO percentile of TTFT and of TPOT, over the requests after the first
`warmup_fraction` (by arrival; they meet an empty engine and would flatter it), is within target.
A point meets it when at least `pass_fraction` of its seeds do.
"""
from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from ..config import SLOConfig
from ..errors import ScenarioError
from ..metrics import goodput
from ..simulate import simulate

SLO_KEYS = ("ttft_ms", "tpot_ms", "percentile")
TARGETS = ("ttft_ms", "tpot_ms")
THROUGHPUTS = ("goodput_rps", "fraction", "request_throughput", "output_throughput", "total_token_throughput")


def parse_slo(text: str) -> SLOConfig:
    """'ttft_ms=500,tpot_ms=50,percentile=99' -> SLOConfig; errors name --slo and the allowed keys."""
    allowed = f"allowed keys: {', '.join(SLO_KEYS)}, e.g. --slo ttft_ms=500,tpot_ms=50,percentile=99"
    values: dict[str, float] = {}
    for item in (p.strip() for p in text.split(",")):
        key, sep, value = (s.strip() for s in item.partition("="))
        if not item:
            raise ScenarioError(f"--slo: {text!r} has an empty item (a stray comma?); {allowed}")
        if key not in SLO_KEYS:
            raise ScenarioError(f"--slo: unknown key {key or item!r}; {allowed}")
        if key in values:
            raise ScenarioError(f"--slo {key}: given twice; {allowed}")
        if not sep or not value:
            raise ScenarioError(f"--slo {key}: missing value (write {key}=NUMBER); {allowed}")
        try:
            number = float(value)
        except ValueError:
            raise ScenarioError(f"--slo {key}: {value!r} is not a number; {allowed}") from None
        if not math.isfinite(number) or number <= 0 or (key == "percentile" and number >= 100):
            rule = "in (0, 100)" if key == "percentile" else "> 0 (milliseconds)"
            raise ScenarioError(f"--slo {key}: {value} is not a number {rule}; {allowed}")
        values[key] = number
    if "ttft_ms" not in values and "tpot_ms" not in values:
        raise ScenarioError(f"--slo: give ttft_ms and/or tpot_ms; {allowed}")
    return SLOConfig(**values)


def targets(slo: SLOConfig) -> dict[str, float]:
    """{"ttft_ms": 500.0, ...}: the latency targets the SLO sets."""
    return {k: getattr(slo, k) for k in TARGETS if getattr(slo, k)}


def worst_ratio(run: dict, slo: SLOConfig) -> float:
    """Largest observed / target over the SLO metrics of a run or point (no latency observed: 0)."""
    return max((run[k]["slo"] if run[k]["slo"] is not None else 0.0) / t for k, t in targets(slo).items())


# ---------------------------------------------------------------- one run (worker side)

def _percentiles(values: np.ndarray, slo_pct: float) -> dict[str, float | None]:
    values = values[np.isfinite(values)]
    if not len(values):
        return {"p50": None, "p90": None, "p99": None, "slo": None}
    p50, p90, p99, at = np.percentile(values, (50, 90, 99, slo_pct))
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "slo": float(at)}


def simulate_point(scenario, slo: SLOConfig, warmup_fraction: float) -> dict:
    """Simulate and judge one scenario; returns only small numbers (this crosses processes)."""
    start = time.perf_counter()
    result = simulate(scenario)
    rq = result.requests.iloc[int(len(result.requests) * warmup_fraction):]
    done = rq[~rq["finish_s"].isna()]
    duration = float(done["finish_s"].max() - rq["arrival_s"].min()) if len(done) else 0.0
    g = goodput(done, slo, duration)
    s = result.summary
    return {"met": bool(g["met"]), "goodput_rps": g["requests_per_s"], "fraction": g["fraction"],
            "ttft_ms": _percentiles(done["ttft_s"].to_numpy() * 1e3, slo.percentile),
            "tpot_ms": _percentiles(done["tpot_s"].to_numpy() * 1e3, slo.percentile),
            "request_throughput": s["request_throughput"], "output_throughput": s["output_throughput"],
            "total_token_throughput": s["total_token_throughput"], "preemptions": s["preemptions"],
            "requests": len(result.requests), "wall_s": time.perf_counter() - start}


# ---------------------------------------------------------------- several seeds

def summarize_point(runs: list[dict], pass_fraction: float, **info: Any) -> dict:
    """Mean (and min, max) over seeds of what the report shows; `met` by the pass fraction."""
    passes = sum(r["met"] for r in runs)
    out = {**info, "seeds": len(runs), "passes": passes,
           "met": passes >= pass_fraction * len(runs) - 1e-9}
    for key in THROUGHPUTS:
        out[key] = float(np.mean([r[key] for r in runs]))
    out["goodput_rps_by_seed"] = [r["goodput_rps"] for r in runs]  # seeds compare across points (CRN)
    for metric in TARGETS:
        out[metric] = {}
        for p in ("p50", "p90", "p99", "slo"):
            vals = [r[metric][p] for r in runs if r[metric][p] is not None]
            out[metric][p] = float(np.mean(vals)) if vals else None
        vals = [r[metric]["slo"] for r in runs if r[metric]["slo"] is not None]
        out[metric]["slo_range"] = [min(vals), max(vals)] if vals else None
    return out


def wilson(passes: int, n: int, z: float = 1.645) -> list[float]:
    """90% Wilson score interval for the probability that a seed meets the SLO."""
    center = (passes + z * z / 2) / (n + z * z)
    half = z * math.sqrt(passes * (n - passes) / n + z * z / 4) / (n + z * z)
    return [max(0.0, center - half), min(1.0, center + half)]
