"""One engine replica as a SimPy process: one timeout per iteration, or per run of identical decode
iterations (fast-forward).

    batch = scheduler.schedule(now)             # what the iteration computes
    times = cost.step_times(batch.stats, n)     # how long it (and up to n - 1 identical ones) take
    yield env.timeout(sum of the iterations run)
    scheduler.update(batch, steps, now)         # tokens sampled, requests finished

Timing semantics: an idle replica starts an iteration the moment a request arrives; a busy one
admits arrivals at its next iteration boundary, and everything that has arrived by then (same
instant included) is visible to the scheduler.

Fast-forward: between arrivals, admissions, completions and KV-block shortages a decode batch keeps
its shape, so the scheduler says how many iterations it may repeat (`batch.max_steps`) and the
engine runs them as one timeout, cut at the first iteration boundary at or after the next arrival
when an arrival could change the batch. Results equal stepping one iteration at a time. In a
closed loop an arrival can be created during a run (another replica's request finished): the inbox
then calls `cut`, which ends the run at the first boundary at or after that arrival instead.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import simpy

from .cost import CostModel
from .recorder import Recorder
from .schedulers import Scheduler

_PROBE_STEPS = 32  # iterations priced before looking for the next arrival in a run
_URGENT = simpy.core.URGENT  # event priority: before same-instant NORMAL events


class Replica:
    def __init__(self, env, index: int, scheduler: Scheduler, cost: CostModel, recorder: Recorder,
                 inbox, fast_forward: bool = True, on_iteration: Callable[[], None] | None = None):
        self.env, self.index = env, index
        self.scheduler, self.cost, self.recorder, self.inbox = scheduler, cost, recorder, inbox
        self.fast_forward = fast_forward
        self.on_iteration = on_iteration
        self._run = None  # (start, durations) of a decode run that an arrival may cut
        inbox.reader = self
        self.process = env.process(self.run())

    def run(self):
        env, scheduler, inbox, recorder = self.env, self.scheduler, self.inbox, self.recorder
        routed_live, cuts_runs = inbox.routed_live, inbox.cuts_runs  # fixed for the inbox's life
        while True:
            for rid in inbox.arrived(env.now):
                scheduler.add(rid)
            batch = scheduler.schedule(env.now) if scheduler.has_work() else None
            if batch is None:
                wake = inbox.wait(env, scheduler.retry_at)
                if wake is None:
                    return  # nothing will ever arrive and nothing is left to do
                yield wake
                continue
            start = env.now
            durations = self._durations(batch, start)
            steps, total = len(durations), _total(durations)
            end = self._iteration_end(total)
            if steps > 1 and batch.arrival_sensitive and cuts_runs:
                ran = yield from self._cuttable(end, start, durations)
                if len(ran) < steps:
                    durations, steps, total = ran, len(ran), _total(ran)
            else:
                yield end
            scheduler.update(batch, steps, env.now)
            recorder.record(self.index, start, durations, batch, total)
            if self.on_iteration is not None:
                self.on_iteration()
            if routed_live:
                yield inbox.settle(env)  # let the router place arrivals at this instant first

    def cut(self, t: float) -> None:
        """A request arriving at `t` (now) could join the decode run in progress: end the run at
        its first iteration boundary at or after `t`, if that comes before the run's end."""
        if self._run is None:
            return
        start, durations = self._run
        if int(np.searchsorted(start + np.cumsum(durations), t, "left")) < len(durations) - 1:
            self._run = None
            self.process.interrupt()

    def _cuttable(self, end, start: float, durations: np.ndarray):
        """Wait for a run's `end`; if `cut` interrupts, for its new end. Returns the iterations run."""
        self._run = (start, durations)
        try:
            yield end
        except simpy.Interrupt:
            ends = start + np.cumsum(durations)
            steps = int(np.searchsorted(ends, self.env.now, "left")) + 1
            durations = durations[:steps]
            yield self._iteration_end(max(float(ends[steps - 1]) - self.env.now, 0.0))
        self._run = None
        return durations

    def _iteration_end(self, delay: float):
        """A timeout that fires before same-instant NORMAL events (a router's arrivals), so that at
        every instant iterations end first, then arrivals are routed, then replicas schedule."""
        event = simpy.Event(self.env)
        event._ok, event._value = True, None  # what simpy.Timeout sets; only the priority differs
        self.env.schedule(event, _URGENT, delay)
        return event

    def _durations(self, batch, start: float) -> np.ndarray:
        """Durations of the iterations to run now: one, or a run of up to batch.max_steps that ends
        with the first iteration ending at or after the next arrival (if that could matter)."""
        steps = batch.max_steps if self.fast_forward else 1
        if steps == 1 or not batch.arrival_sensitive:
            return self.cost.step_times(batch.stats, steps)
        arrival = self.inbox.next_arrival()
        probe = min(steps, _PROBE_STEPS)  # an arrival usually cuts a run long before it ends
        durations = self.cost.step_times(batch.stats, probe)
        ends = start + durations.cumsum()
        if ends[-1] < arrival and probe < steps:
            durations = self.cost.step_times(batch.stats, steps)
            ends = start + durations.cumsum()
        return durations[: int(ends.searchsorted(arrival, "left")) + 1]


def _total(durations: np.ndarray) -> float:
    """Seconds the iterations take together (numpy's sum for a run, as the recorder stores it)."""
    return float(durations.sum()) if len(durations) > 1 else float(durations[0])
