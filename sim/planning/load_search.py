"""The load search: the highest load on a grid that meets the SLO, such that the next point up does not.

    knob = load_knob(scenario, options)       # offered rate (geometric grid) or closed-loop users
    r = max_load(ev, knob)                    # r["answer"], r["next"], r["answer_point"], r["curve"]

Loads are in the knob's unit: offered requests/s, or users. The override that sets a load (its
*setting*) is load / factor: a generator's `workload.arrival.rate` (factor: workload.time_scale, so
the load is the rate the engine sees) or a trace's `workload.time_scale` (factor: the trace's native
rate, (requests - 1) / (last - first arrival)). Grid index 0 is the scenario's setting `knob.base`;
rates: settings base x (1 + resolution)^i (rounded to 6 decimals), loads those x factor; users: the
same rounded to whole users (at least 1), or base + i when resolution is 0. A bracket (doubling the
load, or galloping: 1, 2, 4, ... grid steps from a start known to be close), then bisection on grid
indices. Rounded users can repeat on neighbouring indices; the answer and the next point up still
differ (one meets).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from sim.config.errors import ScenarioError
from sim.planning.estimator import boundary
from sim.workload.generators import Agents, ClosedLoop, Profile, build_workload
from sim.workload.traces import shown

RATE_DEFINITION = "(requests - 1) / (last arrival - first arrival)"
DEFAULT_HORIZON_S = 120.0  # seconds of arrivals per run when the scenario fixes no num_requests


@dataclass(frozen=True)
class Knob:
    """What "load" means: an offered rate on a geometric grid, or closed-loop users."""
    key: str              # the override path
    unit: str             # req/s | users
    base: float           # the grid's index 0, as a setting (the scenario's: where the search starts)
    resolution: float     # relative grid step (users: 0 = one user per step)
    integer: bool
    factor: float = 1.0   # load per unit of the setting: time_scale (generator), native req/s (trace)
    replay: bool = False  # a trace: its length fixes num_requests (no horizon)
    # what a run's length is set through, and requests per unit of it: workload.num_requests (1), or
    # an agents workload's sessions (their mean steps)
    count_key: str = "workload.num_requests"
    per_count: float = 1.0
    # requests a run needs for the SLO's percentile (options.tail_requests judged beyond it, after
    # the warm-up): p99 ~2,223, p90 ~223
    percentile_requests: int = 0

    @property
    def unit_steps(self) -> bool:  # users one at a time (resolution 0): base + i
        return self.integer and not self.resolution

    def value(self, i: int) -> float:
        if self.unit_steps:
            return int(self.base) + i
        v = self.base * (1 + self.resolution) ** i
        return max(1, round(v)) if self.integer else round(v, 6) * self.factor

    def setting(self, value: float) -> float:
        """The override's value for the load `value` (a grid load gives back its rounded setting)."""
        return int(value) if self.integer else round(value / self.factor, 6)

    def anchored(self, value: float, resolution: float) -> Knob:
        """The same knob on a grid of `resolution` steps whose index 0 is the load `value`."""
        return replace(self, base=self.setting(value), resolution=resolution)

    def index(self, value: float) -> int:
        """The highest grid index whose load is at most `value` (within rounding)."""
        if self.unit_steps:
            return math.floor(value - int(self.base) + 1e-3)
        i = math.floor(math.log(value / self.factor / self.base) / math.log1p(self.resolution) + 1e-3)
        while self.value(i + 1) <= value:  # rounded users
            i += 1
        while i > self.lowest() and self.value(i) > value:
            i -= 1
        return i

    def lowest(self) -> int:  # the search gives up below this index: the SLO is unattainable
        if self.unit_steps:
            return 1 - int(self.base)
        return -math.ceil(math.log(self.base if self.integer else 1000) / math.log1p(self.resolution))

    def doubled(self, i: int, direction: int) -> int:
        """The index whose load is about twice (direction 1) or half (-1) that of index i."""
        if self.unit_steps:
            v = int(self.value(i))  # (a whole number of users)
            return i + v if direction > 0 else i - (v - v // 2)
        return i + direction * max(1, round(math.log(2) / math.log1p(self.resolution)))

    def overrides(self, value: float, o, replicas: int = 1) -> tuple[str, ...]:
        """The overrides for a load `value` (o: PlanOptions) on `replicas` replicas: a run covers
        o.horizon_s of arrivals at the load (users: requests_per_user each), at least what the SLO's
        percentile needs and o.min_requests, at most o.max_requests per replica. A trace keeps its
        own requests: only its time_scale changes."""
        setting = f"{self.key}={self.setting(value)}"
        if self.replay:
            return (setting,)
        return (setting, f"{self.count_key}={self.run_count(value, o, replicas)}")

    def run_count(self, value: float, o, replicas: int = 1) -> int:
        """The run length at a load, in the count key's unit (requests; sessions for agents)."""
        # requests over the horizon (a load in sessions/s brings per_count requests a session)
        n = value * (o.requests_per_user if self.integer else o.horizon_s or DEFAULT_HORIZON_S) * self.per_count
        most = math.floor(o.max_requests * replicas / self.per_count + 1e-9)  # (at most the bound)
        n = min(max(n, self.percentile_requests, o.min_requests) / self.per_count, most)  # (no inf past here)
        return max(1, math.ceil(n - 1e-9))


def percentile_requests(slo, options) -> int:
    """Requests per run for options.tail_requests judged beyond the SLO's highest per-request
    percentile (after the warm-up)."""
    if slo is None:
        return 0
    pct = max(p for _, p in slo.targets().values())
    return math.ceil(options.tail_requests / (1 - pct / 100) / (1 - options.warmup_fraction) - 1e-9)


def load_knob(scenario, options) -> Knob:
    """The scenario's load knob on the load search's grid (options.resolution)."""
    knob = _knob(scenario, options)
    return knob if knob.replay else replace(knob, percentile_requests=percentile_requests(scenario.slo, options))


def _knob(scenario, options) -> Knob:
    w = scenario.workload
    if w.trace is not None:  # the same trace replayed faster or slower
        native = replay_stats(w)["native_rate"]
        return Knob("workload.time_scale", "req/s", w.time_scale, options.resolution, False, native, True)
    if isinstance(w.arrival, ClosedLoop):  # the load is a number of concurrent users
        return Knob("workload.arrival.users", "users", w.arrival.users, 0.0, True)
    if isinstance(w.arrival, Agents):  # the load is sessions starting per second; a run's length, sessions
        a = w.arrival
        # (the sessions scale with the rate, over the horizon: a fixed count of sessions, each a chain
        # of calls, would cap the concurrency whatever the rate)
        return Knob("workload.arrival.rate", "sessions/s", a.rate, options.resolution, False, w.time_scale,
                    count_key="workload.arrival.sessions", per_count=a.expected_requests() / a.sessions)
    if isinstance(w.arrival, Profile):
        raise ScenarioError("plan: workload.arrival profile varies its rate over the day; plan searches one "
                            "steady load per replica (a rate, users, or a trace): plan the profile's peak rate "
                            "with process: poisson, or add engine.autoscaling for a fleet plan of the day "
                            "(docs/fleet.md)")
    if not hasattr(w.arrival, "rate"):
        raise ScenarioError(f"plan: workload.arrival {type(w.arrival).__name__.lower()} sends every request "
                            "at one instant: there is no rate to vary; use poisson, gamma or constant, "
                            "closed_loop, or a trace")
    return Knob("workload.arrival.rate", "req/s", w.arrival.rate, options.resolution, False, w.time_scale)


TARGET_FLAGS = {"req/s": "--target-rate", "users": "--target-users", "sessions/s": "--target-rate"}


def check_target_unit(knob: Knob, target: float | None, target_unit: str, path) -> str:
    """The target's unit, checked against the load's: --target-rate of an agents workload is read as
    sessions starting per second; a rate for a closed loop (or users for an open loop) is refused."""
    if target_unit == "req/s" and knob.unit == "sessions/s":
        return knob.unit
    if target is not None and target_unit != knob.unit:
        kind = ("closed-loop (its load is workload.arrival.users)" if knob.integer
                else f"open-loop (its load is {knob.key})")
        raise ScenarioError(f"{TARGET_FLAGS[target_unit]}: {path} is {kind}; use {TARGET_FLAGS[knob.unit]}")
    return target_unit


def replay_stats(w) -> dict:
    """A trace workload's requests (after num_requests), their span at time_scale 1 and its native
    rate: (n - 1) / span, the n - 1 gaps between the first and the last arrival."""
    arrival = build_workload(replace(w, time_scale=1.0, priority=None), np.random.default_rng(0)).arrival_s
    if np.isnan(arrival).all():  # recorded agent sessions: arrivals made during the run (closed loop)
        raise ScenarioError(f"plan: {shown(w.trace)}: recorded agent sessions arrive as their calls finish, "
                            "not at a rate to vary; plan the shape with arrival process agents (sessions/s), "
                            "or replay it faster or slower with `servesim sweep --grid workload.time_scale=...`")
    span = float(arrival[-1] - arrival[0])
    if span <= 0:
        raise ScenarioError(f"plan: {shown(w.trace)}: its {len(arrival)} requests arrive at one instant: "
                            "there is no rate to vary (workload.time_scale changes nothing)")
    return {"trace": str(w.trace), "requests": len(arrival), "span_s": span,
            "native_rate": (len(arrival) - 1) / span, "native_rate_definition": RATE_DEFINITION,
            "time_scale": w.time_scale}


def max_load(ev, knob: Knob, extra: tuple[str, ...] = (), *, start: int = 0, gallop: bool = False,
             seeds: tuple[int, int, int] | None = None, **info) -> dict:
    """Largest grid load that meets the SLO, such that the next grid point up does not.

    ev: an Evaluator (its `judge`: the mean SLO percentile over seeds within every target, at 90%
    confidence, seeds added while that is undecided: sim/planning/estimator.py); extra: overrides
    for every point (an engine setting); start: the first index; gallop: bracket with 1, 2, 4, ...
    grid steps instead of doubling the load; seeds: the judge's seed ladder; info: copied into
    every point. `estimate`: where between the answer and the next point the binding target's
    percentile crosses it, with a 90% interval from the seeds (estimator.boundary)."""
    points, lo, hi = _bracket(ev, ev.judge, knob, extra, start, gallop, seeds, info)
    curve = [points[k] for k in sorted(points)]
    out = {"knob": knob.key, "unit": knob.unit, "resolution": knob.resolution, "factor": knob.factor,
           "next": knob.value(hi), "next_setting": knob.setting(knob.value(hi)), "next_point": points[hi],
           "curve": curve, "answer": None, "answer_setting": None, "answer_point": None, "judge": "steady",
           "estimate": None}
    if lo is not None:
        out.update(answer=knob.value(lo), answer_setting=knob.setting(knob.value(lo)), answer_point=points[lo],
                   confidence=confidence(points[lo], points[hi], ev.deterministic),
                   estimate=None if ev.deterministic else boundary(points[lo], points[hi]))
    return out


def _bracket(ev, judge, knob: Knob, extra: tuple[str, ...], start: int, gallop: bool, seeds, info
             ) -> tuple[dict[int, dict], int | None, int]:
    """Bracket then bisect with `judge`: (points by grid index, the highest meeting index or None,
    the index above it that does not meet)."""
    points: dict[int, dict] = {}
    start = max(start, knob.lowest())

    def meets(i: int) -> bool:
        if i not in points:
            value = knob.value(i)
            points[i] = judge(extra + knob.overrides(value, ev.options), seeds=seeds, load=value,
                              setting=knob.setting(value), **info)
        return points[i]["met"]

    def move(i: int, direction: int, moves: int) -> int:
        return i + direction * 2 ** moves if gallop else knob.doubled(i, direction)

    # Give up 12 doublings above the start (4096x): the cost model or the SLO must be off.
    highest = knob.index(knob.value(start) * 4096)
    lo = hi = None
    if meets(start):  # bracket upwards until it fails
        lo, moves = start, 0
        while hi is None:
            nxt = move(lo, 1, moves)
            if nxt > highest:
                short = f" (workload.time_scale={knob.setting(knob.value(lo))}): the trace may be too short to " \
                        "load the engine" if knob.replay else ""
                raise ScenarioError(f"plan: the SLO still holds at {knob.value(lo):g} {knob.unit}{short}; "
                                    "check the cost model and the SLO")
            lo, hi, moves = (nxt, None, moves + 1) if meets(nxt) else (lo, nxt, moves)
    else:  # bracket downwards until it holds
        hi, moves = start, 0
        while lo is None:
            nxt = max(move(hi, -1, moves), knob.lowest())
            if nxt == hi:
                break
            lo, hi, moves = (nxt, hi, moves) if meets(nxt) else (None, nxt, moves + 1)
    if lo is not None:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if meets(mid) else (lo, mid)
    return points, lo, hi


def confidence(answer: dict, above: dict, deterministic: bool) -> dict:
    """How sure the answer is: "deterministic" (every seed simulates the same run, so one seed per
    point is the whole truth) or "steady" (the mean SLO percentile over the seeds at the answer is
    within every target, and one grid step up it is not, each at 90% confidence or, where the
    seeds could not tell at the most allowed, by the mean: `within_noise`), with the share of
    seeds meeting the SLO at each and the chance that a fresh run at the answer meets it."""
    if deterministic:
        return {"method": "deterministic", "answer_met": answer["met"], "next_met": above["met"]}
    sa, sn = answer.get("steady") or {}, above.get("steady") or {}
    return {"method": "steady",
            "answer_seeds": answer["seeds"], "next_seeds": above["seeds"],
            "answer_pass_fraction": answer["passes"] / answer["seeds"],
            "next_pass_fraction": above["passes"] / above["seeds"],
            "answer_within_noise": bool(sa.get("within_noise")), "next_within_noise": bool(sn.get("within_noise")),
            "fresh_run_probability": (answer.get("bettable") or {}).get("probability"),
            "basis": "the mean over seeds of each target's percentile (after the warm-up) against the target, "
                     "90% Student-t intervals over the seeds: within at the answer, past it one grid step up"}
