"""Schedulers: which requests compute which tokens in the next engine iteration.

The contract, in one breath (sim/schedulers/step.py): the engine calls `add(rid)` when a request arrives,
`schedule(now)` for the next iteration's frozen `Schedule` (None: nothing to run until an arrival
or `retry_at`), and, once the cost model's time has passed, `update(schedule, steps, now)`, which
applies what the iteration computed and returns a `StepOutcome`. A scheduler owns its waiting and
running queues and its KV cache; it never knows what an iteration costs.

Adding a scheduler = one file + one line in `SCHEDULERS`: config validation, the CLI's help, the
real engine and the planner read names and per-scheduler facts (the class attributes of the
Protocol below) from here, never by comparing names.

sim/build.py sets one replica's scheduler up from a scenario's engine config, for the simulator and
the real engine (calibrate/engine.py) alike. Nothing here imports simpy, a scenario or a cost model.
"""
from __future__ import annotations

from typing import Any, ClassVar, Protocol

from sim.schedulers.chunked import ChunkedScheduler
from sim.schedulers.continuous import ContinuousScheduler
from sim.schedulers.static import StaticScheduler
from sim.schedulers.step import Schedule, StepOutcome


class Scheduler(Protocol):
    kv_cache: ClassVar[Any]       # its KV memory's class: PagedKVCache or ContiguousKVCache (sim/kv/cache.py)
    token_budget: ClassVar[bool]  # does max_num_batched_tokens limit each iteration?
    chunks_prompts: ClassVar[bool]  # may a prompt be split over iterations (else whole or nothing)?
    iteration_level: ClassVar[bool]  # do requests join and leave at every iteration (vLLM's kind)?
    prefix_caching: ClassVar[bool]   # can it run over a prefix-caching KV cache?
    retry_at: float  # when schedule() may return work without a new arrival (inf: only on arrival)

    def add(self, rid: int) -> None:
        """A request has arrived: put it in the waiting queue."""

    def schedule(self, now: float) -> Schedule | None:
        """What the next iteration computes, or None if there is nothing to run now."""

    def update(self, schedule: Schedule, steps: int, now: float) -> StepOutcome:
        """Apply `steps` (<= schedule.max_steps) iterations of `schedule`, the last ending at `now`."""

    def has_work(self) -> bool:
        """Anything waiting or running."""

    def load(self) -> int:
        """Requests waiting or running (the least_loaded router's measure)."""


SCHEDULERS: dict[str, type[Scheduler]] = {
    "static": StaticScheduler,
    "continuous": ContinuousScheduler,
    "chunked": ChunkedScheduler,
}
