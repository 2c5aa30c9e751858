"""An SLO: parsed from `--slo`, and one simulation (or a point of several seeds) judged against it.

    slo = parse_slo("ttft_ms=500,tpot_ms=50,itl_ms=100@p95")     # -> SLOConfig
    run = simulate_point(scenario, slo, warmup_fraction=0.1)      # one seed: small numbers only
    point = summarize_point([run, ...], met=True)                # several seeds: means, min/max

A run meets the SLO when every target's percentile (TTFT, TPOT, E2EL over the requests after the
first `warmup_fraction` by arrival, which meet an empty engine and would flatter it; ITL over the
inter-token gaps after the first of them arrives) is within target. Whether a point of several
seeds meets it is the evaluator's verdict (sim/planning/estimator.py read by
sim/planning/evaluator.py), given to summarize_point. A run may be stopped early once its miss is
certain (EarlyStop).
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from sim.config.errors import ScenarioError
from sim.runtime.metrics import judge, weighted_percentiles
from sim.scenario import SLO_METRICS, SLOConfig, split_target
from sim.schedulers import SCHEDULERS
from sim.simulate import simulate

SLO_KEYS = (*SLO_METRICS, "percentile")
THROUGHPUTS = ("goodput_rps", "fraction", "request_throughput", "output_throughput", "total_token_throughput",
               "busy_fraction", "kv_utilization")
# how full each iteration's token budget was (None where the scheduler has none: static batching)
OPTIONAL = ("token_budget_utilization",
            # the facility's mean power over the run, W (sim/features/energy/power.py; None: no board power known)
            "facility_w")
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


class Stopped(Exception):
    """An early stop: the run's verdict is certain (EarlyStop)."""

    def __init__(self, metric: str, bound_ms: float, at_s: float, window: int = 0):
        super().__init__(metric, bound_ms, at_s, window)
        self.metric, self.bound_ms, self.at_s, self.window = metric, bound_ms, at_s, window


class EarlyStop:
    """Stops a simulation once its SLO verdict is certain to be a miss: more of the judged requests
    (in some window of `window_s` s of arrivals, or all of them) already took longer than `factor`
    x a TTFT or E2EL target (their first token or finish past it, or still waiting past it) than
    that target's percentile allows there, so the percentile is past `factor` x target whatever
    the rest do (the engine's request overheads, added after the run, only lengthen these). The
    planner stops at clear misses (factor 1.5: the judge's "clearly out"); a fleet plan at any
    miss of one window (factor 1: a candidate must meet every window). Checked every CHECK_EVERY
    iterations on the requests in flight only (those before them are counted once, as they
    settle): ~1% of a run. A run past saturation then costs the seconds it takes its queue to
    show it, not its whole horizon. Off where the arrivals are not known in order (a closed
    loop's) or workload classes hold their own targets."""

    CHECK_EVERY = 128  # iterations between checks (a power of two)
    SCAN = 4096        # requests looked at past the first unsettled one, per check

    def __init__(self, slo: SLOConfig, warmup_fraction: float, factor: float, window_s: float | None = None):
        self.targets = {} if slo.classes else {
            k: (t * factor / 1e3, p) for k, (t, p) in slo.targets().items() if k in ("ttft_ms", "e2el_ms")}
        self.warmup_fraction, self.factor, self.window_s = warmup_fraction, factor, window_s

    def watch(self, req) -> Callable[[], None] | None:
        """The per-iteration hook over the run's request table (raises Stopped), or None."""
        first = int(len(req.arrival) * self.warmup_fraction)
        arrival = req.arrival[first:]
        if not self.targets or not len(arrival) or not np.isfinite(arrival).all() or (np.diff(arrival) < 0).any():
            return None
        window = (arrival // self.window_s).astype(np.int64) if self.window_s else np.zeros(len(arrival), np.int64)
        judged = np.bincount(window)
        # more than this many past the limit in a window put its percentile past it (numpy's linear
        # percentile at position (J - 1) p / 100 reads the order statistics around it)
        allowed = {k: judged - np.floor((judged - 1) * p / 100).astype(np.int64) for k, (_, p) in self.targets.items()}
        late = {k: np.zeros(len(judged), np.int64) for k in self.targets}  # settled requests past the limit
        settled = dict.fromkeys(self.targets, 0)  # every request before this index has its time
        n, count, clock = len(arrival), 0, 0.0

        def tick() -> None:
            nonlocal count, clock
            count += 1
            if count & (self.CHECK_EVERY - 1):
                return
            for key, (limit, _) in self.targets.items():
                times = (req.first_token if key == "ttft_ms" else req.finish)[first:]
                lo = settled[key]
                view = times[lo:lo + self.SCAN]
                seen = view[np.isfinite(view)]
                if len(seen):
                    clock = max(clock, float(seen.max()))  # (the clock is at least this far)
                unsettled = np.flatnonzero(np.isnan(view))
                hi = lo + (int(unsettled[0]) if len(unsettled) else len(view))
                if hi > lo:  # newly settled: counted once
                    over = np.flatnonzero(times[lo:hi] - arrival[lo:hi] > limit) + lo
                    late[key] += np.bincount(window[over], minlength=len(judged))
                    settled[key] = hi
                # in flight: still waiting past the limit, or settled out of order past it
                end = min(int(np.searchsorted(arrival, clock - limit, "left")), n)
                extra = np.zeros(len(judged), np.int64)
                if end > hi:
                    wait = times[hi:end]
                    past = np.flatnonzero(np.isnan(wait) | (wait - arrival[hi:end] > limit)) + hi
                    extra = np.bincount(window[past], minlength=len(judged))
                missed = np.flatnonzero(late[key] + extra >= allowed[key])
                if len(missed):
                    raise Stopped(key, limit * 1e3, clock, int(missed[0]))
        return tick


def simulate_point(scenario, slo: SLOConfig, warmup_fraction: float, stop: EarlyStop | None = None) -> dict:
    """Simulate and judge one scenario; returns only small numbers (this crosses processes).
    Judged: the requests after the first `warmup_fraction` (by arrival), and the inter-token gaps
    that end after the first of them arrives; `busy_fraction`: the share of the run's span in
    which an iteration ran (one replica; a cluster: the mean over replicas). `stop`: end the run
    early once it clearly misses the SLO (EarlyStop); the point then has `stopped` and its
    stopping target's percentile as a lower bound, nothing else measured."""
    start = time.perf_counter()
    try:
        result = simulate(scenario, watch=stop.watch if stop is not None else None)
    except Stopped as stop_:
        return _stopped_point(scenario, stop_, start)
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
           "facility_w": (s.get("energy") or {}).get("facility_avg_w"),
           "requests": len(result.requests), "wall_s": time.perf_counter() - start}
    for key, column in (("ttft_ms", "ttft_s"), ("tpot_ms", "tpot_s"), ("e2el_ms", "e2el_s")):
        out[key] = _percentiles(done[column].to_numpy() * 1e3, slo.pct(key))
    out["itl_ms"] = _percentiles(gaps[judged] * 1e3, slo.pct("itl_ms"), counts[judged].astype(np.float64))
    return out


def _stopped_point(scenario, s: Stopped, start: float) -> dict:
    """A run stopped early: only its stopping target's percentile, as the lower bound it passed."""
    empty = {"p50": None, "p90": None, "p99": None, "slo": None}
    out: dict[str, Any] = {"met": False, "stopped": {"metric": s.metric, "at_s": s.at_s, "bound_ms": s.bound_ms},
                           "preemptions": None, "requests": scenario.workload.num_requests,
                           **{k: None for k in THROUGHPUTS}, **{k: None for k in OPTIONAL}}
    for key in SLO_METRICS:
        out[key] = dict(empty)
    out[s.metric]["slo"] = s.bound_ms
    out["wall_s"] = time.perf_counter() - start
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

def summarize_point(runs: list[dict], met: bool, **info: Any) -> dict:
    """Mean (and min, max) over seeds of what the report shows; `met`: the evaluator's verdict;
    `passes`: how many seeds met the SLO one by one (for reading)."""
    passes = sum(r["met"] for r in runs)
    out = {**info, "seeds": len(runs), "passes": passes, "met": met}
    for key in THROUGHPUTS + OPTIONAL:  # (a stopped run measured none of them)
        given = [r[key] for r in runs if r.get(key) is not None]
        out[key] = float(np.mean(given)) if given else None
    stopped = sum(1 for r in runs if r.get("stopped"))
    if stopped:
        out["stopped"] = stopped
    out["goodput_rps_by_seed"] = [r["goodput_rps"] for r in runs]  # seeds compare across points (CRN)
    for metric in SLO_METRICS:
        out[metric] = {}
        for p in ("p50", "p90", "p99", "slo"):
            vals = [r[metric][p] for r in runs if r[metric][p] is not None]
            out[metric][p] = float(np.mean(vals)) if vals else None
        vals = [r[metric]["slo"] for r in runs if r[metric]["slo"] is not None]
        out[metric]["slo_range"] = [min(vals), max(vals)] if vals else None
    return out
