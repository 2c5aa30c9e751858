"""Capacity planning: the whole plan for one scenario, as a JSON-able dict.

    slo = parse_slo("ttft_ms=500,tpot_ms=50,percentile=99")                    # sim/planning/slo.py
    result = plan("scenarios/chat-llama3-8b-h100.yaml", slo, target=40.0)

1. the highest load one replica sustains under the SLO with the scenario's engine setting
   (sim/planning/load_search.py; each point judged on adaptive seeds by sim/planning/evaluator.py, one seed when the
   workload has no random component);
2. each engine setting's own sustained load, and the one with the best goodput (sim/planning/engine_curve.py);
3. the replicas that meet the SLO at `target` with that setting, simulated as a cluster;
4. the cost of those GPUs.

The load is an arrival rate, closed-loop users, or for a trace replay its workload.time_scale
(reported as the offered rate: time_scale x the trace's native rate). A trace is never repeated to
lengthen it: a short one gets a warning instead.
"""
from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from sim.config.errors import ScenarioError
from sim.cost.error_band import step_factors
from sim.features.energy.power import basis
from sim.planning.engine_curve import engine_curve, engine_overrides
from sim.planning.evaluator import Evaluator, PlanOptions
from sim.planning.load_search import DEFAULT_HORIZON_S, Knob, check_target_unit, load_knob, max_load, replay_stats
from sim.planning.parallel import LocalRunner
from sim.planning.slo import SLO_KEYS
from sim.scenario import SLOConfig

MAX_REPLICAS = 10_000  # the most replicas size_cluster starts at (a cluster that big takes minutes per run)


def size_cluster(ev: Evaluator, knob: Knob, target: float, per_replica: float,
                 engine: tuple[str, ...], scale: Callable[[int], tuple[str, ...]] | None = None,
                 most: int | None = None) -> dict:
    """Fewest replicas whose simulated cluster (with the scenario's router) meets the SLO at
    `target`, confirmed: a fresh run of that cluster meets it with probability >=
    options.confidence (Evaluator.confirm). Located first with the load search's judge (the
    mean percentile over seeds within every target): from ceil(target / per_replica), galloping
    down or up (1, 2, 4, ... replicas) to a bracket, then bisecting; the count found is then
    confirmed, one more replica at a time until one is. The start can be far off: round-robin
    smooths each replica's arrivals, and a cluster's run is longer than one replica's (its
    percentile steadier). `scale(n)`: the overrides for n replicas (default engine.replicas=n; a
    disaggregated unit: n times each pool). `most`: the most replicas worth confirming (a
    configuration search's bound: more would cost as much as the cheapest found so far); above it
    the answer is `replicas: None` with `beyond: most`, after as few runs as show it."""
    scale = scale or (lambda n: (f"engine.replicas={n}",))
    tried: dict[int, dict] = {}

    def cluster(n: int) -> tuple[str, ...]:  # a run of horizon_s at the target over n replicas
        return engine + knob.overrides(target, ev.options, replicas=n) + scale(n)

    def meets(n: int) -> bool:
        if n not in tried:
            tried[n] = ev.judge(cluster(n), replicas=n)
        return tried[n]["met"]

    def result(n: int | None, point: dict | None) -> dict:
        return {"target": target, "setting": knob.setting(target), "replicas": n, "point": point,
                "one_fewer": tried.get(n - 1) if n is not None else None, "beyond": most if n is None else None,
                "requests_per_run": knob.run_count(target, ev.options, n or most or 1) * knob.per_count,
                "tried": [tried[k] for k in sorted(tried)]}

    n = max(1, math.ceil(target / per_replica - 1e-9))
    if n > MAX_REPLICAS:
        raise ScenarioError(f"plan: {target:g} {knob.unit} needs about {n:,} replicas of {per_replica:g} "
                            f"{knob.unit}; more than {MAX_REPLICAS:,} are not simulated")
    limit = 4 * n + 8 if most is None else most
    if most is not None:
        n = min(n, most)
        if n < most and not meets(most):  # (one run shows a candidate cannot beat the bound)
            return result(None, None)
    step = 1
    if meets(n):  # hi meets; lo misses (0 replicas never meets)
        hi = n
        while hi - step >= 1 and meets(hi - step):
            hi, step = hi - step, 2 * step
        lo = max(0, hi - step)
    else:
        lo = n
        while not meets(min(lo + step, limit)):
            if lo + step >= limit:
                if most is not None:
                    return result(None, None)
                raise ScenarioError(f"plan: {limit} replicas still miss the SLO at {target} {knob.unit}")
            lo, step = lo + step, 2 * step
        hi = min(lo + step, limit)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if meets(mid) else (mid, hi)
    n = hi
    while not (point := ev.confirm(cluster(n), replicas=n))["met"]:  # (its first seeds are cached)
        tried[n] = point
        if n + 1 > limit:
            if most is not None:
                return result(None, None)
            raise ScenarioError(f"plan: {limit} replicas are not confirmed to meet the SLO at {target} {knob.unit}")
        n += 1
    tried[n] = point
    return result(n, point)


def concurrently(*calls: Callable[[], Any]) -> list[Any]:
    """Each call's result, in order, the calls run in threads at once: independent searches whose
    simulations then share the plan's worker processes (a search alone leaves a core idle between
    its batches of a few seeds). An error in one is raised here once all have stopped."""
    if len(calls) <= 1:
        return [c() for c in calls]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        futures = [pool.submit(c) for c in calls]
        return [f.result() for f in futures]


def replay_warnings(trace: dict, search: dict, slo: SLOConfig, options: PlanOptions) -> list[str]:
    """A trace shorter than options.min_requests gives a noisy tail: say so (it is not repeated)."""
    n = trace["requests"]
    if n >= options.min_requests:
        return []
    judged = n - int(n * options.warmup_fraction)
    tail = max(1, math.ceil(judged * (1 - slo.percentile / 100)))
    scale = search["answer_setting"]
    span = ""
    if scale is not None:
        seconds = trace["span_s"] / scale
        span = f", and at time_scale {scale:g} they arrive within {seconds:.1f} s" + (
            " (a short run flatters capacity)" if seconds < (options.horizon_s or DEFAULT_HORIZON_S) else "")
    return [f"the trace has {n} requests, fewer than the {options.min_requests} a stable "
            f"p{slo.percentile:g} needs: after warm-up {judged} are judged, so the verdict rests on the "
            f"slowest {tail}{span}. The trace is not repeated to lengthen it: use a longer trace (or a "
            "larger workload.num_requests if it cuts this one)"]


def electricity(point: dict, energy, hardware) -> dict:
    """The facility's power at the recommended cluster's load (its simulated run's mean:
    sim/features/energy/power.py, `power_basis` says whether its busy power was measured), kWh per
    hour and per million output tokens, and with the scenario's energy.usd_per_kwh (an hourly list:
    its mean) the electricity per hour beside the GPU-hours."""
    w = point.get("facility_w")
    if w is None:
        return {}
    out: dict = {"facility_kw": w / 1e3, "kwh_per_hour": w / 1e3, "power_basis": basis(energy, hardware)}
    tps = point.get("output_throughput") or 0.0
    out["kwh_per_million_output_tokens"] = w / 1e3 / (tps * 3600) * 1e6 if tps > 0 else None
    mean = mean_usd_per_kwh(energy)
    if mean is not None:
        out["electricity_usd_per_hour"] = w / 1e3 * mean
    return out


def mean_usd_per_kwh(energy) -> float | None:
    """energy.usd_per_kwh as one price (USD/kWh): an hourly list's mean, None where not priced."""
    rate = energy.usd_per_kwh
    if rate is None:
        return None
    return float(sum(rate) / len(rate)) if isinstance(rate, tuple) else float(rate)


def cost(gpus: int, usd_per_gpu_hour: float, output_tps: float, total_tps: float) -> dict:
    usd_h = gpus * usd_per_gpu_hour
    per_m = lambda tps: usd_h / (tps * 3600) * 1e6 if tps > 0 else None
    return {"gpus": gpus, "usd_per_gpu_hour": usd_per_gpu_hour, "usd_per_hour": usd_h,
            "output_tokens_per_s": output_tps, "usd_per_million_output_tokens": per_m(output_tps),
            "usd_per_million_total_tokens": per_m(total_tps)}


class Phases:
    """Progress in phases: progress(done, estimated total, phase) for the CLI's bar and log lines.
    Every simulation finished (or read back from the journal) counts one, whichever evaluator ran
    it; each phase's simulations are estimated up front (PHASE_ESTIMATES) and the total
    re-estimated as phases end, so the ETA converges."""

    def __init__(self, progress: Callable[..., None] | None, phases: list[str]):
        self.progress, self.left, self.phase, self.base = progress, list(phases), phases[0], 0
        self.done = 0
        self._lock = threading.Lock()

    def start(self, phase: str) -> None:
        with self._lock:
            self.base, self.phase = self.done, phase
            for p in phase.split(" and "):
                if p in self.left:
                    self.left.remove(p)
        self._show()

    def tick(self, _n: int = 0) -> None:
        """An evaluator's progress callback: one more simulation."""
        with self._lock:
            self.done += 1
        self._show()

    def _show(self) -> None:
        if self.progress is None:
            return
        now = sum(PHASE_ESTIMATES.get(p, 20) for p in self.phase.split(" and "))
        guess = max(now, self.done - self.base + 5)
        later = sum(PHASE_ESTIMATES.get(p, 20) for p in self.left if p not in self.phase)
        self.progress(self.done, self.base + guess + later, self.phase)


PHASE_NAMES = {"band": "cost-error band", "cluster": "sizing the cluster"}
PHASE_ESTIMATES = {"load search": 30, "engine settings": 90, "refining the chosen setting": 20,
                   "cost-error band": 40, "sizing the cluster": 30}


def vllm_line(sc, chosen: dict) -> str | None:
    from sim.planning.vllm_command import vllm_serve
    return vllm_serve(sc, chosen)


def plan(path: str | Path, slo: SLOConfig, *, overrides: Iterable[str] = (), target: float | None = None,
         target_unit: str = "req/s", gpu_hour_usd: float | None = None, headroom: float = 1.0,
         band: bool = True, seqs_grid: tuple[int, ...] | None = None,
         tokens_grid: tuple[int, ...] | None = None, power_cap_kw: float | None = None,
         options: PlanOptions = PlanOptions(), progress: Callable[..., None] | None = None,
         runner: Any = None, journal: Any = None) -> dict:
    """Sustained load per replica (the mean SLO percentile over seeds within every target, with a
    90% interval), the engine curve, replicas for `target` (in `target_unit`: req/s, or users for
    a closed-loop scenario) at `headroom` x the sustained load with the chosen setting, confirmed
    (a fresh run of the cluster meets the SLO with probability >= options.confidence), the cost,
    and, when the cost model carries a held-out error, the sustained load with steps that much
    slower and faster (`band`). progress(done, estimated total, phase). `runner`: where
    simulations run (sim/planning/parallel.py: a DaskRunner for a cluster; default local
    processes, one pool for the plan). `journal`: keeps every result (resume)."""
    start = time.perf_counter()
    own_runner = runner is None
    runner = LocalRunner(options.workers).start() if own_runner else runner
    try:
        return _plan(path, slo, overrides, target, target_unit, gpu_hour_usd, headroom, band, seqs_grid, tokens_grid,
                     options, progress, runner, journal, start, power_cap_kw)
    finally:
        if own_runner:
            runner.close()


def _plan(path, slo, overrides, target, target_unit, gpu_hour_usd, headroom, band, seqs_grid, tokens_grid,
          options, progress, runner, journal, start, power_cap_kw=None) -> dict:
    ev = Evaluator(path, slo, overrides, options, runner=runner, journal=journal)
    sc, options = ev.scenario, ev.options  # one seed per point when the workload is deterministic
    knob = load_knob(sc, options)
    target_unit = check_target_unit(knob, target, target_unit, path)
    if not 0 < headroom <= 1:
        raise ScenarioError(f"--headroom: {headroom:g} is not in (0, 1] (0.8: plan for 80% of the sustained load)")
    error_band = step_factors(sc) if band else None  # (per path: sim/cost/error_band.py)
    # a band that cannot move the answer a grid step is not simulated
    banded = (error_band is not None
              and max(error_band["slower"] - 1, 1 - error_band["faster"]) >= options.resolution / 2)
    phases = Phases(progress, ["load search", "engine settings", "refining the chosen setting"]
                    + (["cost-error band"] if banded else []) + (["sizing the cluster"] if target is not None else []))
    ev.progress = phases.tick
    phases.start("load search")
    search = max_load(ev, knob)
    steps = {"load_search": ev.simulations}
    out = _plan_header(ev, knob, path, slo, search, headroom)
    if search["answer"] is not None:
        chosen, best = _engine_setting(ev, knob, search, out, steps, phases, seqs_grid, tokens_grid)
        extra = engine_overrides(sc.engine, chosen)
        later = []  # the band and the cluster: independent, run at once
        if band and error_band is None:
            out["band"] = {"note": f"none: {describe_unchecked(sc.cost_model)}"}
        elif error_band is not None and not banded:  # cannot move the answer a grid step
            out["band"] = {**error_band, "steps_slower": {"cost_scale": error_band["slower"], "answer": best["answer"]},
                           "steps_faster": {"cost_scale": error_band["faster"], "answer": best["answer"]},
                           "note": f"under half the grid step ({options.resolution:.0%}): the same answer "
                                   "either way, not simulated"}
        elif error_band is not None:
            later.append(lambda: ("band", cost_band(ev, knob, extra, best, error_band)))
        if target is not None:
            later.append(lambda: ("cluster", size_cluster(ev, knob, target / headroom, best["answer"], extra)))
        if later:
            names = [name for name, on in (("band", banded), ("cluster", target is not None)) if on]
            phases.start(" and ".join(PHASE_NAMES[k] for k in names))
            before = ev.simulations
            out.update(dict(concurrently(*later)))
            steps["_and_".join(names)] = ev.simulations - before
        _recommend(out, sc, knob, chosen, best, target, headroom, gpu_hour_usd, power_cap_kw)
    out["simulations"] = ev.simulations
    out["simulations_by_step"] = steps
    out["simulated_wall_s"] = ev.sim_seconds
    out["read_back"] = journal.read_back if journal is not None else 0
    out["wall_s"] = time.perf_counter() - start
    return out


def _plan_header(ev: Evaluator, knob, path, slo: SLOConfig, search: dict, headroom: float) -> dict[str, Any]:
    """plan.json's question and load search: the scenario, the SLO, the options, and the warnings
    about the run's length, a replayed trace and faults set aside."""
    sc, options = ev.scenario, ev.options
    workload = replay_stats(sc.workload) if knob.replay else {"time_scale": sc.workload.time_scale}
    out: dict[str, Any] = {
        "scenario": sc.name, "source": str(path), "overrides": list(ev.base),
        "slo": {k: getattr(slo, k) for k in SLO_KEYS}, "slo_percentiles": dict(slo.percentiles),
        "slo_label": slo.label(),
        "model": sc.model.name, "hardware": sc.hardware.name,
        "cost_model": sc.cost_model.provenance(),
        "engine": {k: getattr(sc.engine, k) for k in ("scheduler", "max_num_seqs", "max_num_batched_tokens",
                                                        "tensor_parallel_size", "router")},
        "workload": workload, "deterministic": ev.deterministic,
        "run_length": run_length(sc, knob, search, options),
        "warnings": replay_warnings(workload, search, slo, options) if knob.replay else [],
        "options": {k: getattr(options, k) for k in PlanOptions.__dataclass_fields__ if k != "workers"},
        "headroom": headroom,
        "load_search": search,
    }
    out["warnings"] += out["run_length"].pop("warnings")
    if ev.faults_set_aside:
        out["warnings"].append("faults: the load and the replicas are sized without the scenario's faults (the "
                               "fault-free fleet); --availability sizes the spares they need (docs/faults.md)")
    return out


def _engine_setting(ev: Evaluator, knob, search: dict, out: dict, steps: dict, phases: Phases,
                    seqs_grid, tokens_grid) -> tuple[dict, dict]:
    """The engine curve (out["tradeoff"]) and the setting chosen on it with its load search: the
    curve's best, or the scenario's own where the refined best sustains less."""
    sc = ev.scenario
    phases.start("engine settings")
    curve = out["tradeoff"] = engine_curve(ev, knob, search, seqs_grid=seqs_grid, tokens_grid=tokens_grid,
                                           on_refine=lambda: phases.start("refining the chosen setting"))
    steps["engine_curve"] = ev.simulations - sum(steps.values())
    chosen, best = curve["chosen"], curve["chosen_search"]
    if best["answer"] is None or best["answer"] < search["answer"]:
        # refined, the coarse winner sustains less than the scenario's own setting: keep that
        if best is not search:
            out["warnings"].append(
                f"the engine curve's best setting ({', '.join(f'{k} {v}' for k, v in chosen.items())}) "
                f"sustains {best['answer'] or 0:g} {knob.unit} on the load search's grid, less than the "
                f"scenario's own {search['answer']:g}: the scenario's setting is kept")
        curve["coarse_winner"] = chosen
        chosen, best = {k: getattr(sc.engine, k) for k in chosen}, search
        curve["chosen"], curve["chosen_search"] = chosen, search  # what the report marks chosen
    return chosen, best


def _recommend(out: dict, sc, knob, chosen: dict, best: dict, target: float | None, headroom: float,
               gpu_hour_usd: float | None, power_cap_kw: float | None) -> None:
    """plan.json's recommendation, utilisation and cost (with power) for the chosen setting, at the
    cluster's confirmed point (with a target) or one replica's sustained load."""
    gpus_per_replica = sc.engine.gpus_per_replica  # (TP x PP)
    price = sc.hardware.usd_per_hour if gpu_hour_usd is None else gpu_hour_usd
    planned = best["answer"] * headroom
    if target is not None:
        point, replicas = out["cluster"]["point"], out["cluster"]["replicas"]
    else:
        point, replicas = best["answer_point"], 1
    tp = sc.engine.tensor_parallel_size
    out["recommendation"] = {**chosen, "replicas": replicas, "tensor_parallel_size": tp,
                             "pipeline_parallel_size": sc.engine.pipeline_parallel_size,
                             "data_parallel_size": sc.engine.data_parallel_size,
                             "per_replica_load": best["answer"], "planned_per_replica_load": planned,
                             "estimate": best.get("estimate"),
                             "unit": knob.unit, "vllm_serve": vllm_line(sc, chosen)}
    out["utilisation"] = utilisation(best, headroom, target, replicas, knob)
    out["cost"] = cost(replicas * gpus_per_replica, price, point["output_throughput"] or 0.0,
                       point["total_token_throughput"] or 0.0)
    out["cost"].update(electricity(point, sc.features["energy"], sc.hardware))
    if "electricity_usd_per_hour" in out["cost"]:  # the whole bill, as the GPU search ranks it
        out["cost"]["total_usd_per_hour"] = out["cost"]["usd_per_hour"] + out["cost"]["electricity_usd_per_hour"]
    kw = out["cost"].get("facility_kw")
    if power_cap_kw is not None and kw is not None and kw > power_cap_kw:
        out["warnings"].append(f"over the power cap: the recommended {replicas} replica(s) draw {kw:,.1f} kW "
                               f"({out['cost']['power_basis']}, facility), over --power-cap-kw "
                               f"{power_cap_kw:g}; a smaller or more efficient GPU (plan --gpus ...) may fit it")
    out["power_cap_kw"] = power_cap_kw
    # whose price: said beside it (a preset's is a rounded on-demand estimate, not a quote)
    out["cost"]["price_source"] = "the hardware preset" if gpu_hour_usd is None else "--gpu-hour-usd / --price"


def run_length(sc, knob: Knob, search: dict, options: PlanOptions) -> dict:
    """How long each run is, and why (plan.json's run_length): at the answer, the requests of
    options.horizon_s of arrivals, at least what the SLO's percentile needs and min_requests, at
    most max_requests; said when that is longer than the scenario's own num_requests (shorter runs
    flatter capacity: the queue has no time to build), and warned when the cap cut it."""
    horizon = options.horizon_s or DEFAULT_HORIZON_S
    out: dict[str, Any] = {"horizon_s": horizon, "percentile_requests": knob.percentile_requests,
                           "min_requests": options.min_requests, "max_requests": options.max_requests,
                           "scenario_requests": sc.workload.num_requests, "warnings": []}
    if knob.replay:
        out.update(rule="the trace's own requests (a trace is never repeated)", requests_at_answer=None)
        return out
    load = search["answer"] if search["answer"] is not None else search["next"]
    n = knob.run_count(load, options) * knob.per_count
    least = max(knob.percentile_requests, options.min_requests)
    out.update(rule=f"{horizon:g} s of arrivals at the load, at least {least:,} requests (the SLO's percentile "
                    f"needs {knob.percentile_requests:,}), at most {options.max_requests:,}",
               requests_at_answer=int(n))
    own = sc.workload.num_requests
    if own is not None and own < n:
        out["note"] = (f"runs are {int(n):,} requests at the answer, longer than the scenario's own {own:,}: "
                       "shorter runs flatter capacity (the queue has no time to build)")
    wanted = max(load * (horizon if not knob.integer else options.requests_per_user), knob.percentile_requests)
    if not knob.integer and wanted > options.max_requests:
        seconds = options.max_requests / load
        out["warnings"].append(f"runs are capped at {options.max_requests:,} requests ({seconds:.0f} s of arrivals "
                               f"at {load:g} {knob.unit}); {horizon:g} s would need {wanted:,.0f}: the answer may "
                               "flatter capacity a little")
    return out


def cost_band(ev: Evaluator, knob: Knob, extra: tuple[str, ...], best: dict, error_band: dict) -> dict:
    """The sustained load if every step took `error_band["slower"]` times as long, and
    `error_band["faster"]` times: the cost model's error against real serving carried into the
    answer. Each side is its own confirmed search, started from the answer scaled by the same
    factor."""
    out = dict(error_band)
    for side, scale in (("steps_slower", error_band["slower"]), ("steps_faster", error_band["faster"])):
        scaled = ev.scaled(scale)  # (its progress is the plan's: one tick a simulation)
        found = max_load(scaled, knob, extra, start=knob.index(best["answer"] / scale), gallop=True)
        out[side] = {"cost_scale": scale, "answer": found["answer"], "next": found["next"],
                     "simulations": scaled.simulations}
        with ev._lock:
            ev.cache.update({("band", scale, *k): v for k, v in scaled.cache.items()})  # counted as the plan's
    return out


def describe_unchecked(spec) -> str:
    """Why a cost model has no error band: it was never checked against a real server."""
    if spec.name == "roofline":
        return "the roofline estimate was never checked against a real server"
    if spec.name == "unit":
        return "the unit cost model counts iterations"
    return "this profile was never checked against a real server (no held-out error)"


def utilisation(best: dict, headroom: float, target: float | None, replicas: int, knob: Knob) -> dict:
    """What the answer implies: the engine's busy share of time at the sustained load (an iteration
    running), the planned load per replica as a share of the sustained one, and at the target the
    load each replica carries."""
    point = best["answer_point"]
    out = {"busy_fraction_at_sustained": point.get("busy_fraction"),
           "kv_utilization_at_sustained": point.get("kv_utilization"),
           "token_budget_utilization_at_sustained": point.get("token_budget_utilization"),
           "planned_share_of_sustained": headroom}
    if target is not None:
        out["load_per_replica_at_target"] = target / replicas
        out["share_of_sustained_at_target"] = target / replicas / best["answer"]
    return out
