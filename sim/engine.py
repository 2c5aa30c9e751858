"""One engine replica as a SimPy process: ask the scheduler, price, wait, apply, record.

Timing semantics: an idle replica starts an iteration the moment a request arrives; a busy one
admits arrivals at its next iteration boundary, and everything that has arrived by then (same
instant included) is visible to the scheduler. How long iterations take, how runs of identical
decode iterations are fast-forwarded and cut, and the order of same-instant events live in
sim/fast_forward.py.
"""
from __future__ import annotations

from typing import Callable

from .cost import CostModel
from .fast_forward import Runner
from .recorder import Recorder
from .schedulers import Scheduler


class Replica:
    def __init__(self, env, index: int, scheduler: Scheduler, cost: CostModel, recorder: Recorder,
                 inbox, fast_forward: bool = True, on_iteration: Callable[[], None] | None = None):
        self.env, self.index = env, index
        self.scheduler, self.recorder, self.inbox = scheduler, recorder, inbox
        self.on_iteration = on_iteration
        self.runner = Runner(env, cost, inbox, fast_forward)
        inbox.reader = self.runner  # a closed loop's arrival may cut the run in progress
        self.process = env.process(self.run())

    def run(self):
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
