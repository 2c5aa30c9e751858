"""A fleet plan: the cheapest autoscaling policy that meets the SLO over a day of traffic, against
the static fleet sized for that day's peak (`servesim plan` on a scenario with engine.autoscaling).

Every candidate is the scenario's whole run (its day of arrivals), judged window by window: the
SLO must hold in every `window_s` of arrivals (an hour by default), not only over the day, so that
a policy cannot hide a morning ramp it misses inside a daily p99. A random workload is run on two
seeds (the scenario's and the next): the search judges each candidate on the first, and each answer
is confirmed on both (one that misses on the second counts as missing, and the search goes on). A
run stops at the first window it is certain to miss (sim/planning/slo.EarlyStop): a candidate that
fails costs the hours of the day up to there, one that meets the whole day; its cost is the first
seed's run. Every run is kept in the plan's journal as it finishes: an interrupted plan resumes.

1. **The static fleet for the peak**: the fewest fixed replicas (no autoscaling) that meet the SLO
   in every window. Searched two at a time from below the replicas the scenario's own policy held
   at most (start - 1 and start - 2; down while the fewer meet, else up): a fleet too small stops
   early, so the search costs about one whole day.
2. **The policy**: max_replicas = that static fleet (the autoscaler never needs more than what
   serves the peak), min_replicas the scenario's, and target_in_flight searched: a larger target
   holds fewer replicas (cheaper) and queues more (slower), so the answer is the largest target on
   a grid of 2^(k/4) x the scenario's (k in -16..16: 1/16x to 16x, steps of 19%) that meets the SLO,
   by bisection (several points at a time with more workers). When none meets (a cold start too
   slow for the ramp), min_replicas rises by one and the search repeats, up to the static fleet
   itself (min = max: the static fleet, which meets it).
3. **A scheduled floor** (a workload whose rate follows a profile: its times are known ahead): the
   static fleet scaled to each segment's rate, ceil(static x rate / peak) replicas as a cron floor
   (engine.autoscaling.min_replicas_schedule, KEDA's cron scaler), each rise starting one cold start
   before its segment so the replicas serve when the load comes, each fall at its segment's start;
   the policy above it searched as in 2 (the largest target meeting the SLO), at the same time as 2
   (the two searches share the workers). The floor lets the target rise (fewer replicas off the
   ramp) without missing a predictable ramp; it is reported beside the policy, with the cheaper.

The cost of each is its GPU-hours over its own run (replica-seconds held x tensor_parallel_size)
at the hardware's price per GPU-hour; the saving is 1 - policy / static.
"""
from __future__ import annotations

import functools
import json
import math
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from sim.config.errors import ScenarioError
from sim.planning.parallel import LocalRunner, default_workers
from sim.planning.planner import concurrently
from sim.runtime.metrics import judge
from sim.scenario import SLO_METRICS, SLOConfig, load_scenario

WINDOW_S = 3600.0                     # s of arrivals the SLO is judged in, by default (--window-s)
MOST_WINDOWS = 10_000               # windows one run is judged in, at most (--window-s)
GRID = range(-16, 17)                 # k: target_in_flight = scenario's x 2^(k/4)
MOST_STATIC = 256                     # the most replicas the static search tries


def target_at(base: float, k: int) -> float:
    return base * 2 ** (k / 4)


def judge_day(result, slo: SLOConfig, window_s: float, classes: tuple[str, ...] = ()) -> dict:
    """The SLO judged over the whole run and in every window of `window_s` s of arrivals (by the
    request's arrival), each workload class held to its own (`classes`: their names); the run `met`
    it when every request finished and every window met it."""
    rq = result.requests
    gaps, counts, ends = result.itl
    done = rq[~rq["finish_s"].isna()]
    end_s = float(done["finish_s"].max()) if len(done) else 0.0
    day = judge(done, slo, end_s, (gaps, counts), classes)
    which = (rq["arrival_s"].to_numpy() // window_s).astype(np.int64)
    if len(which) and int(which.max()) >= MOST_WINDOWS:
        raise ScenarioError(f"--window-s: {window_s:g} s windows cut this run's {float(rq['arrival_s'].max()):,.0f} s "
                            f"of arrivals into more than {MOST_WINDOWS:,}; a longer window")
    count = int(which.max()) + 1 if len(which) else 0
    offered = np.bincount(which, minlength=count)
    # each window's finished requests and inter-token gaps, split once (sorted by window)
    done_which = which[~rq["finish_s"].isna().to_numpy()]
    order = np.argsort(done_which, kind="stable")
    cuts = np.searchsorted(done_which[order], np.arange(count + 1))
    gap_which = (ends // window_s).astype(np.int64)
    gap_order = np.argsort(gap_which, kind="stable")
    gap_cuts = np.searchsorted(gap_which[gap_order], np.arange(count + 1))
    windows = []
    for w in range(count):
        mine = done.iloc[order[cuts[w]:cuts[w + 1]]]
        in_w = gap_order[gap_cuts[w]:gap_cuts[w + 1]]
        g = judge(mine, slo, window_s, (gaps[in_w], counts[in_w]), classes)
        row = {"start_s": w * window_s, "requests": int(offered[w]), "met": bool(g["met"]),
               "fraction": g["fraction"], "worst_ratio": _worst(g, slo, classes)}
        if classes:  # each class's share of requests meeting its own targets, and its verdict
            row["classes"] = {name: {"fraction": g["classes"][name]["fraction"], "met": g["classes"][name]["met"]}
                              for name in classes}
        windows.append(row)
    completed = len(done) == len(rq)
    return {"met": completed and all(w["met"] for w in windows), "completed": len(done), "requests": len(rq),
            "end_s": end_s, "day": {k: v for k, v in day.items() if isinstance(v, dict) and k in SLO_METRICS},
            "fraction": day["fraction"], "windows": windows,
            "windows_missed": sum(not w["met"] for w in windows)}


def _worst(g: dict, slo: SLOConfig, classes: tuple[str, ...]) -> float:
    """The largest observed / target of a judgement: over its targets, or, with classes, each
    class's own and the ITL target (judged over every token stream)."""
    def ratios(verdict: dict, targets: dict[str, tuple[float, float]]) -> list[float]:
        observed = {k: verdict.get(k, {}).get("observed", math.nan) for k in targets}
        return [0.0 if math.isnan(observed[k]) else observed[k] / t for k, (t, _) in targets.items()]
    if not classes:
        return max(ratios(g, slo.targets()))
    itl = {k: v for k, v in slo.targets().items() if k == "itl_ms"}
    per_class = (r for name in classes for r in ratios(g["classes"][name], slo.for_class(name).targets()))
    return max([*ratios(g, itl), *per_class])


def evaluate(path: str, overrides: tuple[str, ...], slo: SLOConfig, window_s: float, stop: bool = True) -> dict:
    """One candidate, on a worker: its run judged (small numbers: this crosses processes). `stop`:
    end the run at the first window it is certain to miss (slo.EarlyStop): a candidate must meet
    every window, so that decides it, and the rest of the day is not simulated."""
    import time

    from sim.planning.slo import EarlyStop, Stopped
    from sim.simulate import simulate

    start = time.perf_counter()
    sc = load_scenario(path, overrides)
    watch = EarlyStop(slo, 0.0, 1.0, window_s).watch if stop else None
    try:
        result = simulate(sc, watch=watch)
    except Stopped as s:
        return {"met": False, "stopped": {"metric": s.metric, "at_s": s.at_s, "window": s.window},
                "windows_missed": None, "gpu_hours": None, "mean_replicas": None, "peak_replicas": None,
                "end_s": s.at_s, "fraction": None, "completed": None, "requests": sc.workload.num_requests,
                "day": {}, "windows": [], "spans": [], "overrides": list(overrides),
                "wall_s": time.perf_counter() - start}
    out = judge_day(result, slo, window_s, tuple(c.name for c in sc.workload.classes or ()))
    tp = sc.engine.gpus_per_replica  # (GPUs per replica: TP x PP)
    fleet = result.summary.get("autoscaling")
    if fleet is None:  # a static fleet: every replica held from 0 to the last finish
        replicas = sc.engine.replicas
        out.update(gpu_hours=replicas * tp * out["end_s"] / 3600, mean_replicas=float(replicas),
                   peak_replicas=replicas, spans=[])
    else:
        out.update(gpu_hours=fleet["gpu_hours"], mean_replicas=fleet["mean_replicas"],
                   peak_replicas=fleet["peak_replicas"], spans=fleet["spans"])
    energy = result.summary.get("energy") or {}
    if "kwh" in energy:  # the candidate's day draws (sim/features/energy/power.py): kWh; with prices, USD, CO2
        out["energy"] = {k: energy[k] for k in ("kwh", "usd", "kgco2") if k in energy}
    out["overrides"] = list(overrides)
    out["wall_s"] = time.perf_counter() - start
    return out


def _usable(result: dict) -> bool:
    """A candidate's run as evaluate returns it (read back from a journal: the keys the plan reads)."""
    return isinstance(result.get("met"), bool) and isinstance(result.get("windows"), list) and all(
        k in result for k in ("gpu_hours", "mean_replicas", "peak_replicas", "end_s", "windows_missed", "fraction",
                              "completed", "requests", "day", "spans", "overrides"))


class _Probe:
    """Runs candidates (a batch at a time on the runner) and remembers each. A candidate is judged
    on its first seed while the search locates the answer (a miss there decides it, usually early:
    EarlyStop); the answer is then confirmed on every seed (`confirm`). Every run goes to the
    journal as it finishes (resume)."""

    def __init__(self, path: Path, base: tuple[str, ...], slo: SLOConfig, window_s: float, seeds: list[int],
                 runner: Any, progress: Callable[..., None] | None, journal: Any = None):
        self.path, self.base, self.slo, self.window_s, self.seeds = str(path), base, slo, window_s, seeds
        self.runner, self.progress, self.journal = runner, progress, journal
        self.done: dict[tuple[str, ...], dict] = {}  # a run (candidate + seed) -> its judgement
        # the progress line: what the runs under way are for, how many that step takes as a rule,
        # and the steps after it (re-estimated as each step starts: the total converges)
        self.phase, self.expected, self.later, self.since = "the scenario's own policy", 1, 0, 0
        self._lock = threading.Lock()
        # candidates worth running at once while narrowing (a local runner's workers; else 2)
        self.width = max(1, min(4, getattr(runner, "workers", None) or default_workers()))

    def _key(self, run: tuple[str, ...]) -> str:
        return "\x1f".join((*self.base, *run, f"window_s={self.window_s!r}"))

    def _runs(self, runs: list[tuple[str, ...]]) -> None:
        """Run what is not done (two searches may ask at once, from two threads: each its own runs)."""
        todo = []
        for r in dict.fromkeys(runs):
            if r in self.done:
                continue
            kept = self.journal.get(self._key(r), _usable) if self.journal is not None else None
            if kept is not None:
                with self._lock:
                    self.done[r] = kept
                self._tick()
            else:
                todo.append(r)
        args = [(self.path, self.base + r, self.slo, self.window_s) for r in todo]
        for i, result in self.runner.map(evaluate, args):
            with self._lock:
                self.done[todo[i]] = result
            if self.journal is not None:
                self.journal.put(self._key(todo[i]), result)
            self._tick()

    def start(self, phase: str, expected: int, later: int) -> None:
        self.phase, self.expected, self.later, self.since = phase, expected, later, len(self.done)

    def _tick(self) -> None:
        if self.progress is not None:
            n = len(self.done)
            self.progress(n, self.since + max(self.expected, n - self.since + 1) + self.later, self.phase)

    def __call__(self, candidates: Iterable[tuple[str, ...]]) -> list[dict]:
        """Each candidate's run on the first seed; `met` there."""
        wanted = list(dict.fromkeys(tuple(c) for c in candidates))
        self._runs([c + (f"seed={self.seeds[0]}",) for c in wanted])
        return [self._merged(c) for c in wanted]

    def confirm(self, candidate: tuple[str, ...]) -> dict:
        """The candidate on every seed: `met` when every seed meets the SLO in every window."""
        self._runs([tuple(candidate) + (f"seed={seed}",) for seed in self.seeds])
        return self._merged(tuple(candidate))

    def seen(self, candidate: tuple[str, ...]) -> dict:
        """The candidate as its runs so far judge it (every seed it was run on)."""
        return self._merged(tuple(candidate))

    def _merged(self, c: tuple[str, ...]) -> dict:
        each = [self.done[c + (f"seed={seed}",)] for seed in self.seeds if c + (f"seed={seed}",) in self.done]
        return {**each[0], "met": all(e["met"] for e in each), "met_each": [e["met"] for e in each]}


def flat_out(path: str, overrides: tuple[str, ...]) -> float:
    """One replica's requests/s served flat out (on a worker): its run past saturation."""
    from sim.simulate import simulate

    return float(simulate(load_scenario(path, overrides)).summary["request_throughput"])


def _fewest_flat_out(sc, path: Path, base: tuple[str, ...], runner: Any) -> int | None:
    """ceil(peak rate / one replica's flat-out throughput): fewer static replicas cannot carry the
    peak (a bound, from 2,000 requests at 3x the peak on one replica); None without a peak rate."""
    from sim.workload.generators import Profile

    w = sc.workload
    rate = max(w.arrival.rates) if isinstance(w.arrival, Profile) else getattr(w.arrival, "rate", None)
    if not rate:
        return None
    peak = rate * w.time_scale
    overrides = base + ("engine.autoscaling=null", "engine.replicas=1", "workload.time_scale=1",
                        f"workload.arrival={{process: poisson, rate: {3 * peak!r}}}", "workload.num_requests=2000")
    served = next(iter(runner.map(flat_out, [(str(path), overrides)])))[1]
    return max(1, math.ceil(peak / served - 1e-9)) if served > 0 else None


def _static(n: int) -> tuple[str, ...]:
    return ("engine.autoscaling=null", f"engine.replicas={n}")


def _policy(low: int, high: int, target: float, start: int | None = None) -> tuple[str, ...]:
    """A policy's overrides; `start`: replicas serving at time 0 (None: `low`)."""
    return (f"engine.autoscaling.min_replicas={low}", f"engine.autoscaling.max_replicas={high}",
            f"engine.replicas={low if start is None else start}", f"engine.autoscaling.target_in_flight={target!r}")


def floor_schedule(profile, static: int, low: int, cold_start_s: float) -> list[list[float]]:
    """The cron floor of step 3 (module docstring) for `profile` (sim/workload/generators.Profile):
    [[start_s, replicas], ...] from 0, at least `low` replicas; a rise starts `cold_start_s` early
    (no earlier than the entry before it, which then takes the higher floor), a fall on time."""
    peak = max(profile.rates)
    out: list[list[float]] = []
    for start, rate in zip(profile.starts_s, profile.rates):
        floor = max(low, math.ceil(static * rate / peak - 1e-9)) if peak > 0 else low
        if out and floor == out[-1][1]:
            continue
        at = max(0.0, start - cold_start_s) if out and floor > out[-1][1] else float(start)
        while out and at <= out[-1][0]:  # the rise reaches back over that entry: it takes the higher floor
            at = out.pop()[0]
        out.append([at, floor])
    if out[0][0] > 0:  # (a profile starting later: its first floor from 0)
        out[0][0] = 0.0
    return out


def _scheduled(low: int, high: int, target: float, schedule: list, period: float | None) -> tuple[str, ...]:
    """The policy above a floor_schedule (from 0, at least `low`): its floor at 0 serves from the start."""
    return (*_policy(low, high, target, start=int(schedule[0][1])),
            f"engine.autoscaling.min_replicas_schedule={json.dumps(schedule, separators=(',', ':'))}",
            *((f"engine.autoscaling.schedule_period_s={period!r}",) if period is not None else ()))


def plan_fleet(path: str | Path, slo: SLOConfig, *, overrides: Iterable[str] = (), window_s: float = WINDOW_S,
               seeds: int = 2, gpu_hour_usd: float | None = None, workers: int | None = None,
               runner: Any = None, progress: Callable[..., None] | None = None, journal: Any = None,
               power_cap_kw: float | None = None, availability: float | None = None, fault_seeds: int = 5) -> dict:
    """The cheapest autoscaling policy meeting `slo` in every window, and the static fleet for the
    peak (module docstring). `seeds` >= 2: a random workload is judged on seed and seed + 1. The
    options and the scenario are checked by sim/planning/plan_request.prepare."""
    from sim.planning.evaluator import deterministic, without_faults  # (imports the simulator: not at import)

    path, base = Path(path), tuple(overrides)
    sc = load_scenario(path, base)
    faulted = base  # (the search is of the fault-free policy; the faults judge its answer after)
    sc, base, with_faults = without_faults(path, base, sc)
    a = sc.engine.autoscaling
    assert a is not None  # (PlanJob.fleet)
    # judged on two seeds (a random workload; --seeds 1: one): met only when both meet the SLO
    judged = [sc.seed] if seeds < 2 or deterministic(sc) else [sc.seed, sc.seed + 1]
    own_runner = runner is None
    runner = LocalRunner(workers).start() if own_runner else runner
    try:
        result = _plan_fleet(path, base, sc, slo, window_s, judged, gpu_hour_usd, runner, progress, journal,
                             power_cap_kw)
        if with_faults and result.get("policy") is not None:
            from sim.planning.fleet_faults import under_faults

            p = result["policy"]
            result["faults"] = under_faults(path, faulted, slo, p["min_replicas"], p["max_replicas"],
                                            p["target_in_flight"], fault_seeds, availability,
                                            result["usd_per_gpu_hour"], _policy)
        return result
    finally:
        if own_runner:
            runner.close()


# runs each step takes, as a rule (the progress line's total until a step's own count is known)
STEP_RUNS = {"static": 5, "policy": 9, "scheduled": 9}


def _plan_fleet(path: Path, base: tuple[str, ...], sc, slo: SLOConfig, window_s: float, judged: list[int],
                gpu_hour_usd: float | None, runner: Any, progress: Callable[..., None] | None, journal: Any,
                power_cap_kw: float | None = None) -> dict:
    a = sc.engine.autoscaling
    probe = _Probe(path, base, slo, window_s, judged, runner, progress, journal)
    price = gpu_hour_usd if gpu_hour_usd is not None else sc.hardware.usd_per_hour
    own, static_n, static, statics = _static_fleet(sc, probe, path, base, runner, slo)
    cap = _power_cap(sc, static_n, power_cap_kw)

    def answer(probes: list[dict]) -> dict[str, Any]:  # what every answer says, the static fleet's search included
        return {"scenario": str(path), "name": sc.name, "slo": slo.label(), "window_s": window_s,
                "usd_per_gpu_hour": price, "tensor_parallel_size": sc.engine.tensor_parallel_size,
                "hardware": sc.hardware.name, "model": sc.model.name, "autoscaling": a.as_yaml(),
                "own_policy": _brief(own, price),
                "static": {"replicas": static_n, **_brief(static, price), "windows": static["windows"]},
                "seeds": judged,  # (each probe as it ended: its first seed, and every seed where it was confirmed)
                "probes": probes,
                "static_probes": [{"replicas": n, **_row(probe.seen(_static(n)), price)} for n in sorted(statics)],
                "simulations": len(probe.done), **({"power_cap": cap} if cap is not None else {})}
    if cap is not None and not cap["within"]:  # the peak needs more than the cap allows: no policy can
        return {**answer([]), "scheduled": None, "policy": None,
                "read_back": journal.read_back if journal is not None else 0}

    # 2. the policy: the largest target_in_flight meeting the SLO, max_replicas = the static fleet
    tried: list[tuple[int, int]] = []  # (min_replicas, k) probed, in order

    def policy_runs(low: int, ks: list[int]) -> dict[int, dict]:
        tried.extend((low, k) for k in ks)
        return dict(zip(ks, probe([_policy(low, static_n, target_at(a.target_in_flight, k)) for k in ks])))

    def confirm(low: int, k: int) -> dict:
        return probe.confirm(_policy(low, static_n, target_at(a.target_in_flight, k)))

    def policy() -> tuple[int, int] | None:  # (min_replicas, k)
        for low in range(min(a.min_replicas, static_n), static_n + 1):  # at static_n: the static fleet itself
            k = _largest_meeting(functools.partial(policy_runs, low), width, functools.partial(confirm, low))
            if k is not None:
                return low, k
        return None

    # 2 and 3 at once (each has half the workers; they share the pool): a search narrows a few
    # candidates at a time, so one alone leaves workers idle while its batch's last run finishes
    scheduled = _has_profile(sc)
    width = max(1, probe.width // 2) if scheduled else probe.width
    probe.start("the autoscaling policy" + (" and the scheduled floor" if scheduled else ""),
                STEP_RUNS["policy"] + (STEP_RUNS["scheduled"] if scheduled else 0), 0)
    chosen, floor_plan = concurrently(policy, lambda: _search_schedule(sc, probe, static_n, width))

    result = answer([{"min_replicas": low, "target_in_flight": target_at(a.target_in_flight, k),
                      **_row(probe.seen(_policy(low, static_n, target_at(a.target_in_flight, k))), price)}
                     for low, k in dict.fromkeys(tried)])
    result["scheduled"] = _plan_schedule(sc, probe, static_n, price, base, result, floor_plan)
    result["simulations"] = len(probe.done)
    result["read_back"] = journal.read_back if journal is not None else 0
    if chosen is None:
        result["policy"] = None
        return result
    low, k = chosen
    result["policy"] = _chosen_policy(a, probe, low, target_at(a.target_in_flight, k), static_n, price, base)
    s_usd, p_usd = result["static"]["usd"], result["policy"]["usd"]
    result["saving"] = {"gpu_hours": result["static"]["gpu_hours"] - result["policy"]["gpu_hours"],
                        "usd": s_usd - p_usd, "fraction": 1 - p_usd / s_usd if s_usd > 0 else 0.0}
    return result


def _static_fleet(sc, probe: _Probe, path: Path, base: tuple[str, ...], runner: Any,
                  slo: SLOConfig) -> tuple[dict, int, dict, dict[int, dict]]:
    """Step 1: the static fleet for the peak (the fewest fixed replicas meeting the SLO in every
    window, confirmed on every seed), searched while the scenario's own policy, as written, runs on
    the first seed beside it. Returns (the own policy's run, the replicas, their confirmed run,
    every static count probed)."""
    a = sc.engine.autoscaling
    probe.start("the scenario's own policy and the static fleet for the peak", 1 + STEP_RUNS["static"],
                STEP_RUNS["policy"] + STEP_RUNS["scheduled"])
    statics: dict[int, dict] = {}

    def static_runs(ns: list[int]) -> list[dict]:
        found = probe([_static(n) for n in ns])
        statics.update(zip(ns, found))
        return found

    def static_search() -> int:
        # from the fewest replicas that could carry the peak flat out (one saturated replica's
        # throughput, a short run): that count and one more first
        fewest = _fewest_flat_out(sc, path, base, runner)
        return _fewest_static(static_runs, max(1, a.max_replicas), slo, fewest)

    own, static_n = concurrently(lambda: probe([()])[0], static_search)
    while not (confirmed := probe.confirm(_static(static_n)))["met"]:  # every seed, or one replica more
        statics[static_n] = confirmed
        if static_n >= MOST_STATIC:
            raise ScenarioError(f"plan: {MOST_STATIC} static replicas do not meet the SLO in every window "
                                f"({slo.label()}) on every seed; check the SLO and the load")
        static_n += 1
    statics[static_n] = confirmed
    return own, static_n, confirmed, statics


def _chosen_policy(a, probe: _Probe, low: int, target: float, static_n: int, price: float,
                   base: tuple[str, ...]) -> dict[str, Any]:
    """The policy found, confirmed on every seed: its knobs, cost, windows and replica spans."""
    best = probe.confirm(_policy(low, static_n, target))
    return {"min_replicas": low, "max_replicas": static_n,
            "target_in_flight": target, "interval_s": a.interval_s, "cold_start_s": a.cold_start_s,
            "scale_down_delay_s": a.scale_down_delay_s, "tolerance": a.tolerance,
            **_brief(best, price),
            "windows": best["windows"], "spans": best["spans"],
            "overrides": list(base) + list(_policy(low, static_n, target))}


def _power_cap(sc, replicas: int, cap_kw: float | None) -> dict | None:
    """--power-cap-kw against the fleet the peak needs: `replicas` (the static fleet; every policy
    meeting the SLO holds as many at the peak) at most at the boards' TDP, their hosts and the PUE
    (sim/features/energy/power.py: an upper bound, not the modelled draw). None: no cap given."""
    if cap_kw is None:
        return None
    from sim.features.energy.power import board

    energy = sc.features["energy"]
    found = board(energy, sc.hardware)
    if found is None:
        raise ScenarioError(f"--power-cap-kw: {sc.hardware.name} has no TDP figure to bound its power; give "
                            "energy.tdp_w (W per GPU)")
    tdp, _, source = found
    gpus = replicas * sc.engine.gpus_per_replica
    kw = gpus * (tdp + energy.host_w_per_gpu) * energy.pue / 1e3
    return {"kw": cap_kw, "peak_kw_at_most": kw, "replicas_at_peak": replicas, "within": kw <= cap_kw,
            "basis": f"{gpus} GPUs x ({tdp:g} W TDP ({source}) + {energy.host_w_per_gpu:g} W host) x PUE "
                     f"{energy.pue:g}: the most the fleet the peak needs can draw"}


def _has_profile(sc) -> bool:
    from sim.workload.generators import Profile  # (the workload layer: only for its arrival process)

    return isinstance(sc.workload.arrival, Profile)


def _search_schedule(sc, probe: _Probe, static_n: int, width: int) -> tuple | None:
    """Step 3's search: (the floor schedule, its k or None, the ks probed); None: no profile."""
    if not _has_profile(sc):
        return None
    profile, a = sc.workload.arrival, sc.engine.autoscaling
    low = a.min_replicas
    schedule = floor_schedule(profile, static_n, low, a.cold_start_s)
    tried: list[int] = []

    def floor(k: int) -> tuple[str, ...]:
        return _scheduled(low, static_n, target_at(a.target_in_flight, k), schedule, profile.period_s)

    def runs(ks: list[int]) -> dict[int, dict]:
        tried.extend(ks)
        return dict(zip(ks, probe([floor(k) for k in ks])))

    k = _largest_meeting(runs, width, lambda k: probe.confirm(floor(k)))
    return schedule, k, tried


def _plan_schedule(sc, probe: _Probe, static_n: int, price: float, base: tuple[str, ...], result: dict,
                   found: tuple | None) -> dict | None:
    """Step 3: the scheduled floor and the largest target above it that meets the SLO (None: the
    workload has no profile, or nothing meets below the static fleet)."""
    if found is None:
        return None
    schedule, k, tried = found
    profile, a = sc.workload.arrival, sc.engine.autoscaling
    low = a.min_replicas

    def floor(j: int) -> tuple[str, ...]:
        return _scheduled(low, static_n, target_at(a.target_in_flight, j), schedule, profile.period_s)

    out: dict[str, Any] = {"schedule": schedule, "period_s": profile.period_s, "policy": None,
                           "probes": [{"target_in_flight": target_at(a.target_in_flight, j),
                                       **_row(probe.seen(floor(j)), price)} for j in dict.fromkeys(tried)]}
    if k is None:
        return out
    target = target_at(a.target_in_flight, k)
    overrides = floor(k)
    best = probe.confirm(overrides)
    out["policy"] = {"min_replicas": low, "max_replicas": static_n, "target_in_flight": target,
                     "interval_s": a.interval_s, "cold_start_s": a.cold_start_s,
                     "scale_down_delay_s": a.scale_down_delay_s, "tolerance": a.tolerance, **_brief(best, price),
                     "windows": best["windows"], "spans": best["spans"], "overrides": list(base) + list(overrides)}
    s_usd = result["static"]["usd"]
    out["saving"] = {"gpu_hours": result["static"]["gpu_hours"] - best["gpu_hours"],
                     "usd": s_usd - best["gpu_hours"] * price,
                     "fraction": 1 - best["gpu_hours"] * price / s_usd if s_usd > 0 else 0.0}
    return out


def _fewest_static(runs: Callable[[list[int]], list[dict]], start: int, slo: SLOConfig,
                   fewest: int | None = None) -> int:
    """The fewest static replicas meeting the SLO in every window. From `fewest` (a count below
    which none can, e.g. the peak over one replica's flat-out throughput): it alone, then up two at
    a time (a batch runs them in parallel). Without one, from `start` (a count that likely meets):
    start - 1 and start - 2, down while the fewer still meets, else up from start. Searching from
    below is cheap: a fleet too small stops at the first window it misses (EarlyStop), one that
    meets runs the whole day. `runs(ns)`: the judgements of static fleets of each n replicas."""
    if fewest is not None:
        if runs([fewest])[0]["met"]:
            return fewest
        start = fewest + 1
    below = [m for m in (start - 1, start - 2) if m >= 1 and (fewest is None or m > fewest)]
    if below:
        met = [f["met"] for f in runs(below)]
        if met[-1]:  # start - 2 meets: further down
            n = below[-1]
            while n > 1:
                fewer = [m for m in (n - 1, n - 2) if m >= 1]
                got = [f["met"] for f in runs(fewer)]
                if not got[0]:
                    return n
                n = fewer[1] if len(got) > 1 and got[1] else fewer[0]
                if len(got) > 1 and not got[1]:
                    return n
            return n
        if met[0]:
            return below[0]
    n = start - 1
    checked = False  # has the largest fleet been tried (it meets: the climb goes on; it misses: refused)
    while n < MOST_STATIC:
        if not checked and n >= 4 * max(start, fewest or 1):  # a climb this long: can any fleet meet it?
            checked = True
            most = runs([MOST_STATIC])[0]
            if not most["met"]:
                raise ScenarioError(_nothing_meets(slo, most))
        more = [m for m in (n + 1, n + 2) if m <= MOST_STATIC]
        met = [f["met"] for f in runs(more)]
        if any(met):
            return more[met.index(True)]
        n = more[-1]
    raise ScenarioError(f"plan: {MOST_STATIC} static replicas do not meet the SLO in every window ({slo.label()}); "
                        "check the SLO and the load")


def _nothing_meets(slo: SLOConfig, most: dict) -> str:
    """Why a fleet plan stops early: even the largest static fleet misses (an impossible target
    fails at the first window it is judged on, however many replicas share the load)."""
    stop = most.get("stopped") or {}
    where = (f": it is certain to miss {stop['metric']} already {stop['at_s']:g} s into the day (window "
             f"{stop.get('window', 0)}, counted from 0)" if stop.get("metric") and stop.get("at_s") is not None else "")
    return (f"plan: even {MOST_STATIC} static replicas do not meet the SLO in every window ({slo.label()}){where}; "
            "more replicas do not lower what one request alone takes, so a target below it is met by no fleet: "
            "check the SLO")


def _largest_meeting(runs: Callable[[list[int]], dict[int, dict]], width: int,
                     confirm: Callable[[int], dict] | None = None) -> int | None:
    """The largest k of GRID whose policy meets the SLO (None: none does), taking the policies as
    monotone in k: `width` points at a time (1: bisection), evenly inside the interval between the
    largest that met and the smallest that failed (at first the whole grid); `runs` judges each on
    the first seed. The k found is then `confirm`ed on
    every seed; one that fails there counts as failing and the search goes on below it."""
    seen: dict[int, dict] = {}
    while True:
        hi = min([k for k, f in seen.items() if not f["met"]], default=max(GRID) + 1)
        lo = max([k for k, f in seen.items() if f["met"] and k < hi], default=min(GRID) - 1)
        inside = [k for k in GRID if lo < k < hi]
        if not inside:
            if lo < min(GRID):
                return None
            if confirm is None or (checked := confirm(lo))["met"]:
                return lo
            seen[lo] = checked  # (missed on another seed: a failing k)
            continue
        picks = sorted({inside[int(len(inside) * (j + 1) / (width + 1))] for j in range(width)})
        seen.update(runs(picks))


def _row(f: dict, price: float) -> dict:
    """A probe's row: its seeds' verdicts and _brief of its first seed."""
    return {"met_each": f["met_each"], **_brief(f, price)}


def _brief(f: dict, price: float) -> dict:
    """A candidate's row: met, cost, replicas, the day's observed percentiles, missed windows (a run
    stopped early at a window it missed: `stopped`, no cost measured)."""
    out = {"met": f["met"], "gpu_hours": f["gpu_hours"],
           "usd": f["gpu_hours"] * price if f["gpu_hours"] is not None else None,
           "mean_replicas": f["mean_replicas"], "peak_replicas": f["peak_replicas"], "end_s": f["end_s"],
           "windows_missed": f["windows_missed"], "fraction": f["fraction"], "completed": f["completed"],
           "requests": f["requests"], "observed": {k: v["observed"] for k, v in f["day"].items()}}
    if f.get("stopped"):
        out["stopped"] = f["stopped"]
    if f.get("energy"):
        out["energy"] = f["energy"]
    return out
