"""Faults while the run goes on (issue 51): replicas that fail, are drained for a rolling restart
or are taken back as spot capacity, and what happens to their requests.

`Faults` is the open-loop source of arrivals for every replica's inbox (in place of
sim/runtime/cluster.LiveRouter): it routes each request at its arrival with the scenario's rule
over the replicas that are up (sim/runtime/autoscaler.FleetRouter over a `Pool`), and routes a
retried request again `retry_delay_s` after it was lost. Its `next_time` includes the retries
due, so a fast-forwarded decode run on another replica is cut where a retry could join it (the
results equal stepping one iteration at a time).

A replica goes down by an interrupt of its process (`FaultyReplica`): the iteration in flight is
lost (its tokens never reach a client, its GPU time is not recorded), every request on the
replica (running, waiting, routed and not yet taken) is taken off; it is retried (its prompt
recomputed from scratch: a new attempt; latencies stay measured from the first arrival) or, with
`on_failure: fail` or after `max_retries`, failed (no finish time). The replica comes back with
an empty KV cache (a restarted pod). A drained replica (rolling restart, spot notice) gets no new
requests and finishes what it has; what is left when its time is up is taken off as above.

Spot capacity in an autoscaled fleet: every start takes spot capacity while the spot pool has room
(`spot.replicas` replicas at once, less those whose capacity the cloud took in the last
`replace_s` s), else on-demand capacity (the fleet's `capacity` hook; each span keeps its pool and
price). A preempted spot replica is drained for the notice, then taken: its requests are lost as
above and it leaves the fleet (released: no longer held nor paid); the autoscaler sees the
capacity leave and starts another, on spot if the pool has room again, else on demand. It does
not move replicas back to spot when spot capacity returns (no rebalancing).
"""
from __future__ import annotations

import heapq
from collections import deque
from math import inf

import numpy as np
import simpy

from sim.config.checks import MAX_SECONDS
from sim.features.faults.config import FaultsConfig
from sim.runtime.autoscaler import IDLE, FleetRouter
from sim.runtime.cluster import Inbox
from sim.runtime.engine import Replica
from sim.runtime.fast_forward import ITERATION_END, phase_timeout, total
from sim.runtime.routers import Signals

UP, DOWN, DRAINING = "up", "down", "draining"


class Pool:
    """Which replicas are up (routed to: `serving`, what FleetRouter reads), draining or down; the
    log of every change (t_s, replica, state, why). With an autoscaled `fleet`
    (sim/runtime/autoscaler.Fleet), a replica serves when the fleet has it serving and it is up."""

    def __init__(self, size: int, fleet=None):
        self.state = [UP] * size
        self.fleet = fleet
        self._up = list(range(size))
        self.log: list[dict] = []

    @property
    def serving(self) -> list[int]:
        if self.fleet is None:
            return self._up
        return [j for j in self.fleet.serving if self.state[j] == UP]

    def held(self, i: int) -> bool:
        """Is replica i part of the fleet now (always, without autoscaling)? A fault only strikes those."""
        return self.fleet is None or self.fleet.state[i] != IDLE

    def set(self, i: int, state: str, now: float, why: str) -> None:
        self.state[i] = state
        self._up = [j for j, s in enumerate(self.state) if s == UP]
        self.log.append({"t_s": now, "replica": i, "state": state, "why": why})


def _evacuate(scheduler, box: Inbox, now: float) -> list[int]:
    """Every request on a replica that stops: routed and not yet taken, running (their KV freed as
    a preemption frees it) and waiting; the scheduler is left empty, its caches restarted."""
    rids = list(box._rids[box._next:])
    box._next, box._head = len(box._times), inf
    running = list(scheduler.order)
    req = scheduler.req
    for rid in running:
        scheduler._preempt(rid, now)
    req.preemptions[running] -= 1  # (a loss, not a preemption: _preempt counted one)
    scheduler._preempted = []
    while len(scheduler.waiting):
        rids.append(scheduler.waiting.pop())
    scheduler.retry_at = inf
    # a restarted pod: every block free, nothing cached (the iteration in flight had allocated
    # blocks for tokens it never computed: no request's count covers them)
    kv = scheduler.kv
    kv.free = kv.num_blocks
    if hasattr(kv, "held"):
        kv.held = {}
    kv.restart()
    for part in ("connector", "lora"):
        if getattr(scheduler, part, None) is not None:
            getattr(scheduler, part).restart()
    return sorted(set(rids))


class Faults:
    """The run's faults: the source of every replica's arrivals and the processes that take
    replicas down and bring them back. `replica_class`: the replicas to build (they report here)."""

    def __init__(self, env, config: FaultsConfig, req, schedulers: list, make_rule, routing_stale: bool,
                 rng: np.random.Generator, spot_from: int, fleet=None, spot_usd: float | None = None):
        self.env, self.config, self.req, self.schedulers = env, config, req, schedulers
        self.rng = rng
        n, size = len(req), len(schedulers)
        self.pool = Pool(size, fleet)
        if fleet is not None:
            fleet.on_ready.append(self._flush)
        self.router = FleetRouter(make_rule, self.pool)  # type: ignore[arg-type]
        self.inboxes = [Inbox([], [], router=self) for _ in schedulers]
        self.signals = Signals(schedulers, stale=routing_stale)
        self.signals.bind(self.inboxes)
        self.router.attach(self.signals)
        self.spot_from = spot_from  # replicas spot_from.. run on spot capacity (without autoscaling)
        self.fleet = fleet
        self.spot_usd = spot_usd    # USD per GPU-hour of spot capacity
        self._spot_back: list[float] = []  # when the capacity of each spot replica taken comes back (s)
        if fleet is not None and config.spot is not None:
            fleet.capacity = self._capacity
            for span in fleet.spans:  # the replicas serving from the start take spot first too
                span.pool, span.usd_per_gpu_hour = self._capacity(0.0)
        self.attempts = np.ones(n, dtype=np.int64)   # attempts each request took (1: never lost)
        self.failed = np.zeros(n, dtype=bool)        # given up: lost once more than max_retries allow
        self.resent_s = np.full(n, np.nan)           # when its last attempt was sent (NaN: never lost)
        self.outstanding = n                         # neither finished nor failed
        self.all_done = env.event()
        self._retries: list[tuple[float, int]] = []  # (due s, request id)
        self._held: deque[int] = deque()             # arrived while no replica was up
        self._next = 0
        self.back: list[simpy.Event | None] = [None] * size  # a down replica's return
        self.drained: list[simpy.Event | None] = [None] * size
        self.replicas: list = []
        self.counts = {"failures": 0, "outages": 0, "drains": 0, "preemptions": 0, "lost": 0}
        faults = self

        class FaultyReplica(_FaultyReplica):
            pass
        FaultyReplica.faults = faults
        self.replica_class = FaultyReplica
        env.process(self._arrivals())

    def _capacity(self, now: float) -> tuple[str, float | None]:
        """What an autoscaled start takes: spot while the spot pool has room, else on demand."""
        s = self.config.spot
        assert s is not None and self.fleet is not None
        held = sum(span.end_s is None and span.pool == "spot" for span in self.fleet.spans)
        away = sum(t > now for t in self._spot_back)  # taken, and not yet back
        return ("spot", self.spot_usd) if held + away < s.replicas else ("", None)

    def _preemptible(self, i: int) -> bool:
        """Can a preemption strike replica i now: not down, and on spot capacity (autoscaled: held
        on a spot span, and up: not already under a notice or draining)?"""
        if self.fleet is None:
            return i >= self.spot_from and self.pool.state[i] != DOWN
        return self.pool.state[i] == UP and self.fleet.state[i] != IDLE and self.fleet.held(i).pool == "spot"

    # -- the source of arrivals (sim/runtime/cluster.Source) ------------------------------------
    @property
    def done(self) -> bool:
        return self.outstanding == 0

    def next_time(self) -> float:
        arrival = self.req.arrival
        first = arrival[self._next] if self._next < len(arrival) else inf
        return min(first, self._retries[0][0]) if self._retries else first

    def _arrivals(self):
        """The original arrivals, as sim/runtime/cluster.LiveRouter routes them (the same events,
        so the same order within an instant); a retry is routed by its own timeout (`_resend`)."""
        env, arrival = self.env, self.req.arrival
        while self._next < len(arrival):
            t = arrival[self._next]
            if t > env.now:
                yield env.timeout(t - env.now)
            rid, self._next = self._next, self._next + 1
            self._route(rid)

    def _resend(self, _event) -> None:
        _, rid = heapq.heappop(self._retries)  # (due now; same-instant ones in request order)
        self.resent_s[rid] = self.env.now
        self._route(rid)

    def _route(self, rid: int) -> None:
        if not self.pool.serving:
            self._held.append(rid)  # no replica up: it waits for the first back (the client's connection stays)
            return
        target = self.router.choose(rid, self.signals.loads())
        self.req.replica[rid] = target
        self.inboxes[target].deliver(rid, self.env.now)

    # -- what the replicas report ---------------------------------------------------------------
    def finished(self, i: int, rids) -> None:
        self.outstanding -= len(rids)
        self._check_drained(i)
        if self.outstanding == 0 and not self.all_done.triggered:
            self.all_done.succeed()

    def _check_drained(self, i: int) -> None:
        ev = self.drained[i]
        if ev is not None and not ev.triggered and self.schedulers[i].load() + self.inboxes[i].pending() == 0:
            ev.succeed()

    def lost(self, i: int, now: float) -> simpy.Event:
        """Replica i stopped now (its process was interrupted): its requests retried or failed;
        the event of its return."""
        c, req = self.config, self.req
        rids = _evacuate(self.schedulers[i], self.inboxes[i], now)
        self.counts["lost"] += len(rids)
        for rid in rids:
            req.computed[rid] = req.generated[rid] = 0
            req.first_scheduled[rid] = req.first_token[rid] = req.finish[rid] = req.resume_from[rid] = np.nan
            if c.on_failure == "retry" and self.attempts[rid] <= c.max_retries:
                self.attempts[rid] += 1
                heapq.heappush(self._retries, (now + c.retry_delay_s, rid))
                self.env.timeout(c.retry_delay_s).callbacks.append(self._resend)
            else:
                self.failed[rid] = True
                self.outstanding -= 1
        if self.outstanding == 0 and not self.all_done.triggered:
            self.all_done.succeed()
        back = self.back[i]
        assert back is not None  # (set by _down before the interrupt)
        return back

    # -- the processes that take replicas down ----------------------------------------------------
    def start(self, replicas: list) -> None:
        """Every replica is built: the faults' processes start."""
        self.replicas, c = replicas, self.config
        if c.failures is not None:
            for i in range(len(replicas)):
                self.env.process(self._failures(i))
        for o in c.outages:
            self.env.process(self._outage(o))
        if c.drains is not None:
            self.env.process(self._drains())
        if c.spot is not None:  # (autoscaled: any replica may be on spot while it is held)
            for i in range(self.spot_from if self.fleet is None else 0, len(replicas)):
                self.env.process(self._spot(i))
            for o in c.spot.notices:
                self.env.process(self._notice(o.replica, o.at_s))

    def _sleep(self, dt: float):
        """Wait `dt` s; True when the run is over first."""
        if not self.all_done.triggered:
            # a wait past every arrival servesim accepts is one the run never reaches: not put on the
            # clock, where the last pending timeout would carry env.now to it after the run (a spot
            # rate of 1e-300/h took the clock to 1e304 s and the run was refused as off the scale)
            yield self.env.any_of([self.env.timeout(dt), self.all_done] if dt <= MAX_SECONDS else [self.all_done])
        return self.all_done.triggered

    def _down(self, i: int, why: str, down_s: float):
        """Replica i goes down now for `down_s` s (already down: wait for its return instead)."""
        env = self.env
        if self.pool.state[i] == DOWN:
            back = self.back[i]
            if back is not None and not back.triggered:
                yield back
            return
        self.pool.set(i, DOWN, env.now, why)
        self.drained[i] = None
        self.back[i] = back = env.event()
        process = self.replicas[i].process
        if process.is_alive:
            process.interrupt(why)
        yield env.timeout(down_s)
        self.pool.set(i, UP, env.now, "back")
        back.succeed()
        self._flush()

    def _flush(self, _i: int | None = None) -> None:
        """What arrived while nothing was up, routed now that something is (a replica back, or one
        an autoscaled fleet started)."""
        while self._held and self.pool.serving:
            self._route(self._held.popleft())

    def _drain(self, i: int, why: str):
        """Replica i takes no new requests from now; the event of its last one finishing."""
        self.pool.set(i, DRAINING, self.env.now, why)
        self.drained[i] = ev = self.env.event()
        self._check_drained(i)
        return ev

    def _failures(self, i: int):
        f = self.config.failures
        assert f is not None
        while True:
            if (yield from self._sleep(float(self.rng.exponential(f.mtbf_h * 3600.0)))):
                return
            if self.pool.state[i] != DOWN and self.pool.held(i):  # (an idle replica of a fleet runs nothing)
                self.counts["failures"] += 1
                yield from self._down(i, "failure", f.repair_s)

    def _outage(self, o):
        if (yield from self._sleep(max(o.at_s - self.env.now, 0.0))):
            return
        if o.replica < len(self.replicas) and self.pool.state[o.replica] != DOWN and self.pool.held(o.replica):
            self.counts["outages"] += 1
            yield from self._down(o.replica, "outage", o.down_s)

    def _drains(self):
        d = self.config.drains
        assert d is not None
        if (yield from self._sleep(d.start_s)):
            return
        for i in d.replicas if d.replicas is not None else range(len(self.replicas)):
            if self.all_done.triggered:
                return
            while self.pool.state[i] == DOWN:  # (down for a fault: drained when it is back)
                yield self.back[i]
            if not self.pool.held(i):  # (not in the autoscaled fleet now: nothing to restart)
                continue
            self.counts["drains"] += 1
            drained = self._drain(i, "drain")
            yield self.env.any_of([drained, self.env.timeout(d.timeout_s)])
            yield from self._down(i, "restart", d.restart_s)

    def _spot(self, i: int):
        s = self.config.spot
        assert s is not None
        if s.preemptions_per_h <= 0:
            return
        while True:
            # (memoryless: times drawn all along and kept only while it is on spot are the same rate
            # over its time on spot)
            if (yield from self._sleep(float(self.rng.exponential(3600.0 / s.preemptions_per_h)))):
                return
            if self._preemptible(i):
                yield from self._preempt(i)

    def _notice(self, i: int, at_s: float):
        if not (yield from self._sleep(max(at_s - self.env.now, 0.0))) and self._preemptible(i):
            yield from self._preempt(i)

    def _preempt(self, i: int):
        """Spot replica i is told it will be taken: drained for the notice, then gone until replaced
        (autoscaled: it leaves the fleet; `_take`)."""
        s = self.config.spot
        assert s is not None
        self.counts["preemptions"] += 1
        span = self.fleet.held(i) if self.fleet is not None else None
        self._drain(i, "spot notice")
        yield self.env.timeout(s.notice_s)  # taken at the notice's end, drained or not
        if self.fleet is None:
            yield from self._down(i, "preempted", s.replace_s)
        elif self.pool.state[i] == DRAINING and self.fleet.state[i] != IDLE and self.fleet.held(i) is span:
            self._take(i)
        elif self.pool.state[i] == DRAINING:  # (the autoscaler released it first: nothing left to take)
            self.pool.set(i, UP, self.env.now, "released")

    def _take(self, i: int) -> None:
        """An autoscaled spot replica is taken now: its requests lost (`lost`), the replica released
        from the fleet (no longer held nor paid), idle and ready to be started again as a new pod;
        its spot capacity back `replace_s` s from now."""
        s, env = self.config.spot, self.env
        assert s is not None and self.fleet is not None
        self.pool.set(i, DOWN, env.now, "preempted")
        self.drained[i] = None
        self.back[i] = back = env.event()
        process = self.replicas[i].process
        if process.is_alive:
            process.interrupt("preempted")
        self.fleet.release(i, env.now)
        self._spot_back.append(env.now + s.replace_s)
        self.pool.set(i, UP, env.now, "released")
        back.succeed()


class _FaultyReplica(Replica):
    """A replica whose process a fault may interrupt at any point: the step of
    sim/runtime/engine.Replica.run, with the finishes reported and a loss handled. A run of
    iterations is priced and waited on here (as Runner.start does for an inbox that never cuts
    runs), so that an interrupt knows which of its iterations had ended: those are applied and
    recorded as stepping them would have, the one in flight is lost."""
    faults: Faults
    _running: tuple | None = None  # (schedule, start s, durations s) of the run in progress

    def run(self):
        faults = self.faults
        while True:
            try:
                yield from self._serve()
                return
            except simpy.Interrupt:
                self._salvage(self.env.now)
                back = faults.lost(self.index, self.env.now)
            while True:  # down until `back`; a fault at the instant it is back takes it down again
                try:
                    yield back
                    break
                except simpy.Interrupt:
                    back = faults.lost(self.index, self.env.now)

    def _serve(self):
        env, inbox, faults = self.env, self.inbox, self.faults
        while True:
            schedule = self._ask(env.now)
            if schedule is None:
                wake = inbox.wait(env, self.scheduler.retry_at)
                if wake is None:
                    return
                yield wake
                continue
            start = env.now
            durations, seconds = self.runner.price(schedule, start)
            self._running = (schedule, start, durations)
            yield phase_timeout(env, seconds, ITERATION_END)
            self._running = None
            outcome = self._apply(schedule, start, durations, seconds, env.now)
            if outcome.finished:
                faults.finished(self.index, outcome.finished)
            settle = inbox.settle(env, outcome)
            if settle is not None:
                yield settle

    def _salvage(self, now: float) -> None:
        """The iterations of the run in progress that ended by `now`, applied and recorded."""
        running, self._running = self._running, None
        if running is None:
            return
        schedule, start, durations = running
        ends = start + np.cumsum(durations)
        done = int(np.searchsorted(ends, now, "right"))
        if done:
            ran = durations[:done]
            outcome = self._apply(schedule, start, ran, total(ran), float(ends[done - 1]))
            if outcome.finished:
                self.faults.finished(self.index, outcome.finished)
