"""Replicas behind a router. Each replica reads its arrivals from an `Inbox`.

Routing rules are plug-ins: a `Router` and one line in `ROUTERS`. A rule that does not depend on
the replicas' state (round_robin) is decided up front (`plan`) and each inbox is a sorted list the
replica reads by itself: no SimPy event per request. A rule that does (least_loaded: the fewest
requests waiting or running, ties to the lowest index) routes each request at its arrival time,
through a router process that delivers them one by one.

A closed loop (`ClosedLoopRouter`) learns each arrival time only when the same user's previous
request finishes, so it routes live with either rule, in the phases of sim/runtime/fast_forward.py:
iterations end and report finished requests, arrivals are routed, replicas schedule. An arrival
that could join a replica's fast-forwarded decode run cuts the run at its first iteration boundary
at or after the arrival (`Runner.cut`).
"""
from __future__ import annotations

import heapq
from array import array
from collections import deque
from math import inf
from typing import Any, ClassVar, Protocol

import numpy as np
import simpy

from sim.runtime.fast_forward import ITERATION_END, SCHEDULE, Runner, fire, phase_timeout
from sim.runtime.routers import Router, Signals
from sim.workload.generators import Users
from sim.workload.request import RequestTable


def _loads(schedulers: list, inboxes: list) -> list[int]:
    """Exact loads, computed here (compiled with this module: a live router asks at every arrival)."""
    return [s.load() + box.pending() for s, box in zip(schedulers, inboxes)]


def _seen_loads(signals: Signals, schedulers: list, inboxes: list) -> list[int]:
    """The loads a rule reads now: the last scrape's (stale signals), else exact."""
    return signals.loads() if signals.stale else _loads(schedulers, inboxes)


class Source(Protocol):
    """What delivers requests to inboxes while the simulation runs: a LiveRouter, a ClosedLoopRouter,
    or a disaggregated decode pool's KV transfers (sim/runtime/disaggregation.KVTransfers)."""

    @property
    def done(self) -> bool: ...  # (nothing more will be delivered)

    def next_time(self) -> float: ...  # (s; inf: nothing due)


class ClosedSource(Source, Protocol):
    """A Source told when its requests finish (closed-loop users reply; UserInbox)."""

    def finished(self, rids) -> None: ...


class Inbox:
    """Requests routed to one replica, in arrival order; `arrived(now)` hands over new ones."""

    cuts_runs: ClassVar[bool] = False  # may a delivery cut its reader's decode run (Replica.cut)?

    def __init__(self, times, rids, router: Source | None = None):
        # arrival times (s) and request ids, indexed like lists: lists when a router delivers
        # live, packed arrays when every request is planned up front (make_inboxes)
        self._times, self._rids = times, rids
        self._next = 0          # first request not yet handed to the scheduler
        self._head = times[0] if len(times) else inf  # its arrival time (inf: none yet)
        self._router = router   # None: every request is already here
        # event an idle replica waits on while the router may still deliver
        self._wakeup: simpy.Event | None = None
        self.reader: Runner | None = None  # the Runner of the replica reading this inbox (it sets itself)

    @property
    def routed_live(self) -> bool:
        """Do requests arrive through a router process (rather than all known up front)?"""
        return self._router is not None

    def arrived(self, now: float):
        """The ids of the requests that arrived by `now` and were not handed over yet."""
        if self._head > now:
            return ()  # most iterations: nothing new
        times, nxt, n = self._times, self._next, len(self._times)
        end = nxt + 1
        while end < n and times[end] <= now:  # (a scan: a delivery is mostly one or two)
            end += 1
        self._next = end
        self._head = times[end] if end < n else inf
        return self._rids[nxt:end]

    def pending(self) -> int:
        return len(self._rids) - self._next

    def next_arrival(self) -> float:
        """Earliest time a request may reach this replica (inf: none will)."""
        mine = self._head
        return min(mine, self._router.next_time()) if self._router else mine

    def _push(self, rid: int, now: float) -> None:
        self._times.append(now)
        self._rids.append(rid)
        if self._next == len(self._times) - 1:  # the first not handed over
            self._head = now

    def deliver(self, rid: int, now: float) -> None:
        self._push(rid, now)
        if self._wakeup is not None and not self._wakeup.triggered:
            self._wakeup.succeed()

    def settle(self, env, outcome):
        """What a replica waits on after an iteration before it schedules again: with live routing,
        the router's arrivals at this instant come first; None when every request is already here."""
        return None if self._router is None else env.timeout(0)

    def wake_at(self, retry_at: float) -> float:
        """When an idle replica reading every request up front wakes: the next arrival or
        `retry_at` (inf: neither comes)."""
        return min(self.next_arrival(), retry_at)

    def wait(self, env, retry_at: float):
        """An event for an idle replica: the next arrival or `retry_at`; None if neither comes."""
        if self._router is None or self._next < len(self._times):
            wake = self.wake_at(retry_at)
            return None if wake == np.inf else env.timeout(wake - env.now)
        if self._router.done and retry_at == np.inf:
            return None
        self._wakeup = env.event()
        if retry_at == np.inf:
            return self._wakeup
        return env.any_of([self._wakeup, env.timeout(retry_at - env.now)])


class Scraper:
    """Takes stale `signals` on the grid 0, `interval_s`, 2 x `interval_s`, ... (the first when
    they are bound) while `source` may still route a request (engine.routing.staleness_s). Only
    the scrape at or before an arrival is ever read, so the grid points before it are skipped when
    that arrival is known: always in an open loop (`always_known`), and in a closed loop while
    nothing is in flight (only a finish sends a new request). A sparse trace or long think times
    thus cost a scrape per arrival, not one per `interval_s` of clock. A scrape at an instant sees
    the iterations that end then, and the arrivals then see it."""

    def __init__(self, env, signals: Signals, interval_s: float, source: Source, always_known: bool):
        self.env, self.signals, self.interval_s, self.source = env, signals, interval_s, source
        self.always_known = always_known
        env.process(self.run())

    def run(self):
        s, k = self.interval_s, 0  # the last scrape was at k x s (0: when the signals were bound)
        while not self.source.done:
            after = k + 1
            if self.always_known or not any(self.signals.exact_loads()):
                due = self.source.next_time()
                if due < inf:  # the grid point at or before the next arrival
                    after = max(after, int(due // s))
            k = after
            # at k x s: after the iterations that end then (theirs first: scheduled before this
            # wake-up, they run first in the phase), before the arrivals then (NORMAL, later)
            yield phase_timeout(self.env, max(k * s - self.env.now, 0.0), ITERATION_END)
            yield phase_timeout(self.env, 0.0, ITERATION_END)
            self.signals.scrape()


class LiveRouter:
    """Routes each open-loop request at its arrival time with a rule that reads the replicas' load."""

    def __init__(self, env, router: Router, arrival: np.ndarray, schedulers: list,
                 replica_of: np.ndarray, signals: Signals):
        self.env, self.router, self.arrival, self.schedulers = env, router, arrival, schedulers
        self.replica_of = replica_of  # written as requests are routed
        self.inboxes = [Inbox([], [], router=self) for _ in schedulers]
        self.signals = signals
        signals.bind(self.inboxes)
        router.attach(signals)
        self._next = 0
        self.done = len(arrival) == 0
        env.process(self.run())

    def next_time(self) -> float:
        return self.arrival[self._next] if self._next < len(self.arrival) else np.inf

    def run(self):
        env = self.env
        while self._next < len(self.arrival):
            t = self.arrival[self._next]
            if t > env.now:
                yield env.timeout(t - env.now)
            rid = self._next
            target = self.router.choose(rid, _seen_loads(self.signals, self.schedulers, self.inboxes))
            self.replica_of[rid] = target
            self._next += 1
            self.done = self._next == len(self.arrival)
            self.inboxes[target].deliver(rid, env.now)


class ClosedLoopRouter:
    """`users` users, each with at most one request in flight: when a request finishes, its user
    sends the next one after its think time. Request ids (and the lengths drawn for them) go in
    arrival order, ties by user; once `len(req)` requests have arrived, users send no more, and
    an agent session (users.calls) stops after its own calls. Every arrival is routed by
    `router.choose` as it happens."""

    def __init__(self, env, req: RequestTable, users: Users, schedulers: list, router: Router,
                 signals: Signals, sessions=None):
        self.env, self.req, self.schedulers, self.router = env, req, schedulers, router
        self.signals = signals
        self.sessions = sessions  # multi-turn: sim/workload/sessions.Sessions sets each arrival's prompt
        self.think = users.think_s
        self.user = np.full(len(req), -1, dtype=np.int64)  # who sent each request
        # agents: the calls each session has yet to send (None: users send until len(req) arrived)
        self.left = None if users.calls is None else users.calls.copy()
        # agents with fan-out: each step's calls go together, the next step after the last answer
        self.fan: Any = users.fan_out
        self._step: Any = None if users.fan_offsets is None else users.fan_offsets[:-1].copy()  # user -> its step
        # user -> calls of its current step not yet answered
        self._pending: Any = None if self.fan is None else np.zeros(len(users.start_s), dtype=np.int64)
        req.arrival = np.full(len(req), np.nan)  # filled in as requests arrive
        self.inboxes = [UserInbox(self) for _ in schedulers]
        signals.bind(self.inboxes)
        router.attach(signals)
        self._due: list[tuple[float, int]] = []  # (arrival time, user), one per pending timeout
        self._arrived = 0
        for user, delay in enumerate(users.start_s.tolist()):
            self._step_out(user, delay)

    @property
    def done(self) -> bool:
        return self._arrived == len(self.req)

    def next_time(self) -> float:
        return self._due[0][0] if self._due and not self.done else np.inf

    def finished(self, rids) -> None:
        """These requests have just finished: their users think, then send the next."""
        left, pending = self.left, self._pending
        for rid in rids:
            user = int(self.user[rid])
            if pending is not None:  # fan-out: the step goes on until its last call has answered
                pending[user] -= 1
                if pending[user] > 0:
                    continue
                self._step[user] += 1
            if left is None or left[user] > 0:
                self._step_out(user, float(self.think[rid]))

    def _step_out(self, user: int, delay: float) -> None:
        """The user's next step: one request, or with fan-out all the step's calls at once."""
        if self.fan is None:
            self._send(user, delay)
            return
        calls = int(self.fan[self._step[user]])
        self._pending[user] = calls
        for _ in range(calls):
            self._send(user, delay)

    def _send(self, user: int, delay: float) -> None:
        heapq.heappush(self._due, (self.env.now + delay, user))  # the time SimPy schedules it at
        self.env.timeout(delay).callbacks.append(self._arrive)

    def _arrive(self, _event) -> None:
        t, user = heapq.heappop(self._due)  # == now; same-instant arrivals in user order
        if self.done:
            return  # num_requests reached: this request is never sent
        rid, self._arrived = self._arrived, self._arrived + 1
        self.req.arrival[rid], self.user[rid] = t, user
        if self.left is not None:
            self.left[user] -= 1
        if self.sessions is not None:  # before routing: prefix_aware reads the grown prompt's blocks
            self.sessions.begin(rid, user)
        target = self.router.choose(rid, _seen_loads(self.signals, self.schedulers, self.inboxes))
        self.req.replica[rid] = target
        self.inboxes[target].deliver(rid, t)


class Gate:
    """engine.admission.max_in_flight: at most `limit` requests past the gateway and not finished
    (on any replica, waiting or running); an arrival beyond that waits at the gateway, in arrival
    order (or, given `priority`, the most urgent first: lower, then earlier), and passes when a
    request finishes; one that has waited more than `max_wait_s` when its turn comes is turned
    away. `released[rid]`: when request rid passed (NaN: turned away). Each arrival is routed as it
    passes, by `router.choose`; plays the closed loop's part for the replicas' inboxes
    (sim/runtime/cluster.UserInbox): told of every finish."""

    def __init__(self, env, router: Router, arrival: np.ndarray, schedulers: list, replica_of: np.ndarray,
                 signals: Signals, limit: int, max_wait_s: float | None, priority: np.ndarray | None = None):
        self.env, self.router, self.arrival, self.schedulers = env, router, arrival, schedulers
        self.replica_of, self.limit = replica_of, limit
        self.max_wait = inf if max_wait_s is None else max_wait_s
        self.inboxes = [UserInbox(self) for _ in schedulers]
        self.signals = signals
        signals.bind(self.inboxes)
        router.attach(signals)
        self.released = np.full(len(arrival), np.nan)
        self.queue: deque[int] = deque()  # arrived, waiting at the gateway (in arrival order)
        # queue_order priority: the waiting as a heap of (priority, request id); None: `queue`
        self.priority = priority
        self.urgent: list[tuple[int, int]] = []
        self.in_flight = 0
        self._next = 0      # the next arrival
        self._handled = 0   # passed or turned away
        env.process(self.run())

    @property
    def done(self) -> bool:
        return self._handled == len(self.arrival)

    def next_time(self) -> float:
        return self.arrival[self._next] if self._next < len(self.arrival) else inf

    def run(self):
        env = self.env
        while self._next < len(self.arrival):
            t = self.arrival[self._next]
            if t > env.now:
                yield env.timeout(t - env.now)
            if self.priority is None:
                self.queue.append(self._next)
            else:
                heapq.heappush(self.urgent, (int(self.priority[self._next]), self._next))
            self._next += 1
            self._release()

    def finished(self, rids) -> None:
        self.in_flight -= len(rids)
        self._release()

    def _release(self) -> None:
        now = self.env.now
        while (self.queue or self.urgent) and self.in_flight < self.limit:
            rid = self.queue.popleft() if self.priority is None else heapq.heappop(self.urgent)[1]
            self._handled += 1
            if now - self.arrival[rid] > self.max_wait:
                continue  # the client gave up: turned away
            self.in_flight += 1
            self.released[rid] = now
            target = self.router.choose(rid, _seen_loads(self.signals, self.schedulers, self.inboxes))
            self.replica_of[rid] = target
            self.inboxes[target].deliver(rid, now)


class UserInbox(Inbox):
    """A replica's inbox in a closed loop: it also reports its requests' completions to the users,
    wakes an idle replica in the SCHEDULE phase, and cuts a running decode run for a new arrival."""

    cuts_runs = True

    def __init__(self, router: ClosedSource):
        super().__init__([], [], router=router)
        self._users = router  # (self._router, never None here)

    def deliver(self, rid: int, now: float) -> None:
        self._push(rid, now)
        if self._wakeup is not None and not self._wakeup.triggered:
            fire(self._wakeup, 0.0, SCHEDULE)
        elif self.reader is not None:
            self.reader.cut(now)

    def settle(self, env, outcome):
        if outcome.finished:  # in request id order, which is arrival order
            self._users.finished(sorted(outcome.finished))
        return phase_timeout(env, 0.0, SCHEDULE)

    def wait(self, env, retry_at: float):
        if self._users.done and retry_at == np.inf:
            return None
        self._wakeup = wake = env.event()
        if retry_at < np.inf:
            phase_timeout(env, retry_at - env.now, SCHEDULE).callbacks.append(
                lambda _: None if wake.triggered else fire(wake, 0.0, SCHEDULE))
        return wake


def make_inboxes(router: Router, env, arrival: np.ndarray, schedulers: list,
                 replica_of: np.ndarray, signals: Signals | None = None,
                 staleness_s: float = 0.0) -> list[Inbox]:
    """Open-loop inboxes: planned up front when the rule allows it (or there is one replica);
    else routed live, reading `signals` (None: exact ones), scraped every `staleness_s` if > 0."""
    plan = router.plan(len(arrival)) if len(schedulers) > 1 else np.zeros(len(arrival), np.int64)
    if plan is None:
        live = LiveRouter(env, router, arrival, schedulers, replica_of,
                          signals if signals is not None else Signals(schedulers))
        if staleness_s > 0:
            Scraper(env, live.signals, staleness_s, live, always_known=True)
        return live.inboxes
    replica_of[:] = plan
    return [Inbox(_packed(arrival[plan == r], "d"), _packed(np.flatnonzero(plan == r), "q"))
            for r in range(len(schedulers))]


def _packed(values: np.ndarray, code: str) -> array:
    """An array.array of `values`: indexed and sliced like a list (Python floats and ints come
    out), at 8 bytes an item where a list of floats takes 32 (a million-request run: 50 MB less)."""
    return array(code, np.ascontiguousarray(values, dtype=np.float64 if code == "d" else np.int64).tobytes())
