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

    def run(self) -> Generator[Any, Any, None]:
        env, scheduler, inbox = self.env, self.scheduler, self.inbox
        while True:
            for rid in inbox.arrived(env.now):
                scheduler.add(rid)
            schedule = scheduler.schedule(env.now)
            if schedule is None:
                wake = inbox.wait(env, scheduler.retry_at)
                if wake is None:
                    return  # nothing will ever arrive and nothing is left to do
                yield wake
                continue
            start = env.now
            durations, seconds = yield self.runner.start(schedule)
            outcome = scheduler.update(schedule, len(durations), env.now)
            self.recorder.record(self.index, start, durations, seconds, schedule, outcome)
            if self.on_iteration is not None:
                self.on_iteration()
            settle = inbox.settle(env, outcome)
            if settle is not None:
                yield settle  # live routing: the router's arrivals at this instant come first

    def run_alone(self) -> Generator[Any, Any, None]:
        """`run` with nothing else in the environment: between two of its iterations nothing can
        happen that the replica does not do itself, so the loop keeps the clock, with SimPy's
        arithmetic (an event `delay` from now fires at now + delay), and yields once at the end.
        The same records as `run`, to the bit (tests/test_sim_engine.py); ~3 µs less an event."""
        env, scheduler, inbox, runner = self.env, self.scheduler, self.inbox, self.runner
        recorder, on_iteration, index = self.recorder, self.on_iteration, self.index
        now: float = env.now
        while True:
            for rid in inbox.arrived(now):
                scheduler.add(rid)
            schedule = scheduler.schedule(now)
            if schedule is None:
                wake = inbox.wake_at(scheduler.retry_at)
                if wake == inf:
                    break  # nothing will ever arrive and nothing is left to do
                now += wake - now  # (where env.timeout(wake - now) fires, as `run` waits)
                continue
            durations, seconds = runner.price(schedule, now)
            start, now = now, now + seconds
            outcome = scheduler.update(schedule, len(durations), now)
            recorder.record(index, start, durations, seconds, schedule, outcome)
            if on_iteration is not None:
                on_iteration()
        yield env.timeout(now - env.now)  # the environment's clock ends where the replica's did
