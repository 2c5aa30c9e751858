"""One engine replica as a SimPy process: ask the scheduler, price, wait, apply, record.

Timing semantics: an idle replica starts an iteration the moment a request arrives; a busy one
admits arrivals at its next iteration boundary, and everything that has arrived by then (same
instant included) is visible to the scheduler. How long iterations take, how runs of identical
decode iterations are fast-forwarded and cut, and the order of same-instant events live in
sim/runtime/fast_forward.py.

A replica that is the only process of its environment (one replica, every arrival known up front)
runs `run_alone`: the same step, with the clock kept by the loop instead of a SimPy event per
iteration, since nothing else could happen between its iterations.
"""
from __future__ import annotations

from collections.abc import Callable, Generator
from math import inf
from typing import Any

from mypy_extensions import mypyc_attr

from sim.cost.step_cost import CostModel
from sim.runtime.cluster import Inbox
from sim.runtime.fast_forward import Runner
from sim.runtime.recorder import Recorder
from sim.schedulers import Scheduler
from sim.schedulers.step import Schedule, StepOutcome


@mypyc_attr(allow_interpreted_subclasses=True)  # (compiled: setup.py)
class Replica:
    def __init__(self, env, index: int, scheduler: Scheduler, cost: CostModel, recorder: Recorder,
                 inbox: Inbox, fast_forward: bool = True, on_iteration: Callable[[], None] | None = None,
                 alone: bool = False):
        """`alone`: no other process shares `env` (the caller knows); with every arrival in
        `inbox` up front the replica then runs `run_alone`."""
        self.env, self.index = env, index
        self.scheduler, self.recorder, self.inbox = scheduler, recorder, inbox
        self.on_iteration = on_iteration
        self.runner = Runner(env, cost, inbox, fast_forward)
        inbox.reader = self.runner  # a closed loop's arrival may cut the run in progress
        self.process = env.process(self.run_alone() if alone and not inbox.routed_live else self.run())

    # -- one step: ask the scheduler, (price and wait: the clock's part), apply and record ------
    def _ask(self, now: float) -> Schedule | None:
        """Arrivals by `now` join the waiting queue; the next iteration's schedule (None: idle)."""
        scheduler = self.scheduler
        for rid in self.inbox.arrived(now):
            scheduler.add(rid)
        return scheduler.schedule(now)

    def _apply(self, schedule: Schedule, start: float, durations: list[float], seconds: float,
               now: float) -> StepOutcome:
        """The iterations of `schedule` that ran from `start` to `now`, applied and recorded."""
        outcome = self.scheduler.update(schedule, len(durations), now)
        self.recorder.record(self.index, start, durations, seconds, schedule, outcome)
        if self.on_iteration is not None:
            self.on_iteration()
        return outcome

    # -- two clocks for that step ----------------------------------------------------------------
    def run(self) -> Generator[Any, Any, None]:
        """The step on SimPy's clock: an event per iteration (or run of iterations)."""
        env, inbox = self.env, self.inbox
        while True:
            schedule = self._ask(env.now)
            if schedule is None:
                wake = inbox.wait(env, self.scheduler.retry_at)
                if wake is None:
                    return  # nothing will ever arrive and nothing is left to do
                yield wake
                continue
            start = env.now
            durations, seconds = yield self.runner.start(schedule)
            outcome = self._apply(schedule, start, durations, seconds, env.now)
            settle = inbox.settle(env, outcome)
            if settle is not None:
                yield settle  # live routing: the router's arrivals at this instant come first

    def run_alone(self) -> Generator[Any, Any, None]:
        """The step on the replica's own clock, with nothing else in the environment: between two
        of its iterations nothing can happen that the replica does not do itself, so the loop
        keeps the clock, with SimPy's arithmetic (an event `delay` from now fires at now + delay),
        and yields once at the end. The same records as `run`, to the bit
        (tests/runtime/test_sim_engine.py); ~3 µs less an event."""
        env, inbox, runner = self.env, self.inbox, self.runner
        now: float = env.now
        while True:
            schedule = self._ask(now)
            if schedule is None:
                wake = inbox.wake_at(self.scheduler.retry_at)
                if wake == inf:
                    break  # nothing will ever arrive and nothing is left to do
                now += wake - now  # (where env.timeout(wake - now) fires, as `run` waits)
                continue
            durations, seconds = runner.price(schedule, now)
            start, now = now, now + seconds
            self._apply(schedule, start, durations, seconds, now)
        yield env.timeout(now - env.now)  # the environment's clock ends where the replica's did
