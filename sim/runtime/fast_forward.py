"""Time in the simulation: how long the iterations a replica runs now take (a run of identical
decode iterations priced at once, cut at the next arrival that could change it), and the order of
events that fall on the same instant. This is the one module that chooses SimPy priorities.

Phases of an instant, in order:
    ITERATION_END  iterations end; their requests finish and free their KV blocks
    (NORMAL)       the router places the requests arriving now (SimPy's default priority)
    SCHEDULE       idle replicas wake and schedule (closed loops; open-loop inboxes need no phase)

Fast-forward: between arrivals, admissions, completions and KV-block shortages a decode batch keeps
its shape, so the scheduler says how many iterations it may repeat (`schedule.max_steps`) and
`Runner.start` gives the end of them as one event, cut at the first iteration boundary at or after the next
arrival when an arrival could change the batch. Results equal stepping one iteration at a time (a
property test). In a closed loop an arrival can be created during a run (another replica's request
finished): the inbox then calls `cut`, which ends the run at the first boundary at or after it.
"""
from __future__ import annotations

import numpy as np
import simpy

from sim.cost.step_cost import CostModel, as_cost_model
from sim.schedulers.step import Schedule

ITERATION_END = simpy.core.URGENT
SCHEDULE = simpy.core.NORMAL + 1

_PROBE_STEPS = 32  # iterations priced before looking for the next arrival in a run


def fire(event: simpy.Event, delay: float, phase: int, value=None) -> simpy.Event:
    """Trigger the pending `event` (with `value`) `delay` seconds from now, in `phase` of that
    instant.

    What `Event.succeed(value)` does, at a chosen delay and priority: SimPy's public
    `Environment.schedule(event, priority, delay)` takes both, but only `succeed` (NORMAL, now) and
    `Timeout` (NORMAL) mark an event triggered, so the two fields they set are set here, as SimPy's
    own event types do. The only place in servesim that touches them (with phase_timeout below)."""
    event._ok, event._value = True, value
    event.env.schedule(event, phase, delay)
    return event


def phase_timeout(env: simpy.Environment, delay: float, phase: int, value=None) -> simpy.Event:
    """`env.timeout(delay, value)` in a chosen phase of its instant (SimPy's Timeout is always
    NORMAL); `fire` on a new event, inlined: one of these per iteration."""
    event = simpy.Event(env)
    event._ok, event._value = True, value
    env.schedule(event, phase, delay)
    return event


class Runner:
    """Prices one replica's iterations and gives the event their end. `inbox.next_arrival()` bounds
    runs; `cut` shortens a run that a closed loop's new arrival could join."""

    def __init__(self, env: simpy.Environment, cost: CostModel, inbox, fast_forward: bool = True):
        self.env, self.cost, self.inbox = env, as_cost_model(cost), inbox
        self.fast_forward = fast_forward
        # the run in progress that `cut` may shorten: (start, durations, event, timer), else None
        self._run: tuple | None = None

    def price(self, schedule: Schedule, start: float) -> tuple[list[float], float]:
        """The iterations of `schedule` that run from `start`, uncut: (their durations, s, the
        seconds they take together). For a replica that runs alone (engine.Replica.run_alone)."""
        return self._durations(schedule, start)

    def start(self, schedule: Schedule) -> simpy.Event:
        """An event for the end of the iterations of `schedule` that run now; its value is
        (their durations, the seconds they take together)."""
        start = self.env.now
        durations, seconds = self._durations(schedule, start)
        if len(durations) == 1 or not schedule.arrival_sensitive or not self.inbox.cuts_runs:
            return phase_timeout(self.env, seconds, ITERATION_END, (durations, seconds))
        done = simpy.Event(self.env)  # fired by `_end`, at the run's end or at a cut's
        timer = phase_timeout(self.env, seconds, ITERATION_END)
        timer.callbacks.append(self._end)
        self._run = (start, durations, done, timer)
        return done

    def cut(self, t: float) -> None:
        """A request arriving at `t` (now) could join the decode run in progress: end the run at
        its first iteration boundary at or after `t`, if that comes before the run's end."""
        if self._run is None:
            return
        start, durations, done, _ = self._run
        ends = start + np.cumsum(durations)
        steps = int(np.searchsorted(ends, t, "left")) + 1
        if steps < len(durations):
            durations = durations[:steps]
            timer = phase_timeout(self.env, max(float(ends[steps - 1]) - t, 0.0), ITERATION_END)
            timer.callbacks.append(self._end)  # the run's first timer is now stale
            self._run = (start, durations, done, timer)

    def _end(self, timer: simpy.Event) -> None:
        run = self._run
        if run is None or timer is not run[3]:
            return  # a stale timer: the run was cut
        self._run = None
        _, durations, done, _ = run
        fire(done, 0.0, ITERATION_END, (durations, total(durations)))

    def _durations(self, schedule: Schedule, start: float) -> tuple[list[float], float]:
        """Durations of the iterations to run now (s, as floats: the recorder and the scheduler
        read them one at a time), and their total: one, or a run of up to schedule.max_steps that
        ends with the first iteration ending at or after the next arrival (if that could matter)."""
        steps = schedule.max_steps if self.fast_forward else 1
        if steps == 1:  # (no array for one iteration)
            one: float = self.cost.step_time(schedule.stats)
            return [one], one
        if not schedule.arrival_sensitive:
            return listed(self.cost.step_times(schedule.stats, steps))
        arrival: float = self.inbox.next_arrival()
        probe = min(steps, _PROBE_STEPS)  # an arrival usually cuts a run long before it ends
        line = self.cost.decode_line(schedule.stats)
        if line is not None:  # walk the probe in Python: the same floats, a few µs less a run
            a: float
            b: float
            c: int
            n: int
            scale: float
            a, b, c, n, scale = line  # (typed: compiled, the walk below is C arithmetic on doubles)
            walked: list[float] = []
            acc, cut = 0.0, False
            for j in range(probe):
                d = (a + b * (c + n * j)) * scale  # (x 1.0 changes no float)
                walked.append(d)
                acc += d  # (numpy's cumsum: a left fold)
                if start + acc >= arrival:
                    cut = True
                    break
            if cut or probe == steps:  # (else no arrival in the probe: the whole run, below)
                # numpy sums fewer than 8 floats left to right, as acc; more pairwise (total)
                return walked, acc if len(walked) < 8 else total(walked)
        else:
            priced = self.cost.decode_times(schedule.stats, probe)
            if priced is not None:  # the same floats step_times gives, walked the same way
                times: list[float] = priced
                walked = []
                acc, cut = 0.0, False
                for d in times:
                    walked.append(d)
                    acc += d
                    if start + acc >= arrival:
                        cut = True
                        break
                if cut or probe == steps:
                    return walked, acc if len(walked) < 8 else total(walked)
        durations = self.cost.step_times(schedule.stats, probe)
        ends = durations.cumsum()
        ends += start  # (in place: the same sums as start + cumsum, one array less)
        if ends[-1] < arrival and probe < steps:
            durations = self.cost.step_times(schedule.stats, steps)
            ends = durations.cumsum()
            ends += start
        return listed(durations[: int(ends.searchsorted(arrival, "left")) + 1])


_sum = np.add.reduce  # what ndarray.sum calls, without its Python wrapper (the same floats)


def listed(durations: np.ndarray) -> tuple[list[float], float]:
    """A cost model's durations as floats, and numpy's sum of them (what `total` gives)."""
    return durations.tolist(), float(_sum(durations)) if len(durations) > 1 else float(durations[0])


def total(durations: list[float]) -> float:
    """Seconds the iterations take together: numpy's float64 sum (np.add.reduce) of them, to the
    bit, without an array. numpy adds pairwise: fewer than 8 values left to right, up to 128 in
    8 interleaved partial sums, more as the sum of two halves (the first a multiple of 8 long);
    tests/runtime/test_sim_engine.py holds it to numpy on random runs."""
    return durations[0] if len(durations) == 1 else _pairwise(durations, 0, len(durations))


def _pairwise(a: list[float], lo: int, n: int) -> float:
    if n < 8:
        res = -0.0  # (numpy's start: a sum of -0.0s stays -0.0)
        for i in range(lo, lo + n):
            res += a[i]
        return res
    if n <= 128:
        r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
        r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
        i, whole = lo + 8, lo + n - n % 8
        while i < whole:
            r0 += a[i]
            r1 += a[i + 1]
            r2 += a[i + 2]
            r3 += a[i + 3]
            r4 += a[i + 4]
            r5 += a[i + 5]
            r6 += a[i + 6]
            r7 += a[i + 7]
            i += 8
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        while i < lo + n:
            res += a[i]
            i += 1
        return res
    half = n // 2
    half -= half % 8
    return _pairwise(a, lo, half) + _pairwise(a, lo + half, n - half)
