"""The evaluator: scenario copies simulated once per (overrides, seed), judged on adaptive seeds.

    ev = Evaluator("scenarios/chat-llama3-8b-h100.yaml", slo, options=PlanOptions())
    point = ev.judge(("workload.arrival.rate=9.3", "workload.num_requests=1116"), load=9.3)   # steady
    point = ev.confirm(cluster_overrides, replicas=5)                                        # bettable

Every point is the scenario file plus `--set`-style overrides, validated by `load_scenario` (the
file parsed once: sim/config/checks.parsed_once) and simulated in a worker process of one pool
kept for the whole plan (sim/planning/parallel.py) that returns a small dict
(sim/planning/slo.simulate_point). Seeds use common random numbers: seed s, s+1, ... at every
point. A workload with no random component (e.g. a trace replay) simulates the same run for
every seed: one seed per point then. How seeds are read: sim/planning/estimator.py.

Searches of different candidates may run in threads of one plan, each with its own evaluator or
sharing one: the cache and the count are guarded, and a simulation asked for twice at once runs
once. A `journal` (sim/planning/journal.py) keeps every result on disk as it comes, so that an
interrupted plan resumes where it stopped.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from sim.config.errors import ScenarioError
from sim.planning import estimator
from sim.planning.parallel import LocalRunner
from sim.planning.slo import EarlyStop, simulate_point, summarize_point, targets
from sim.scenario import SLO_METRICS, SLOConfig, load_scenario
from sim.workload.generators import Workload, build_workload


@dataclass(frozen=True)
class PlanOptions:
    first_seeds: int = 2          # seeds per point at first: enough when their 90% interval decides
    seeds: int = 4                # seeds per point when that interval straddles a target
    max_seeds: int = 8            # ... and when it still does (then the mean decides)
    clear_fail: float = 1.5       # a run stops early once a percentile is certain to pass this x its target
    resolution: float = 0.02      # relative step of the rate grid
    confidence: float = 0.9       # a confirmed cluster: P(a fresh run meets the SLO) >= this
    confirm_seeds: int = 12       # ... predicted from at most this many seeds (estimator.bettable)
    confirm_first: int = 4        # ... and at least this many (a spread needs several)
    # seconds of arrivals per run: runs are as long as this at the load, within the bounds and at
    # least what the SLO's percentile needs (tail_requests judged beyond it); a trace keeps its own
    horizon_s: float | None = None  # None: DEFAULT_HORIZON_S (sim/planning/load_search.py)
    min_requests: int = 1000      # requests per run, at least
    max_requests: int = 20000     # requests per run, at most (one replica; a cluster: per replica)
    tail_requests: int = 20       # judged requests beyond the SLO percentile per run, at least
    requests_per_user: int = 10   # closed loop: requests per run = users x this (within the bounds)
    warmup_fraction: float = 0.1  # first requests (by arrival) left out of the SLO check
    curve_resolution: float = 0.05  # relative step of the engine curve's load grid
    curve_seeds: int = 2          # engine curve: seeds per point, and
    curve_max_seeds: int = 4      # ... this many when those are near a target
    early_stop: bool = True       # end a run once it clearly misses the SLO (slo.EarlyStop)
    workers: int | None = None    # processes; None = all cores

    def seed_ladder(self) -> tuple[int, int, int]:
        """(first, near a target, across it): the load search's seeds per point."""
        return self.first_seeds, max(self.seeds, self.first_seeds), max(self.max_seeds, self.seeds)

    def curve_ladder(self) -> tuple[int, int, int]:
        """The engine curve's and the coarse search's: fewer seeds (their answers are refined)."""
        return self.curve_seeds, self.curve_max_seeds, self.curve_max_seeds

    def one_seed(self) -> PlanOptions:
        """One seed per point everywhere (a deterministic workload)."""
        return replace(self, first_seeds=1, seeds=1, max_seeds=1, curve_seeds=1, curve_max_seeds=1,
                       confirm_seeds=1, confirm_first=1)


def deterministic(scenario) -> bool:
    """True when the seed changes nothing. The simulator draws random numbers only in
    build_workload, so when three seeds build the same requests every seed simulates the same run:
    a trace replay (without a random priority), or constant arrivals with fixed lengths."""
    first, *others = (build_workload(scenario.workload, np.random.default_rng(scenario.seed + k))
                      for k in range(3))
    return all(_arrays(first) == _arrays(w) for w in others)


def _arrays(w: Workload) -> list:
    """Every field of a workload (closed loop: its users' too) as a value to compare: arrays as
    bytes, the rest (a shared prefix per request: (ids, unit) tuples or None; class names) as
    they are."""
    values = [getattr(w, f.name) for f in fields(w) if f.name != "users"]
    if w.users is not None:
        values += [getattr(w.users, f.name) for f in fields(w.users) if f.name != "script"]
        if w.users.script is not None:  # (recorded agent sessions: their arrays)
            values += [getattr(w.users.script, f.name) for f in fields(w.users.script)]
    return [np.ascontiguousarray(v).tobytes() if isinstance(v, np.ndarray) else v for v in values]


def _usable(result: dict) -> bool:
    """A point as simulate_point returns it (read back from a journal: the keys the plan reads)."""
    return isinstance(result.get("met"), bool) and all(
        isinstance(result.get(k), dict) and "slo" in result[k] and "p99" in result[k] for k in SLO_METRICS) and all(
        k in result for k in ("goodput_rps", "request_throughput", "output_throughput", "wall_s"))


def without_faults(path: Path, base: tuple[str, ...], scenario) -> tuple[Any, tuple[str, ...], bool]:
    """A plan sizes the fault-free fleet; what its faults need comes after (the spares:
    sim/planning/spares.py; a fleet's headroom: fleet_faults.py). So a scenario's faults are set
    aside (`faults=null`) for every simulation of the search: (the scenario, the overrides, whether
    it had faults)."""
    if scenario.features.get("faults") is None:
        return scenario, base, False
    base = base + ("faults=null",)
    return load_scenario(path, base), base, True


class Evaluator:
    """Runs (overrides, seed) points in parallel, once each; counts simulations for progress.
    `deterministic`: the scenario's workload has no random component; `options` then has one seed
    per point. `journal`: where results are kept as they come (resume)."""

    def __init__(self, path: str | Path, slo: SLOConfig, overrides: Iterable[str] = (),
                 options: PlanOptions = PlanOptions(),
                 progress: Callable[[int], None] | None = None, cost_scale: float = 1.0,
                 runner: Any = None, journal: Any = None):
        self.path, self.slo, self.options, self.progress = Path(path), slo, options, progress
        # where batches of simulations run: local processes (options.workers), or a DaskRunner
        self.runner = runner if runner is not None else LocalRunner(options.workers)
        self.journal = journal
        self.cost_scale = cost_scale  # every step costs this much more (the cost model's error band)
        self.base = tuple(overrides)
        scenario = load_scenario(self.path, self.base)
        if scenario.engine.replicas != 1:  # one replica, unless a point sets engine.replicas (a cluster)
            self.base += ("engine.replicas=1",)
        for knob in ("admission", "autoscaling"):  # what a plan sizes is every request served by fixed replicas
            if getattr(scenario.engine, knob) is not None:
                raise ScenarioError(f"plan: engine.{knob} is set; a plan sizes fixed replicas serving every request "
                                    f"(remove it with --set engine.{knob}=null; docs/fleet.md)")
        scenario, self.base, self.faults_set_aside = without_faults(self.path, self.base, scenario)
        self.scenario = replace(scenario, engine=replace(scenario.engine, replicas=1), slo=slo)
        self.deterministic = deterministic(self.scenario)
        if self.deterministic:  # every seed simulates the same run: more seeds only repeat it
            self.options = options.one_seed()
        self.targets = targets(slo)
        self.stop = EarlyStop(slo, self.options.warmup_fraction, self.options.clear_fail) \
            if self.options.early_stop else None
        self.cache: dict[tuple, dict] = {}  # (overrides, seed[, band scale]) -> its point
        self._lock = threading.Lock()
        self._running: dict[tuple, threading.Event] = {}  # jobs under way in another thread

    @property
    def simulations(self) -> int:
        return len(self.cache)

    @property
    def sim_seconds(self) -> float:
        """Wall seconds of all simulations, summed (as if run one after another)."""
        return sum(r["wall_s"] for r in list(self.cache.values()))

    def load(self, overrides: Iterable[str] = (), seed: int | None = None):
        sc = replace(load_scenario(self.path, self.base + tuple(overrides), seed=seed), slo=self.slo)
        if self.cost_scale != 1.0:
            sc = replace(sc, cost_model=replace(sc.cost_model, scale=self.cost_scale))
        return sc

    def scaled(self, cost_scale: float) -> Evaluator:
        """The same plan with every step `cost_scale` times as long (its own simulations)."""
        return Evaluator(self.path, self.slo, self.base, self.options, self.progress, cost_scale, self.runner,
                         self.journal)

    def runs(self, overrides: tuple[str, ...], seeds: range, whole: bool = False) -> list[dict]:
        """The points of these seeds; `whole`: run to the end, never stopped early (a measurement
        such as the flat-out throughput, not a verdict)."""
        jobs = [(overrides, self.scenario.seed + k, *(("whole",) if whole else ())) for k in seeds]
        self.run(jobs)
        return [self.cache[j] for j in jobs]

    def run(self, jobs: list[tuple]) -> None:
        """Simulate the (overrides, seed) jobs not yet cached, in parallel (a job another thread is
        running is waited for, not run twice; one the journal holds is read back)."""
        mine: list[tuple] = []
        theirs: list[threading.Event] = []
        read = 0
        with self._lock:
            for j in dict.fromkeys(jobs):
                if j in self.cache:
                    continue
                kept = self.journal.get(self._key(j), _usable) if self.journal is not None else None
                if kept is not None:
                    self.cache[j] = kept
                    read += 1
                elif j in self._running:
                    theirs.append(self._running[j])
                else:
                    self._running[j] = threading.Event()
                    mine.append(j)
        if self.progress is not None:
            for _ in range(read):  # (read back from an earlier run: counted as done)
                self.progress(self.simulations)
        try:
            if mine:
                args = [(self.load(j[0], j[1]), self.slo, self.options.warmup_fraction,
                         None if len(j) > 2 else self.stop) for j in mine]
                for i, result in self.runner.map(simulate_point, args):
                    job = mine[i]
                    if self.journal is not None:
                        self.journal.put(self._key(job), result)
                    with self._lock:
                        self.cache[job] = result
                        self._running.pop(job).set()
                    if self.progress is not None:
                        self.progress(self.simulations)
        finally:  # (an error or an interrupt: whoever waits on what did not finish stops waiting)
            with self._lock:
                for job in mine:
                    if job in self._running:
                        self._running.pop(job).set()
        for done in theirs:
            done.wait()
        missing = [j for j in jobs if j not in self.cache]
        if missing:  # (another thread's batch failed: its error is raised there; run them here)
            self.run(missing)

    def _key(self, job: tuple) -> str:
        overrides, seed, *whole = job
        return "\x1f".join((*self.base, *overrides, f"seed={seed}", f"cost_scale={self.cost_scale!r}", *whole))

    def judge(self, overrides: Iterable[str], seeds: tuple[int, int, int] | None = None, **info: Any) -> dict:
        """Does the load meet the SLO in steady state: is the mean of each target's percentile over
        the seeds within it, at 90% confidence (estimator.steady)? `seeds` = (first, near, most),
        default options.seed_ladder(): `first` seeds, then `near`, then `most` while an interval
        straddles a target; at `most` the mean decides (`within_noise`).
        `info` is copied into the point (e.g. load=9.3)."""
        o = self.options
        first, near, most = seeds or o.seed_ladder()
        overrides = tuple(overrides)
        runs = self.runs(overrides, range(first))
        verdict = estimator.steady(runs, self.targets)
        n = first
        while verdict.verdict == "undecided" and n < most:
            n = max(near, first) if n < near else most
            runs = self.runs(overrides, range(n))
            verdict = estimator.steady(runs, self.targets)
        noise = verdict.verdict == "undecided"
        met = verdict.verdict == "met" or (noise and verdict.mean[verdict.binding] <= 1
                                           and not any(r.get("stopped") for r in runs))
        return summarize_point(runs, met=met, overrides=list(overrides),
                               steady={**verdict.as_dict(), "within_noise": noise},
                               bettable=estimator.bettable(runs, self.targets, o.confidence), **info)

    def confirm(self, overrides: Iterable[str], seeds=None, **info: Any) -> dict:
        """Met when a fresh run of this point meets the SLO with probability >= options.confidence,
        predicted from the seeds' worst ratios (estimator.bettable: a one-sided Student-t prediction
        bound); `confirm_first` seeds, more (doubling, up to confirm_seeds) while undecided.
        `seeds` is ignored (the ladder of `judge`); a deterministic workload has one seed, which
        decides."""
        o, overrides = self.options, tuple(overrides)
        n = max(o.confirm_first, 1)
        while True:
            runs = self.runs(overrides, range(n))
            bet = estimator.bettable(runs, self.targets, o.confidence)
            if bet["verdict"] != "undecided" or n >= o.confirm_seeds:
                break
            n = min(2 * n, o.confirm_seeds)
        return summarize_point(runs, met=bet["verdict"] == "met", overrides=list(overrides),
                               bettable={**bet, "confidence": o.confidence},
                               steady=estimator.steady(runs, self.targets).as_dict(), **info)
