"""Schedulers: which requests compute which tokens in the next engine iteration.

The contract, in one breath: the engine calls `add(rid)` when a request arrives, `schedule(now)`
for the next iteration's `Batch` (None: nothing to run until an arrival or `retry_at`), and, once
the cost model's time has passed, `update(batch, steps, now)` to apply what the iteration computed.
A scheduler owns its waiting/running queues and its KV cache; it never knows what an iteration
costs. Adding a scheduler = one file + one line in `SCHEDULERS`.

`build_scheduler` and `check_servable` are how both the simulator (sim/simulate.py) and the real
engine (calibrate/engine.py) set one replica up from a scenario's engine config, so the two share
admission and memory semantics by construction. Nothing here imports simpy.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..errors import ScenarioError
from ..kv_cache import ContiguousKVCache, PagedKVCache
from ..queues import make_queue
from ..request import RequestTable
from .batch import Batch
from .chunked import ChunkedScheduler
from .continuous import ContinuousScheduler
from .static import StaticScheduler

if TYPE_CHECKING:
    from ..config import EngineConfig
    from ..workload import Workload


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


def build_scheduler(e: EngineConfig, requests: RequestTable, num_blocks: int,
                    workload: Workload) -> Scheduler:
    """One replica's scheduler with its own KV cache of `num_blocks` blocks and waiting queue."""
    kv = (ContiguousKVCache(num_blocks, e.block_size, len(requests)) if e.scheduler == "static"
          else PagedKVCache(num_blocks, e.block_size))
    return make_scheduler(e.scheduler, requests=requests, kv=kv,
                          queue=make_queue(e.policy, requests), max_num_seqs=e.max_num_seqs,
                          max_num_batched_tokens=e.max_num_batched_tokens,
                          batch_timeout_s=e.batch_timeout_s,
                          max_output_tokens=int(workload.output_tokens.max(initial=1)))


def check_servable(w: Workload, e: EngineConfig, num_blocks: int, where: str = "") -> None:
    """A request that could never be scheduled would hang the replica: refuse it up front."""
    if len(w) == 0:
        raise ScenarioError(f"{where}workload: no requests to simulate")
    capacity = num_blocks * e.block_size  # KV token slots per replica
    if e.scheduler == "static":
        need = w.prompt_tokens + int(w.output_tokens.max())
        what = "its prompt + the longest output (static batching reserves both)"
    else:
        need = -(-(w.prompt_tokens + w.output_tokens - 1) // e.block_size) * e.block_size
        what = "prompt + output - 1 tokens of KV"
    worst = int(np.argmax(need))
    if need[worst] > capacity:
        raise ScenarioError(
            f"{where}workload: request {worst} needs {int(need[worst])} KV token slots "
            f"({what}) but the cache holds {capacity} ({num_blocks} blocks x {e.block_size}); "
            f"raise engine.num_gpu_blocks / gpu_memory_utilization or shorten the request")
    if e.scheduler == "continuous":
        longest = w.prompt_tokens + w.output_tokens - 1
        worst = int(np.argmax(longest))
        if longest[worst] > e.max_num_batched_tokens:
            raise ScenarioError(
                f"{where}engine.max_num_batched_tokens: {e.max_num_batched_tokens} is below request "
                f"{worst}'s {int(longest[worst])} tokens (prompt + output - 1, what a recompute "
                f"prefills); the continuous scheduler prefills whole prompts, so raise it to at "
                f"least {int(longest[worst])} or use scheduler: chunked")
