"""An SLO: parsed from `--slo`, and one simulation (or a point of several seeds) judged against it.

    slo = parse_slo("ttft_ms=500,tpot_ms=50,itl_ms=100@p95")     # -> SLOConfig
    run = simulate_point(scenario, slo, warmup_fraction=0.1)      # one seed: small numbers only
    point = summarize_point([run, ...], pass_fraction=2 / 3)     # several seeds: means, min/max, met

A run meets the SLO when every target's percentile (TTFT, TPOT, E2EL over the requests after the
first `warmup_fraction` by arrival, which meet an empty engine and would flatter it; ITL over the
inter-token gaps after the first of them arrives) is within target. A point meets it when at least
`pass_fraction` of its seeds do (locating the boundary), or, confirming an answer, when the
one-sided 90% Wilson lower bound of the probability that a seed meets it reaches the plan's
`confidence` (sim/planning/evaluator.py: Evaluator.confirm).
"""
from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from sim.config.errors import ScenarioError
from sim.config.scenario import SLO_METRICS, SLOConfig, split_target
from sim.runtime.metrics import judge, weighted_percentiles
from sim.schedulers import SCHEDULERS
from sim.simulate import simulate

SLO_KEYS = (*SLO_METRICS, "percentile")
THROUGHPUTS = ("goodput_rps", "fraction", "request_throughput", "output_throughput", "total_token_throughput",
               "busy_fraction", "kv_utilization")
# how full each iteration's token budget was (None where the scheduler has none: static batching)
OPTIONAL = ("token_budget_utilization",)
EXAMPLE = "e.g. --slo ttft_ms=500,tpot_ms=50 or --slo ttft_ms=500@p99,itl_ms=100@p95"


def parse_slo(text: str) -> SLOConfig:
    """'ttft_ms=500@p99,itl_ms=100@p95,percentile=99' -> SLOConfig; errors name --slo and the keys.
    A target without @pNN is judged at `percentile` (default 99)."""
    allowed = f"allowed keys: {', '.join(SLO_KEYS)}; {EXAMPLE}"
    values: dict[str, float] = {}
    own: list[tuple[str, float]] = []
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
        value, at = split_target(value) if key != "percentile" else (value, None)
        values[key] = _positive(key, value, key == "percentile", allowed)
        if at is not None:
            own.append((key, _positive(f"{key} (after @p)", at, True, allowed)))
    if not set(values) & set(SLO_METRICS):
        raise ScenarioError(f"--slo: give at least one of {', '.join(SLO_METRICS)}; {allowed}")
    targets = {k: v for k, v in values.items() if k in SLO_METRICS}
    return SLOConfig(ttft_ms=targets.get("ttft_ms"), tpot_ms=targets.get("tpot_ms"), itl_ms=targets.get("itl_ms"),
                     e2el_ms=targets.get("e2el_ms"), percentile=values.get("percentile", SLOConfig.percentile),
                     percentiles=tuple(own))


def _positive(key: str, value, percentile: bool, allowed: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ScenarioError(f"--slo {key}: {value!r} is not a number; {allowed}") from None
    if not math.isfinite(number) or number <= 0 or (percentile and number >= 100):
        rule = "in (0, 100)" if percentile else "> 0 (milliseconds)"
        raise ScenarioError(f"--slo {key}: {value if isinstance(value, str) else f'{value:g}'} is not a "
                            f"number {rule}; {allowed}")
    return number


def targets(slo: SLOConfig) -> dict[str, float]:
    """{"ttft_ms": 500.0, ...}: the latency targets the SLO sets."""
    return {k: t for k, (t, _) in slo.targets().items()}


def worst_ratio(run: dict, slo: SLOConfig) -> float:
    """Largest observed / target over the SLO metrics of a run or point (no latency observed: 0)."""
    return max((run[k]["slo"] if run[k]["slo"] is not None else 0.0) / t for k, t in targets(slo).items())


# ---------------------------------------------------------------- one run (worker side)

def _percentiles(values: np.ndarray, slo_pct: float, weights: np.ndarray | None = None) -> dict[str, float | None]:
    if weights is None:
        values = values[np.isfinite(values)]
        weights = np.ones(len(values))
    if not weights.sum():
        return {"p50": None, "p90": None, "p99": None, "slo": None}
    p50, p90, p99, at = weighted_percentiles(values, weights, (50, 90, 99, slo_pct))
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "slo": float(at)}


def class_names(scenario) -> tuple[str, ...]:
    """The scenario's workload classes (workload.classes), in order; () for one class."""
    return tuple(c.name for c in scenario.workload.classes or ())


def simulate_point(scenario, slo: SLOConfig, warmup_fraction: float) -> dict:
    """Simulate and judge one scenario; returns only small numbers (this crosses processes).
    Judged: the requests after the first `warmup_fraction` (by arrival), and the inter-token gaps
    that end after the first of them arrives; `busy_fraction`: the share of the run's span in
    which an iteration ran (one replica; a cluster: the mean over replicas)."""
    start = time.perf_counter()
    result = simulate(scenario)
    rq = result.requests.iloc[int(len(result.requests) * warmup_fraction):]
    done = rq[~rq["finish_s"].isna()]
    since = float(rq["arrival_s"].min()) if len(rq) else 0.0
    duration = float(done["finish_s"].max() - since) if len(done) else 0.0
    assert result.itl is not None  # (simulate always measures the gaps)
    gaps, counts, ends = result.itl
    judged = ends >= since
    g = judge(done, slo, duration, (gaps[judged], counts[judged]), class_names(scenario))
    s, steps = result.summary, result.steps
    busy = float(steps["duration_s"].sum())  # a row's duration_s: all of its iterations
    span = float(result.requests["finish_s"].max() - result.requests["arrival_s"].min())
    replicas = scenario.engine.replicas
    out = {"met": bool(g["met"]), "goodput_rps": g["requests_per_s"], "fraction": g["fraction"],
           "request_throughput": s["request_throughput"], "output_throughput": s["output_throughput"],
           "total_token_throughput": s["total_token_throughput"], "preemptions": s["preemptions"],
           "busy_fraction": busy / (span * replicas) if span > 0 else 0.0,
           # the KV cache's mean fill over time (summary.json's), and the tokens each iteration
           # computed as a share of max_num_batched_tokens, over all iterations
           "kv_utilization": float(s["kv_utilization"]), "token_budget_utilization": _budget_share(scenario, steps),
           "requests": len(result.requests), "wall_s": time.perf_counter() - start}
    for key, column in (("ttft_ms", "ttft_s"), ("tpot_ms", "tpot_s"), ("e2el_ms", "e2e_s")):
        out[key] = _percentiles(done[column].to_numpy() * 1e3, slo.pct(key))
    out["itl_ms"] = _percentiles(gaps[judged] * 1e3, slo.pct("itl_ms"), counts[judged].astype(np.float64))
    return out


def _budget_share(scenario, steps) -> float | None:
    """Tokens computed per iteration over max_num_batched_tokens, all iterations together (a
    steps.csv row counts `count` alike iterations); None for a scheduler without a token budget."""
    if not SCHEDULERS[scenario.engine.scheduler].token_budget:
        return None
    count = steps["count"].to_numpy()
    iterations = float(count.sum())
    if not iterations:
        return 0.0
    tokens = float(((steps["prefill_tokens"].to_numpy() + steps["decode_tokens"].to_numpy()) * count).sum())
    return tokens / (iterations * scenario.engine.max_num_batched_tokens)


# ---------------------------------------------------------------- several seeds

def summarize_point(runs: list[dict], pass_fraction: float, met: bool | None = None, **info: Any) -> dict:
    """Mean (and min, max) over seeds of what the report shows; `met` by the pass fraction unless given."""
    passes = sum(r["met"] for r in runs)
    out = {**info, "seeds": len(runs), "passes": passes,
           "met": passes >= pass_fraction * len(runs) - 1e-9 if met is None else met}
    for key in THROUGHPUTS:
        out[key] = float(np.mean([r[key] for r in runs]))
    for key in OPTIONAL:
        given = [r[key] for r in runs if r.get(key) is not None]
        out[key] = float(np.mean(given)) if given else None
    out["goodput_rps_by_seed"] = [r["goodput_rps"] for r in runs]  # seeds compare across points (CRN)
    for metric in SLO_METRICS:
        out[metric] = {}
        for p in ("p50", "p90", "p99", "slo"):
            vals = [r[metric][p] for r in runs if r[metric][p] is not None]
            out[metric][p] = float(np.mean(vals)) if vals else None
        vals = [r[metric]["slo"] for r in runs if r[metric]["slo"] is not None]
        out[metric]["slo_range"] = [min(vals), max(vals)] if vals else None
    return out


Z_ONE_SIDED_90 = 1.2816  # standard normal quantile 0.9: a one-sided 90% bound


def wilson(passes: int, n: int, z: float = 1.645) -> list[float]:
    """Wilson score interval for the probability that a seed meets the SLO: two-sided 90% with the
    default z; with Z_ONE_SIDED_90 each end is a one-sided 90% bound."""
    center = (passes + z * z / 2) / (n + z * z)
    half = z * math.sqrt(passes * (n - passes) / n + z * z / 4) / (n + z * z)
    return [max(0.0, center - half), min(1.0, center + half)]


def seeds_to_confirm(passes: int, n: int, probability: float, most: int, z: float = Z_ONE_SIDED_90) -> int:
    """The fewest seeds N > n whose Wilson lower bound reaches `probability` if every seed after the
    first n meets the SLO (at most `most`): how many to run next, all at once."""
    for total in range(n + 1, most + 1):
        if wilson(passes + total - n, total, z)[0] >= probability:
            return total
    return most
