"""The evaluator: scenario copies simulated once per (overrides, seed), judged on adaptive seeds.

    ev = Evaluator("scenarios/chat-llama3-8b-h100.yaml", slo, options=PlanOptions())
    point = ev.judge(("workload.arrival.rate=9.3", "workload.num_requests=1116"), load=9.3)

Every point is the scenario file plus `--set`-style overrides, validated by `load_scenario` and
simulated in a worker process (sim/planning/parallel.py) that returns a small dict (sim/slo.simulate_point).
Seeds use common random numbers: seed s, s+1, ... at every point. A workload with no random
component (e.g. a trace replay) simulates the same run for every seed: one seed per point then.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from sim.config.errors import ScenarioError
from sim.config.scenario import SLOConfig, load_scenario
from sim.planning.parallel import LocalRunner
from sim.planning.slo import Z_ONE_SIDED_90, seeds_to_confirm, simulate_point, summarize_point, wilson, worst_ratio
from sim.workload.generators import Workload, build_workload


@dataclass(frozen=True)
class PlanOptions:
    first_seeds: int = 2          # seeds per point at first: enough when all are clearly in or out
    seeds: int = 3                # seeds per point when the first ones are near a target
    max_seeds: int = 7            # seeds per point when those disagree
    clear_pass: float = 0.75      # "clearly in": every observed/target ratio <= this
    clear_fail: float = 1.5       # "clearly out": some observed/target ratio >= this
    pass_fraction: float = 2 / 3  # a point meets the SLO when this fraction of its seeds do
    resolution: float = 0.02      # relative step of the rate grid
    confidence: float = 0.9       # the answer: P(a fresh seed meets the SLO) >= this, by a one-sided
    confirm_seeds: int = 30       # ... 90% Wilson lower bound over at most this many seeds per load
    # requests per run: the scenario's own workload.num_requests (what a user re-simulates), or,
    # when horizon_s is set or the scenario has none, horizon_s of arrivals within the bounds
    horizon_s: float | None = None
    min_requests: int = 1000      # requests per run, at least (a stable p99 needs ~1000)
    max_requests: int = 20000     # requests per run, at most
    requests_per_user: int = 10   # closed loop: requests per run = users x this (within the bounds)
    warmup_fraction: float = 0.1  # first requests (by arrival) left out of the SLO check
    curve_resolution: float = 0.05  # relative step of the engine curve's load grid
    curve_seeds: int = 2          # engine curve: seeds per point, and
    curve_max_seeds: int = 3      # ... this many when those disagree (a majority decides)
    workers: int | None = None    # processes; None = all cores

    def seed_ladder(self) -> tuple[int, int, int]:
        """(first, near a target, on disagreement): the load search's seeds per point."""
        return self.first_seeds, max(self.seeds, self.first_seeds), self.max_seeds

    def curve_ladder(self) -> tuple[int, int, int]:
        """The engine curve's: every point is near a target there, so no middle rung."""
        return self.curve_seeds, self.curve_seeds, self.curve_max_seeds

    def one_seed(self) -> PlanOptions:
        """One seed per point everywhere (a deterministic workload)."""
        return replace(self, first_seeds=1, seeds=1, max_seeds=1, curve_seeds=1, curve_max_seeds=1,
                       confirm_seeds=1)


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


class Evaluator:
    """Runs (overrides, seed) points in parallel, once each; counts simulations for progress.
    `deterministic`: the scenario's workload has no random component; `options` then has one seed
    per point."""

    def __init__(self, path: str | Path, slo: SLOConfig, overrides: Iterable[str] = (),
                 options: PlanOptions = PlanOptions(),
                 progress: Callable[[int], None] | None = None, cost_scale: float = 1.0,
                 runner: Any = None):
        self.path, self.slo, self.options, self.progress = Path(path), slo, options, progress
        # where batches of simulations run: local processes (options.workers), or a DaskRunner
        self.runner = runner if runner is not None else LocalRunner(options.workers)
        self.cost_scale = cost_scale  # every step costs this much more (the cost model's error band)
        self.base = tuple(overrides)
        scenario = load_scenario(self.path, self.base)
        if scenario.engine.replicas != 1:  # one replica, unless a point sets engine.replicas (a cluster)
            self.base += ("engine.replicas=1",)
        for knob in ("admission", "autoscaling"):  # what a plan sizes is every request served by fixed replicas
            if getattr(scenario.engine, knob) is not None:
                raise ScenarioError(f"plan: engine.{knob} is set; a plan sizes fixed replicas serving every request "
                                    f"(remove it with --set engine.{knob}=null; docs/fleet.md)")
        self.scenario = replace(scenario, engine=replace(scenario.engine, replicas=1), slo=slo)
        self.deterministic = deterministic(self.scenario)
        if self.deterministic:  # every seed simulates the same run: more seeds only repeat it
            self.options = options.one_seed()
        self.cache: dict[tuple, dict] = {}  # (overrides, seed[, band scale]) -> its point

    @property
    def simulations(self) -> int:
        return len(self.cache)

    @property
    def sim_seconds(self) -> float:
        """Wall seconds of all simulations, summed (as if run one after another)."""
        return sum(r["wall_s"] for r in self.cache.values())

    def load(self, overrides: Iterable[str] = (), seed: int | None = None):
        sc = replace(load_scenario(self.path, self.base + tuple(overrides), seed=seed), slo=self.slo)
        if self.cost_scale != 1.0:
            sc = replace(sc, cost_model=replace(sc.cost_model, scale=self.cost_scale))
        return sc

    def scaled(self, cost_scale: float) -> Evaluator:
        """The same plan with every step `cost_scale` times as long (its own simulations)."""
        return Evaluator(self.path, self.slo, self.base, self.options, self.progress, cost_scale, self.runner)

    def runs(self, overrides: tuple[str, ...], seeds: range) -> list[dict]:
        jobs = [(overrides, self.scenario.seed + k) for k in seeds]
        self.run(jobs)
        return [self.cache[j] for j in jobs]

    def run(self, jobs: list[tuple[tuple[str, ...], int]]) -> None:
        """Simulate the (overrides, seed) jobs not yet cached, in parallel."""
        todo = [j for j in dict.fromkeys(jobs) if j not in self.cache]
        args = [(self.load(o, s), self.slo, self.options.warmup_fraction) for o, s in todo]
        for i, result in self.runner.map(simulate_point, args):
            self.cache[todo[i]] = result
            if self.progress is not None:
                self.progress(self.simulations)

    def judge(self, overrides: Iterable[str], seeds: tuple[int, int, int] | None = None, **info: Any) -> dict:
        """`seeds` = (first, near, most), default options.seed_ladder(): `first` seeds; `near` unless
        all are clearly in or out; `most` when those disagree. `met` when at least pass_fraction of
        them meet the SLO. `info` is copied into the point (e.g. load=9.3)."""
        o = self.options
        first, near, most = seeds or o.seed_ladder()
        overrides = tuple(overrides)
        runs = self.runs(overrides, range(first))
        ratios = [worst_ratio(r, self.slo) for r in runs]
        if not (max(ratios) <= o.clear_pass or min(ratios) >= o.clear_fail):
            runs = self.runs(overrides, range(max(near, first)))
            if 0 < sum(r["met"] for r in runs) < len(runs):
                runs = self.runs(overrides, range(max(most, len(runs))))
        return summarize_point(runs, o.pass_fraction, overrides=list(overrides), **info)

    def confirm(self, overrides: Iterable[str], seeds=None, **info: Any) -> dict:
        """Met when the one-sided 90% Wilson lower bound of P(a seed meets the SLO) reaches
        options.confidence; not met as soon as the upper bound falls below it, or when
        options.confirm_seeds seeds leave it undecided (not shown to hold). Seeds are added in
        batches: as many as would confirm it if all of them pass. `seeds` is ignored (the ladder of
        `judge`); a deterministic workload has one seed, which decides."""
        o, overrides = self.options, tuple(overrides)
        n = o.first_seeds
        while True:
            runs = self.runs(overrides, range(n))
            passes = sum(r["met"] for r in runs)
            if self.deterministic:
                met, bounds = bool(passes), [float(passes), float(passes)]
                break
            bounds = wilson(passes, n, Z_ONE_SIDED_90)
            met = bounds[0] >= o.confidence
            if met or bounds[1] < o.confidence or n >= o.confirm_seeds:
                break
            n = seeds_to_confirm(passes, n, o.confidence, o.confirm_seeds)
        return summarize_point(runs, o.pass_fraction, met=met, overrides=list(overrides),
                               wilson_90=bounds, **info)
