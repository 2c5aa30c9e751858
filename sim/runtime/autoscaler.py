"""A fleet whose replicas are added and removed during the run (engine.autoscaling; the rule:
sim/config/autoscaling.py).

Every replica the fleet may hold (max_replicas) is built up front, idle; the `Fleet` says which
serve. `FleetRouter` routes each arrival with the scenario's rule over the serving replicas only.
`Autoscaler` is a SimPy process: every interval it counts the requests in flight on the serving
replicas, decides, starts replicas (they serve `cold_start_s` later) or drains them (no new
requests; released when their last request finishes), and logs each change. The replica-seconds
held (starting, serving, draining) give the GPU-hours and their cost.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from sim.config.autoscaling import AutoscalingConfig
from sim.runtime.routers import Router, Signals, SignalView
from sim.workload.request import RequestTable

IDLE, STARTING, SERVING, DRAINING = "idle", "starting", "serving", "draining"


@dataclass
class Span:
    """One replica held from `start_s` (the decision to start it) until `end_s` (released)."""
    replica: int
    start_s: float
    end_s: float | None = None
    drain_s: float | None = None  # when it was told to drain (None: held to the end)
    pool: str = ""                # the capacity it runs on ("": on demand; "spot": faults.spot)
    usd_per_gpu_hour: float | None = None  # that capacity's price (None: the hardware's)


class Fleet:
    """Which of the built replicas serve, start, drain or sit idle; the spans each was held."""

    def __init__(self, size: int, serving: int):
        self.state = [SERVING if i < serving else IDLE for i in range(size)]
        self.spans = [Span(i, 0.0) for i in range(serving)]
        self.serving = list(range(serving))  # indices routed to, ascending
        self.on_ready: list[Callable[[int], None]] = []  # told when a started replica serves (faults: what waited)
        # the capacity a start takes, asked at each start: (pool, USD per GPU-hour); None: on demand
        # at the hardware's price (faults.spot: spot first while the spot pool has room)
        self.capacity: Callable[[float], tuple[str, float | None]] | None = None

    def _update(self) -> None:
        self.serving = [i for i, s in enumerate(self.state) if s == SERVING]

    def count(self, state: str) -> int:
        return sum(s == state for s in self.state)

    def start(self, now: float) -> int:
        """Hold an idle replica (the lowest index): it starts now."""
        i = self.state.index(IDLE)
        self.state[i] = STARTING
        pool, price = self.capacity(now) if self.capacity is not None else ("", None)
        self.spans.append(Span(i, now, pool=pool, usd_per_gpu_hour=price))
        return i

    def ready(self, i: int) -> None:
        if self.state[i] == STARTING:
            self.state[i] = SERVING
            self._update()
            for hear in self.on_ready:
                hear(i)

    def held(self, i: int) -> Span:
        """Replica i's span now (it is held)."""
        return next(s for s in reversed(self.spans) if s.replica == i and s.end_s is None)

    def drain(self, i: int, now: float) -> None:
        self.state[i] = DRAINING
        self.held(i).drain_s = now
        self._update()

    def release(self, i: int, at: float) -> None:
        self.state[i] = IDLE
        self.held(i).end_s = at
        self._update()


class FleetRouter:
    """The scenario's routing rule over the serving replicas only: each arrival is routed live, as
    the serving set changes. `make_rule(n)`: the rule over n replicas (sim/runtime/routers.make_router)."""

    def __init__(self, make_rule: Callable[[int], Router], fleet: Fleet):
        self.make_rule, self.fleet = make_rule, fleet
        self.signals: Signals | None = None
        # one rule per serving set, kept: a rule's own state (an EWMA, what it routed since the last
        # scrape) lives as long as the set it routes over, and comes back with it
        self.rules: dict[tuple[int, ...], Router] = {}

    def attach(self, signals: Signals | SignalView) -> None:
        assert isinstance(signals, Signals)  # every built replica's
        self.signals = signals

    def plan(self, num_requests: int) -> None:
        return None  # the serving set changes during the run: route at each arrival

    def choose(self, rid: int, loads: list[int]) -> int:
        serving = self.fleet.serving
        key = tuple(serving)
        rule = self.rules.get(key)
        if rule is None:
            rule = self.rules[key] = self.make_rule(len(serving))
            if self.signals is not None:  # what the rule reads of the serving ones (prefix_aware, weighted)
                rule.attach(self.signals.view(list(serving)))
        return serving[rule.choose(rid, [loads[i] for i in serving])]


class Autoscaler:
    """Decides every `config.interval_s` (the first decision one interval in) until every request
    has arrived and finished; `events` logs each change. `loads()`: each built replica's requests
    in flight; `done()`: nothing more will arrive; `on_start(i)`: replica i starts (again)."""

    def __init__(self, env, config: AutoscalingConfig, fleet: Fleet, loads, done, req: RequestTable,
                 on_start: Callable[[int], None] | None = None, up: Callable[[int], bool] | None = None):
        self.env, self.config, self.fleet, self.loads, self.done, self.req = env, config, fleet, loads, done, req
        self.on_start = on_start  # replica i is started (again): its KV cache starts empty
        # which serving replicas are up (faults: a failed one is still held, restarting, but serves
        # nothing): the load is judged on those, and a down one is never the one drained
        self.up = up if up is not None else (lambda _i: True)
        self.window: deque[tuple[float, int]] = deque()  # (time, replicas wanted) over scale_down_delay_s
        self.events: list[dict] = []
        env.process(self.run())

    def run(self):
        c, env = self.config, self.env
        while True:
            yield env.timeout(c.interval_s)
            loads = self.loads()
            if self.done() and not any(loads):
                return
            self._release_drained(loads)
            self._decide(env.now, loads)

    def _release_drained(self, loads: list[int]) -> None:
        """Draining replicas with nothing left are released: held until they were told to drain
        or their last request finished, whichever is later."""
        for i, state in enumerate(self.fleet.state):
            if state == DRAINING and loads[i] == 0:
                drain_s = self.fleet.held(i).drain_s
                assert drain_s is not None  # (draining)
                self.fleet.release(i, max(drain_s, self._last_finish(i)))
                self._log("released", loads)

    def _last_finish(self, i: int) -> float:
        """When replica i's last request finished (-inf: it had none)."""
        finish = self.req.finish[self.req.replica == i]
        finish = finish[np.isfinite(finish)]
        return float(finish.max()) if len(finish) else -np.inf

    def _decide(self, now: float, loads: list[int]) -> None:
        c, fleet = self.config, self.fleet
        up = [i for i in fleet.serving if self.up(i)]
        in_flight = sum(loads[i] for i in up)
        # what serves or will: the up ones and those starting (a down one restarting serves nothing,
        # so the autoscaler sees its capacity leave; it still counts as held against max_replicas)
        current = len(up) + fleet.count(STARTING)
        held = fleet.count(SERVING) + fleet.count(STARTING) + fleet.count(DRAINING)
        floor = c.floor(now)  # min_replicas, or the scheduled floor of the moment
        if current > 0 and abs(in_flight / (c.target_in_flight * current) - 1) <= c.tolerance:
            want = current  # within the tolerance: no change (but a scheduled floor still holds)
        else:
            want = math.ceil(in_flight / c.target_in_flight)
        want = min(c.max_replicas, max(want, floor))
        self.window.append((now, want))
        while self.window[0][0] < now and self.window[0][0] <= now - c.scale_down_delay_s:  # (now's stays)
            self.window.popleft()
        if want > current:
            room = c.max_replicas - held  # replicas held never exceed the max
            for _ in range(min(want - current, room)):
                i = fleet.start(now)
                if self.on_start is not None:
                    self.on_start(i)
                if c.cold_start_s > 0:
                    self.env.timeout(c.cold_start_s).callbacks.append(lambda _e, i=i: fleet.ready(i))
                else:
                    fleet.ready(i)
            if room > 0:
                self._log("started", loads, want)
        else:
            # fewer only when every wish over the window was fewer: the most wanted then
            keep = max(w for _, w in self.window)
            surplus = current - max(keep, floor)
            serving = sorted(up, key=lambda i: (loads[i], -i))  # the lightest first
            for i in serving[:min(surplus, max(len(serving) - 1, 0))]:  # one serves to the end
                fleet.drain(i, now)
            if surplus > 0 and serving:
                self._log("draining", loads, keep)
            self._release_drained(loads)

    def _log(self, action: str, loads: list[int], want: int | None = None) -> None:
        fleet = self.fleet
        self.events.append({"t_s": self.env.now, "action": action, "wanted": want,
                            "in_flight": int(sum(loads[i] for i in fleet.serving)),
                            "serving": fleet.count(SERVING), "starting": fleet.count(STARTING),
                            "draining": fleet.count(DRAINING)})

    def close(self, end_s: float) -> None:
        """The run is over at `end_s` (its last request finished): every replica still held is
        released then."""
        for i, state in enumerate(self.fleet.state):
            if state != IDLE:
                self.fleet.release(i, end_s)

    def summary(self, end_s: float, gpus_per_replica: int, usd_per_gpu_hour: float) -> dict:
        """GPU-hours held and their cost, against a static fleet of max_replicas over the same
        time; the replicas held over time (mean, peak); the log of changes."""
        spans = self.fleet.spans
        held = [(s.end_s if s.end_s is not None else end_s) - s.start_s for s in spans]  # s, each span
        held_s = sum(held)
        gpu_hours = held_s * gpus_per_replica / 3600
        # each span at its capacity's price (a spot one at the spot price), else the hardware's
        usd = gpu_hours * usd_per_gpu_hour
        if any(s.usd_per_gpu_hour is not None for s in spans):
            usd = sum(h * (usd_per_gpu_hour if s.usd_per_gpu_hour is None else s.usd_per_gpu_hour)
                      for h, s in zip(held, spans)) * gpus_per_replica / 3600
        static = self.config.max_replicas * end_s * gpus_per_replica / 3600
        pools: dict[str, float] = {}  # GPU-hours on each non-default capacity pool
        for h, s in zip(held, spans):
            if s.pool:
                pools[s.pool] = pools.get(s.pool, 0.0) + h * gpus_per_replica / 3600
        return {"gpu_hours": gpu_hours, "usd": usd, "usd_per_gpu_hour": usd_per_gpu_hour,
                **({"gpu_hours_by_pool": {"on_demand": gpu_hours - sum(pools.values()), **pools}} if pools else {}),
                "mean_replicas": held_s / end_s if end_s > 0 else float(self.config.min_replicas),
                "peak_replicas": _peak(self.fleet.spans, end_s),
                "static_max_gpu_hours": static,
                "saving_vs_static_max": 1 - gpu_hours / static if static > 0 else 0.0,
                "cold_start_s": self.config.cold_start_s,
                "spans": [{"replica": s.replica, "start_s": s.start_s, "end_s": s.end_s, "drain_s": s.drain_s,
                           **({"pool": s.pool, "usd_per_gpu_hour": s.usd_per_gpu_hour} if s.pool else {})}
                          for s in self.fleet.spans],
                "events": self.events}


def _peak(spans: list[Span], end_s: float) -> int:
    """Most replicas held at once."""
    return max(held_steps([s.start_s for s in spans], [s.end_s for s in spans], end_s)[1])


def held_steps(starts: list[float], ends: list[float | None], end_s: float) -> tuple[list[float], list[int]]:
    """Replicas held over time from their spans (an end None: held to `end_s`): the times at which
    the count changes, the first 0, and the count from each on (a release before a start at the
    same instant)."""
    edges = sorted([(t, 1) for t in starts] + [(t if t is not None else end_s, -1) for t in ends])
    times, held = [0.0], [0]
    for at, step in edges:
        times.append(at)
        held.append(held[-1] + step)
    return times, held
