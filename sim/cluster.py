"""Replicas behind a router. Each replica reads its arrivals from an `Inbox`.

round_robin routing does not depend on the replicas' state, so it is decided up front and each
inbox is a sorted list the replica reads by itself: no SimPy event per request. least_loaded routes
each request, at its arrival time, to the replica with the fewest requests waiting or running (ties
to the lowest index), so a router process delivers them one by one.

A closed loop (`ClosedLoopRouter`) learns each arrival time only when the same user's previous
request finishes, so it routes live with either rule, and orders every instant in three phases:
iterations end and report finished requests (URGENT), arrivals are routed (NORMAL), replicas
schedule (LATE). An arrival that could join a replica's fast-forwarded decode run cuts the run at
its first iteration boundary at or after the arrival (`Replica.cut`).
"""
from __future__ import annotations

import heapq
from bisect import bisect_right

import numpy as np
import simpy

from .errors import ScenarioError
from .request import RequestTable
from .workload import Users

LATE = simpy.core.NORMAL + 1  # after every arrival routed at the same instant


class Inbox:
    """Requests routed to one replica, in arrival order; `arrived(now)` hands over new ones."""

    cuts_runs = False  # may a delivery cut its reader's decode run (Replica.cut)?

    def __init__(self, times: list[float], rids: list[int], router: "LeastLoadedRouter | None" = None):
        self._times, self._rids = times, rids
        self._next = 0          # first request not yet handed to the scheduler
        self._router = router   # None: every request is already here
        self._wakeup = None     # event an idle replica waits on while the router may still deliver
        self.reader = None      # the Replica reading this inbox (it sets itself)

    @property
    def routed_live(self) -> bool:
        """Do requests arrive through a router process (rather than all known up front)?"""
        return self._router is not None

    def arrived(self, now: float) -> list[int]:
        end = bisect_right(self._times, now, self._next)
        new = self._rids[self._next:end]
        self._next = end
        return new

    def pending(self) -> int:
        return len(self._rids) - self._next

    def next_arrival(self) -> float:
        """Earliest time a request may reach this replica (inf: none will)."""
        mine = self._times[self._next] if self._next < len(self._times) else np.inf
        return min(mine, self._router.next_time()) if self._router else mine

    def deliver(self, rid: int, now: float) -> None:
        self._times.append(now)
        self._rids.append(rid)
        if self._wakeup is not None and not self._wakeup.triggered:
            self._wakeup.succeed()

    def settle(self, env):
        """What a replica waits on after an iteration before it schedules again (live routing only):
        the router's arrivals at this instant come first."""
        return env.timeout(0)

    def wait(self, env, retry_at: float):
        """An event for an idle replica: the next arrival or `retry_at`; None if neither comes."""
        if self._router is None or self._next < len(self._times):
            wake = min(self.next_arrival(), retry_at)
            return None if wake == np.inf else env.timeout(wake - env.now)
        if self._router.done and retry_at == np.inf:
            return None
        self._wakeup = env.event()
        if retry_at == np.inf:
            return self._wakeup
        return env.any_of([self._wakeup, env.timeout(retry_at - env.now)])


class LeastLoadedRouter:
    def __init__(self, env, arrival: np.ndarray, schedulers: list, replica_of: np.ndarray):
        self.env, self.arrival, self.schedulers = env, arrival, schedulers
        self.replica_of = replica_of  # written as requests are routed
        self.inboxes = [Inbox([], [], router=self) for _ in schedulers]
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
            loads = [s.load() + box.pending() for s, box in zip(self.schedulers, self.inboxes)]
            target = int(np.argmin(loads))
            self.replica_of[rid] = target
            self._next += 1
            self.done = self._next == len(self.arrival)
            self.inboxes[target].deliver(rid, env.now)


class ClosedLoopRouter:
    """`users` users, each with at most one request in flight: when a request finishes, its user
    sends the next one after its think time. Request ids (and the lengths drawn for them) go in
    arrival order, ties by user; once `len(req)` requests have arrived, users send no more.
    round_robin sends the i-th arrival to replica i % R, least_loaded as LeastLoadedRouter."""

    def __init__(self, env, req: RequestTable, users: Users, schedulers: list, router: str):
        self.env, self.req, self.schedulers = env, req, schedulers
        self.think = users.think_s
        self.user = np.full(len(req), -1, dtype=np.int64)  # who sent each request
        req.arrival = np.full(len(req), np.nan)  # filled in as requests arrive
        self.least_loaded = router == "least_loaded"
        self.inboxes = [UserInbox(self) for _ in schedulers]
        self._due: list[tuple[float, int]] = []  # (arrival time, user), one per pending timeout
        self._arrived = 0
        for user, delay in enumerate(users.start_s.tolist()):
            self._send(user, delay)

    @property
    def done(self) -> bool:
        return self._arrived == len(self.req)

    def next_time(self) -> float:
        return self._due[0][0] if self._due and not self.done else np.inf

    def finished(self, rids: np.ndarray) -> None:
        """These requests have just finished: their users think, then send the next."""
        for rid in rids.tolist():
            self._send(int(self.user[rid]), float(self.think[rid]))

    def _send(self, user: int, delay: float) -> None:
        heapq.heappush(self._due, (self.env.now + delay, user))  # the time SimPy schedules it at
        self.env.timeout(delay).callbacks.append(self._arrive)

    def _arrive(self, _event) -> None:
        t, user = heapq.heappop(self._due)  # == now; same-instant arrivals in user order
        if self.done:
            return  # num_requests reached: this request is never sent
        rid, self._arrived = self._arrived, self._arrived + 1
        self.req.arrival[rid], self.user[rid] = t, user
        if self.least_loaded:
            target = int(np.argmin([s.load() + box.pending()
                                    for s, box in zip(self.schedulers, self.inboxes)]))
        else:
            target = rid % len(self.inboxes)
        self.req.replica[rid] = target
        self.inboxes[target].deliver(rid, t)


class UserInbox(Inbox):
    """A replica's inbox in a closed loop: it also reports its requests' completions to the users,
    wakes an idle replica in the LATE phase, and cuts a running decode run for a new arrival."""

    cuts_runs = True

    def __init__(self, router: ClosedLoopRouter):
        super().__init__([], [], router=router)
        self._live = np.zeros(0, dtype=np.int64)  # handed to the scheduler and not finished

    def arrived(self, now: float) -> list[int]:
        new = super().arrived(now)
        if new:
            self._live = np.concatenate((self._live, new))
        return new

    def deliver(self, rid: int, now: float) -> None:
        self._times.append(now)
        self._rids.append(rid)
        if self._wakeup is not None and not self._wakeup.triggered:
            _fire(self._wakeup, 0.0)
        elif self.reader is not None:
            self.reader.cut(now)

    def settle(self, env):
        finished = ~np.isnan(self._router.req.finish[self._live])
        if finished.any():
            self._router.finished(self._live[finished])
            self._live = self._live[~finished]
        return _fire(env.event(), 0.0)

    def wait(self, env, retry_at: float):
        if self._router.done and retry_at == np.inf:
            return None
        self._wakeup = wake = env.event()
        if retry_at < np.inf:
            _fire(env.event(), retry_at - env.now).callbacks.append(
                lambda _: None if wake.triggered else _fire(wake, 0.0))
        return wake


def _fire(event, delay: float):
    """Trigger `event` after `delay` in the LATE phase of that instant."""
    event._ok, event._value = True, None  # what Event.succeed sets; only the priority differs
    event.env.schedule(event, LATE, delay)
    return event


def round_robin_inboxes(arrival: np.ndarray, num_replicas: int, replica_of: np.ndarray) -> list[Inbox]:
    replica_of[:] = np.arange(len(arrival)) % num_replicas
    return [Inbox(arrival[r::num_replicas].tolist(), list(range(r, len(arrival), num_replicas)))
            for r in range(num_replicas)]


ROUTERS = ("round_robin", "least_loaded")


def make_inboxes(router: str, env, arrival: np.ndarray, schedulers: list, replica_of: np.ndarray):
    if router == "round_robin" or len(schedulers) == 1:
        return round_robin_inboxes(arrival, len(schedulers), replica_of)
    if router == "least_loaded":
        return LeastLoadedRouter(env, arrival, schedulers, replica_of).inboxes
    raise ScenarioError(f"engine.router: {router!r} is not one of {', '.join(ROUTERS)}")
