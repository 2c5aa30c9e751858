"""Schedulers: which requests compute which tokens in the next engine iteration.

The contract, in one breath: the engine calls `add(rid)` when a request arrives, `schedule(now)`
for the next iteration's `Batch` (None: nothing to run until an arrival or `retry_at`), and, once
the cost model's time has passed, `update(batch, steps, now)` to apply what the iteration computed.
A scheduler owns its waiting/running queues and its KV cache; it never knows what an iteration
costs. Adding a scheduler = one file + one line in `SCHEDULERS`.
"""
from __future__ import annotations

from typing import Protocol

from ..errors import ScenarioError
from .batch import Batch
from .chunked import ChunkedScheduler
from .continuous import ContinuousScheduler
from .static import StaticScheduler


class Scheduler(Protocol):
    retry_at: float  # when schedule() may return work without a new arrival (inf: only on arrival)

    def add(self, rid: int) -> None:
        """A request has arrived: put it in the waiting queue."""

    def schedule(self, now: float) -> Batch | None:
        """What the next iteration computes, or None if there is nothing to run now."""

    def update(self, batch: Batch, steps: int, now: float) -> None:
        """Apply `steps` (<= batch.max_steps) iterations of `batch`, the last ending at `now`."""

    def has_work(self) -> bool:
        """Anything waiting or running."""

    def load(self) -> int:
        """Requests waiting or running (the least_loaded router's measure)."""


SCHEDULERS = {"static": StaticScheduler, "continuous": ContinuousScheduler, "chunked": ChunkedScheduler}


def make_scheduler(name: str, **kwargs) -> Scheduler:
    if name not in SCHEDULERS:
        raise ScenarioError(f"engine.scheduler: {name!r} is not one of {', '.join(SCHEDULERS)}")
    return SCHEDULERS[name](**kwargs)
