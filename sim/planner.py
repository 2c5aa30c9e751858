"""Capacity planning: searches over scenario copies, each point judged against an SLO on K seeds.

    slo = parse_slo("ttft_ms=500,tpot_ms=50,percentile=99")
    result = plan("scenarios/chat-llama3-8b-h100.yaml", slo, target=40.0)   # a JSON-able dict

Every simulated point is the scenario file plus `--set`-style overrides (`workload.arrival.rate=9.3`,
`engine.max_num_seqs=64`, `engine.replicas=3`), validated by `load_scenario` and simulated in a
worker process (sim/parallel.py), which returns a small dict. Results are cached by (overrides, seed).

- A load meets the SLO when at least `pass_fraction` of its seeds meet it: `seeds` seeds first,
  `max_seeds` when those disagree (the point is near the boundary).
- One seed meets it when the SLO percentile of TTFT and TPOT, over the requests after the first
  `warmup_fraction` (they arrive at an empty engine and would flatter it), is within target.
- Load grid: rates r0 x (1 + resolution)^i (r0: the scenario's rate), or integer users (closed loop).
  A geometric bracket, then bisection down to adjacent grid points: the answer meets, the next
  point up does not. Each simulation lasts about `horizon_s` of arrivals (min/max_requests bound it).
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .config import SLOConfig, load_scenario
from .errors import ScenarioError
from .memory import kv_budget
from .metrics import goodput
from .parallel import run_parallel
from .simulate import simulate

SLO_KEYS = ("ttft_ms", "tpot_ms", "percentile")
SEQS_GRID = (8, 16, 32, 64, 128, 256, 512)
TOKENS_GRID = (512, 1024, 2048, 4096, 8192, 16384)


@dataclass(frozen=True)
class PlanOptions:
    first_seeds: int = 2          # seeds per point at first: enough when all are clearly in or out
    seeds: int = 3                # seeds per point when the first ones are near a target
    max_seeds: int = 7            # seeds per point when those disagree
    clear_pass: float = 0.75      # "clearly in": every observed/target ratio <= this
    clear_fail: float = 1.5       # "clearly out": some observed/target ratio >= this
    pass_fraction: float = 2 / 3  # a point meets the SLO when this fraction of its seeds do
    resolution: float = 0.02      # relative step of the rate grid
    horizon_s: float = 120.0      # simulated seconds of arrivals per run (open loop)
    min_requests: int = 1000      # requests per run, at least (a stable p99 needs ~1000)
    max_requests: int = 20000     # requests per run, at most
    requests_per_user: int = 10   # closed loop: requests per run = users x this (within the bounds)
    warmup_fraction: float = 0.1  # first requests (by arrival) left out of the SLO check
    tradeoff_load: float = 1.0    # the engine trade-off is measured at this x the sustained load
    workers: int | None = None    # processes; None = all cores


def parse_slo(text: str) -> SLOConfig:
    """'ttft_ms=500,tpot_ms=50,percentile=99' -> SLOConfig; errors name --slo and the allowed keys."""
    allowed = f"allowed keys: {', '.join(SLO_KEYS)}, e.g. --slo ttft_ms=500,tpot_ms=50,percentile=99"
    values: dict[str, float] = {}
    for item in (p.strip() for p in text.split(",")):
        key, sep, value = (s.strip() for s in item.partition("="))
        if key not in SLO_KEYS:
            raise ScenarioError(f"--slo: unknown key {key or item!r}; {allowed}")
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


# ---------------------------------------------------------------- one simulation (worker side)

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


# ---------------------------------------------------------------- judging points

class Evaluator:
    """Runs (overrides, seed) points in parallel, once each; counts simulations for progress."""

    def __init__(self, path: str | Path, slo: SLOConfig, overrides: Iterable[str] = (),
                 options: PlanOptions = PlanOptions(),
                 progress: Callable[[int], None] | None = None):
        self.path, self.slo, self.options, self.progress = Path(path), slo, options, progress
        self.base = tuple(overrides)
        self.scenario = replace(load_scenario(self.path, self.base), slo=slo)
        self.cache: dict[tuple[tuple[str, ...], int], dict] = {}
        self.sim_seconds = 0.0

    @property
    def simulations(self) -> int:
        return len(self.cache)

    def load(self, overrides: Iterable[str] = (), seed: int | None = None):
        return replace(load_scenario(self.path, self.base + tuple(overrides), seed=seed), slo=self.slo)

    def runs(self, overrides: tuple[str, ...], seeds: range) -> list[dict]:
        jobs = [(overrides, self.scenario.seed + k) for k in seeds]
        self.run(jobs)
        return [self.cache[j] for j in jobs]

    def run(self, jobs: list[tuple[tuple[str, ...], int]]) -> None:
        """Simulate the (overrides, seed) jobs not yet cached, in parallel."""
        todo = [j for j in dict.fromkeys(jobs) if j not in self.cache]
        args = [(self.load(o, s), self.slo, self.options.warmup_fraction) for o, s in todo]
        for i, result in run_parallel(simulate_point, args, workers=self.options.workers):
            self.cache[todo[i]] = result
            self.sim_seconds += result["wall_s"]
            if self.progress is not None:
                self.progress(self.simulations)

    def ratio(self, run: dict) -> float:
        """Largest observed / target over the SLO metrics of one run."""
        targets = {k: getattr(self.slo, k) for k in ("ttft_ms", "tpot_ms") if getattr(self.slo, k)}
        return max((run[k]["slo"] if run[k]["slo"] is not None else 0.0) / t for k, t in targets.items())

    def judge(self, overrides: Iterable[str], **info: Any) -> dict:
        """first_seeds seeds; `seeds` unless all are clearly in or out; max_seeds when those
        disagree. `met` when at least pass_fraction of them meet the SLO."""
        o = self.options
        overrides = tuple(overrides)
        runs = self.runs(overrides, range(o.first_seeds))
        ratios = [self.ratio(r) for r in runs]
        if not (max(ratios) <= o.clear_pass or min(ratios) >= o.clear_fail):
            runs = self.runs(overrides, range(max(o.seeds, o.first_seeds)))
            if 0 < sum(r["met"] for r in runs) < len(runs):
                runs = self.runs(overrides, range(max(o.max_seeds, len(runs))))
        return summarize_point(runs, o.pass_fraction, overrides=list(overrides), **info)


def summarize_point(runs: list[dict], pass_fraction: float, **info: Any) -> dict:
    """Mean (and min, max) over seeds of what the report shows."""
    passes = sum(r["met"] for r in runs)
    out = {**info, "seeds": len(runs), "passes": passes,
           "met": passes >= pass_fraction * len(runs) - 1e-9}
    for key in ("goodput_rps", "fraction", "request_throughput", "output_throughput",
                "total_token_throughput"):
        out[key] = float(np.mean([r[key] for r in runs]))
    for metric in ("ttft_ms", "tpot_ms"):
        out[metric] = {}
        for p in ("p50", "p90", "p99", "slo"):
            vals = [r[metric][p] for r in runs if r[metric][p] is not None]
            out[metric][p] = float(np.mean(vals)) if vals else None
        vals = [r[metric]["slo"] for r in runs if r[metric]["slo"] is not None]
        out[metric]["slo_range"] = [min(vals), max(vals)] if vals else None
    return out


# ---------------------------------------------------------------- the load knob and its search

@dataclass(frozen=True)
class Knob:
    """What "load" means: open-loop arrival rate on a geometric grid, or closed-loop users."""
    key: str            # the override path
    unit: str           # req/s | users
    base: float         # the scenario's load: grid origin (rates: index 0) and where the search starts
    resolution: float   # relative grid step (rates)
    integer: bool

    def value(self, i: int) -> float:
        return i if self.integer else round(self.base * (1 + self.resolution) ** i, 6)

    def start(self) -> int:
        return max(1, int(self.base)) if self.integer else 0

    def lowest(self) -> int:  # the search gives up below this index: the SLO is unattainable
        return 1 if self.integer else -math.ceil(math.log(1000) / math.log1p(self.resolution))

    def doubling(self) -> int:  # grid steps that double the load
        return 0 if self.integer else max(1, round(math.log(2) / math.log1p(self.resolution)))

    def overrides(self, value: float, o: PlanOptions) -> tuple[str, ...]:
        n = value * (o.requests_per_user if self.integer else o.horizon_s)
        n = int(min(o.max_requests, max(o.min_requests, math.ceil(n))))
        shown = int(value) if self.integer else value
        return (f"{self.key}={shown}", f"workload.num_requests={n}")


def load_knob(scenario, options: PlanOptions) -> Knob:
    w = scenario.workload
    if getattr(w, "trace", None) is not None or w.arrival is None:
        raise ScenarioError("plan: the scenario replays a trace; plan needs a generated workload "
                            "(workload.arrival with a rate, or process: closed_loop with users)")
    if hasattr(w.arrival, "users"):  # closed loop: the load is a number of concurrent users
        return Knob("workload.arrival.users", "users", w.arrival.users, 0.0, True)
    if not hasattr(w.arrival, "rate"):
        raise ScenarioError(f"plan: workload.arrival {type(w.arrival).__name__.lower()} has no rate "
                            "to search over; use poisson, gamma or constant, or closed_loop")
    return Knob("workload.arrival.rate", "req/s", w.arrival.rate, options.resolution, False)


def max_load(ev: Evaluator, knob: Knob, extra: tuple[str, ...] = ()) -> dict:
    """Largest grid load that meets the SLO, such that the next grid point up does not."""
    points: dict[int, dict] = {}

    def meets(i: int) -> bool:
        if i not in points:
            value = knob.value(i)
            points[i] = ev.judge(extra + knob.overrides(value, ev.options), load=value)
        return points[i]["met"]

    # Give up 12 doublings above the start (4096x): the cost model or the SLO must be off.
    lowest = knob.lowest()
    highest = knob.start() * 4096 if knob.integer else knob.start() + 12 * knob.doubling()
    lo, hi, step = None, None, max(1, knob.doubling())
    i = knob.start()
    if meets(i):  # bracket upwards: double the load until it fails
        lo = i
        while hi is None:
            nxt = lo + step if knob.doubling() else lo * 2
            if nxt > highest:
                raise ScenarioError(f"plan: the SLO still holds at {knob.value(lo)} {knob.unit}; "
                                    "check the cost model and the SLO")
            lo, hi = (nxt, None) if meets(nxt) else (lo, nxt)
    else:  # bracket downwards: halve until it holds
        hi = i
        while lo is None:
            nxt = hi - step if knob.doubling() else hi // 2
            if nxt < lowest:
                break
            lo, hi = (nxt, hi) if meets(nxt) else (None, nxt)
    if lo is not None:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if meets(mid) else (lo, mid)
    curve = [points[k] for k in sorted(points)]
    if lo is None:
        return {"knob": knob.key, "unit": knob.unit, "answer": None, "next": knob.value(hi),
                "answer_point": None, "next_point": points[hi], "curve": curve}
    return {"knob": knob.key, "unit": knob.unit, "answer": knob.value(lo), "next": knob.value(hi),
            "answer_point": points[lo], "next_point": points[hi], "curve": curve,
            "confidence": {"answer_pass_fraction": points[lo]["passes"] / points[lo]["seeds"],
                           "next_pass_fraction": points[hi]["passes"] / points[hi]["seeds"],
                           "answer_pass_interval_90": wilson(points[lo]["passes"], points[lo]["seeds"]),
                           "next_pass_interval_90": wilson(points[hi]["passes"], points[hi]["seeds"])}}


def wilson(passes: int, n: int, z: float = 1.645) -> list[float]:
    """90% Wilson score interval for the probability that a seed meets the SLO."""
    center = (passes + z * z / 2) / (n + z * z)
    half = z * math.sqrt(passes * (n - passes) / n + z * z / 4) / (n + z * z)
    return [max(0.0, center - half), min(1.0, center + half)]


# ---------------------------------------------------------------- engine trade-off

def _kv_seq_cap(sc) -> int:
    """Sequences of the workload's mean length (prompt + output) that fit in the KV cache."""
    from .workload import build_workload

    e = sc.engine
    budget = kv_budget(sc.model, sc.hardware, tensor_parallel_size=e.tensor_parallel_size,
                       gpu_memory_utilization=e.gpu_memory_utilization, block_size=e.block_size,
                       max_num_batched_tokens=e.max_num_batched_tokens, num_gpu_blocks=e.num_gpu_blocks)
    w = build_workload(replace(sc.workload, num_requests=min(sc.workload.num_requests or 1000, 2000)),
                       np.random.default_rng(sc.seed))
    return budget.max_concurrent_seqs(int(np.mean(w.prompt_tokens + w.output_tokens)))


def _best(points: list[dict]) -> dict | None:
    """Highest goodput among points meeting the SLO; within 1% of it, the most headroom."""
    ok = [p for p in points if p["met"]]
    if not ok:
        return None
    top = max(p["goodput_rps"] for p in ok)
    return min((p for p in ok if p["goodput_rps"] >= 0.99 * top), key=_worst_ratio)


def _worst_ratio(p: dict) -> float:
    """Largest observed / target over the SLO metrics (lower = more headroom)."""
    targets = p.get("targets", {})
    return max((p[k]["slo"] or math.inf) / t for k, t in targets.items()) if targets else 0.0


def tradeoff(ev: Evaluator, knob: Knob, load: float) -> dict:
    """Goodput vs max_num_seqs (and max_num_batched_tokens for chunked) at a fixed load."""
    sc, o = ev.scenario, ev.options
    e = sc.engine
    targets = {k: getattr(ev.slo, k) for k in ("ttft_ms", "tpot_ms") if getattr(ev.slo, k)}
    cap = _kv_seq_cap(sc)
    if e.scheduler != "static":
        cap = min(cap, e.max_num_batched_tokens)
    at = knob.overrides(load, o)

    def config(**values: int) -> tuple[tuple[str, ...], dict]:
        # Only values that differ from the scenario's become overrides, so that the scenario's own
        # configuration shares its cache entries with the load search.
        changed = tuple(f"engine.{k}={v}" for k, v in values.items() if getattr(e, k) != v)
        return at + changed, values

    seqs = sorted({v for v in SEQS_GRID if v <= max(cap, SEQS_GRID[0])} | {e.max_num_seqs})
    seq_points = _judge_all(ev, [config(max_num_seqs=v) for v in seqs], targets)
    best = _best(seq_points)
    token_points: list[dict] = []
    if e.scheduler == "chunked":
        n = best["max_num_seqs"] if best else e.max_num_seqs
        tokens = sorted({t for t in TOKENS_GRID if t >= n} | {e.max_num_batched_tokens})
        token_points = _judge_all(ev, [config(max_num_seqs=n, max_num_batched_tokens=t) for t in tokens],
                                  targets)
        best = _best(token_points) or best
    chosen = {"max_num_seqs": e.max_num_seqs, "max_num_batched_tokens": e.max_num_batched_tokens}
    if best is not None:
        chosen.update({k: best[k] for k in chosen if k in best})
    return {"load": load, "kv_seq_cap": cap, "max_num_seqs": seq_points,
            "max_num_batched_tokens": token_points, "chosen": chosen}


def _judge_all(ev: Evaluator, configs: list[tuple[tuple[str, ...], dict]], targets: dict) -> list[dict]:
    """Judge each config; those the scenario rules refuse (or whose requests cannot be served) are
    left out. Their first seeds run together so both cores stay busy."""
    valid = []
    for overrides, info in configs:
        try:
            ev.load(overrides)
        except ScenarioError:
            continue
        valid.append((overrides, info))
    ev.run([(o, ev.scenario.seed + k) for o, _ in valid for k in range(ev.options.first_seeds)])
    return [{**ev.judge(o, **info), "targets": targets} for o, info in valid]


# ---------------------------------------------------------------- replicas and cost

def size_cluster(ev: Evaluator, knob: Knob, target: float, per_replica: float,
                 engine: tuple[str, ...]) -> dict:
    """Fewest replicas whose simulated cluster (with the scenario's router) meets the SLO at
    `target`; starts at ceil(target / per_replica) and steps down or up."""
    at = engine + knob.overrides(target, ev.options)
    tried: dict[int, dict] = {}

    def meets(n: int) -> bool:
        if n not in tried:
            tried[n] = ev.judge(at + (f"engine.replicas={n}",), replicas=n)
        return tried[n]["met"]

    n = max(1, math.ceil(target / per_replica - 1e-9))
    limit = 4 * n + 8
    if meets(n):
        while n > 1 and meets(n - 1):
            n -= 1
    else:
        while not meets(n + 1):
            n += 1
            if n >= limit:
                raise ScenarioError(f"plan: {limit} replicas still miss the SLO at {target} {knob.unit}")
        n += 1
    return {"target": target, "replicas": n, "point": tried[n],
            "one_fewer": tried.get(n - 1), "tried": [tried[k] for k in sorted(tried)]}


def cost(gpus: int, usd_per_gpu_hour: float, output_tps: float, total_tps: float) -> dict:
    usd_h = gpus * usd_per_gpu_hour
    per_m = lambda tps: usd_h / (tps * 3600) * 1e6 if tps > 0 else None
    return {"gpus": gpus, "usd_per_gpu_hour": usd_per_gpu_hour, "usd_per_hour": usd_h,
            "output_tokens_per_s": output_tps, "usd_per_million_output_tokens": per_m(output_tps),
            "usd_per_million_total_tokens": per_m(total_tps)}


# ---------------------------------------------------------------- the whole plan

def plan(path: str | Path, slo: SLOConfig, *, overrides: Iterable[str] = (), target: float | None = None,
         target_unit: str = "req/s", gpu_hour_usd: float | None = None,
         options: PlanOptions = PlanOptions(), progress: Callable[[int], None] | None = None) -> dict:
    """Sustained load per replica, the engine trade-off, replicas for `target` (in `target_unit`:
    req/s, or users for a closed-loop scenario), and cost."""
    start = time.perf_counter()
    ev = Evaluator(path, slo, overrides, options, progress)
    sc = ev.scenario
    knob = load_knob(sc, options)
    if target is not None and target_unit != knob.unit:
        flag = {"req/s": "--target-rate", "users": "--target-users"}
        kind = "closed-loop (its load is workload.arrival.users)" if knob.integer else "open-loop (its load " \
            "is workload.arrival.rate)"
        raise ScenarioError(f"{flag[target_unit]}: {path} is {kind}; use {flag[knob.unit]}")
    search = max_load(ev, knob)
    out: dict[str, Any] = {
        "scenario": sc.name, "source": str(path), "overrides": list(ev.base),
        "slo": {k: getattr(slo, k) for k in SLO_KEYS},
        "model": sc.model.name, "hardware": sc.hardware.name,
        "engine": {k: getattr(sc.engine, k) for k in ("scheduler", "max_num_seqs", "max_num_batched_tokens",
                                                        "tensor_parallel_size", "router")},
        "options": {k: getattr(options, k) for k in PlanOptions.__dataclass_fields__ if k != "workers"},
        "load_search": search,
    }
    if search["answer"] is not None:
        out["tradeoff"] = tradeoff(ev, knob, _on_grid(knob, options.tradeoff_load * search["answer"]))
        chosen = out["tradeoff"]["chosen"]
        engine = tuple(f"engine.{k}={v}" for k, v in chosen.items())
        tp = sc.engine.tensor_parallel_size
        price = sc.hardware.usd_per_hour if gpu_hour_usd is None else gpu_hour_usd
        if target is not None:
            out["cluster"] = size_cluster(ev, knob, target, search["answer"], engine)
            point, replicas = out["cluster"]["point"], out["cluster"]["replicas"]
        else:
            point, replicas = search["answer_point"], 1
        out["recommendation"] = {**chosen, "replicas": replicas, "tensor_parallel_size": tp,
                                 "per_replica_load": search["answer"], "unit": knob.unit}
        out["cost"] = cost(replicas * tp, price, point["output_throughput"], point["total_token_throughput"])
    out["simulations"] = ev.simulations
    out["simulated_wall_s"] = ev.sim_seconds
    out["wall_s"] = time.perf_counter() - start
    return out


def _on_grid(knob: Knob, value: float) -> float:
    if knob.integer:
        return max(1, int(value))
    return knob.value(round(math.log(value / knob.base) / math.log1p(knob.resolution)))
