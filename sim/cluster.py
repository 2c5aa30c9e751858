"""Replicas behind a router. Each replica reads its arrivals from an `Inbox`.

round_robin routing does not depend on the replicas' state, so it is decided up front and each
inbox is a sorted list the replica reads by itself: no SimPy event per request. least_loaded routes
each request, at its arrival time, to the replica with the fewest requests waiting or running (ties
to the lowest index), so a router process delivers them one by one.
"""
from __future__ import annotations

from bisect import bisect_right

import numpy as np

from .errors import ScenarioError


class Inbox:
    """Requests routed to one replica, in arrival order; `arrived(now)` hands over new ones."""

    def __init__(self, times: list[float], rids: list[int], router: "LeastLoadedRouter | None" = None):
        self._times, self._rids = times, rids
        self._next = 0          # first request not yet handed to the scheduler
        self._router = router   # None: every request is already here
        self._wakeup = None     # event an idle replica waits on while the router may still deliver

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
