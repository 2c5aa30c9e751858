"""Schedulers: which requests compute which tokens in the next engine iteration.

The contract, in one breath (sim/step.py): the engine calls `add(rid)` when a request arrives,
`schedule(now)` for the next iteration's frozen `Schedule` (None: nothing to run until an arrival
or `retry_at`), and, once the cost model's time has passed, `update(schedule, steps, now)`, which
applies what the iteration computed and returns a `StepOutcome`. A scheduler owns its waiting and
running queues and its KV cache; it never knows what an iteration costs.

Adding a scheduler = one file + one line in `SCHEDULERS`: config validation, the CLI's help, the
real engine and the planner read names and per-scheduler facts (the class attributes of the
Protocol below) from here, never by comparing names.

`build_scheduler` and `check_servable` are how both the simulator (sim/simulate.py) and the real
engine (calibrate/engine.py) set one replica up from a scenario's engine config, so the two share
admission and memory semantics by construction. Nothing here imports simpy.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, ClassVar, Protocol

import numpy as np

from ..errors import ScenarioError
from ..kv_cache import PagedKVCache, WindowedKVCache
from ..prefix_cache import PrefixKVCache, request_chains
from ..queues import make_queue
from ..request import RequestTable
from ..step import Schedule, StepOutcome
from .chunked import ChunkedScheduler
from .continuous import ContinuousScheduler
from .static import StaticScheduler

if TYPE_CHECKING:
    from ..config import EngineConfig
    from ..models import KVLayout
    from ..workload import Workload


class Scheduler(Protocol):
    kv_cache: ClassVar[type]      # its KV memory: PagedKVCache or ContiguousKVCache (sim/kv_cache.py)
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


SCHEDULERS: dict[str, type] = {
    "static": StaticScheduler,
    "continuous": ContinuousScheduler,
    "chunked": ChunkedScheduler,
}


def kv_cache_for(e: EngineConfig, num_blocks: int, num_requests: int, layout: KVLayout | None = None):
    """One replica's KV cache without prefix caching: the scheduler's kind, windowed for a
    sliding-window model's layer groups (`layout`, from its MemoryBudget) where it is paged."""
    cls = SCHEDULERS[e.scheduler]
    if layout is not None and layout.sliding_groups and cls.kv_cache is PagedKVCache:
        return WindowedKVCache(num_blocks, e.block_size, layout, e.max_num_batched_tokens)
    return cls.kv_cache.for_replica(num_blocks, e.block_size, num_requests)


def build_scheduler(e: EngineConfig, requests: RequestTable, num_blocks: int,
                    workload: Workload, rng: np.random.Generator | None = None,
                    layout: KVLayout | None = None, wrap: Callable[[type], type] | None = None) -> Scheduler:
    """One replica's scheduler with its own KV cache of `num_blocks` blocks and waiting queue.
    `rng`: the run's seeded generator (speculative decoding draws its acceptances from it);
    `layout`: a sliding-window model's KV-cache groups (sim/config.py turned prefix caching,
    speculative decoding and disaggregation off or away for it); `wrap`: makes the class built from
    the scheduler's (a disaggregated pool's, sim/disaggregation.py)."""
    cls = SCHEDULERS[e.scheduler]
    caching = prefix_caching(e, workload)
    if caching and e.speculative is not None:
        raise ScenarioError("engine.speculative: speculative decoding together with prefix caching over "
                            "the workload's shared prefixes is not modelled; set "
                            "engine.enable_prefix_caching: false")
    if caching:
        prompt = requests.prompt.tolist()
        # (multi-turn sessions: their chains are given as they arrive, sim/sessions.py)
        shared = workload.prefix if workload.prefix is not None else [None] * len(prompt)
        hashes = request_chains(shared, prompt, e.block_size)
        kv = PrefixKVCache(num_blocks, e.block_size, hashes, prompt)
    elif caching_on(e) and e.speculative is None:
        # Nothing shared, but vLLM still caches every request's own full blocks: a preempted
        # request's resumption hits what is left of them (found against real vLLM,
        # docs/validation.md). Own blocks only: no lookups before a preemption, no hit-rate columns.
        # (the prompt column itself, not a list: read only for a request freed without its
        # computed tokens, and a million-request run would hold 36 MB of ints for it)
        kv = PrefixKVCache(num_blocks, e.block_size, [[]] * len(requests), requests.prompt, reports=False)
    else:
        kv = kv_cache_for(e, num_blocks, len(requests), layout)
    pool = None
    if e.speculative is not None:
        from ..speculative import SpeculativePool
        pool = SpeculativePool(requests, kv, e.speculative, rng if rng is not None else np.random.default_rng(0))
    if wrap is not None:
        cls = wrap(cls)
    return cls(requests=requests, kv=kv, pool=pool, queue=make_queue(e.policy, requests),
               max_num_seqs=e.max_num_seqs, max_num_batched_tokens=e.max_num_batched_tokens,
               reserve_full_isl=e.scheduler_reserve_full_isl, batch_timeout_s=e.batch_timeout_s,
               max_output_tokens=int(workload.output_tokens.max(initial=1)))


def caching_on(e: EngineConfig) -> bool:
    """Prefix caching on (or left at vLLM's default, on) for a scheduler that has it."""
    return SCHEDULERS[e.scheduler].prefix_caching and e.enable_prefix_caching is not False


def prefix_caching(e: EngineConfig, workload: Workload) -> bool:
    """Is prefix caching across requests simulated: on, and the workload says what its prompts
    share (a trace's hash_ids, workload.prefix)?"""
    if workload.users is not None and workload.users.turns is not None:
        return caching_on(e)  # multi-turn sessions: each turn's prompt starts with the last's tokens
    return caching_on(e) and workload.prefix is not None and len(workload.prefix) == len(workload)


def servable(e: EngineConfig, num_blocks: int, max_output: int, layout: KVLayout | None = None):
    """`fits(prompt, output)`: would one more request of these lengths pass check_servable below
    (a conversation's growing prompt is checked as it grows: sim/sessions.py)?"""
    cls = SCHEDULERS[e.scheduler]
    capacity = num_blocks * e.block_size
    whole_prompts = cls.token_budget and not cls.chunks_prompts
    kv = kv_cache_for(e, num_blocks, 0, layout)

    def fits(prompt: int, output: int) -> bool:
        # the workload's longest output beside it: static batching reserves that much for everyone
        need, _ = kv.slots_needed(np.array([prompt, prompt]), np.array([output, max_output]),
                                            e.block_size)
        if need[0] > capacity:
            return False
        return not whole_prompts or prompt + output - 1 <= e.max_num_batched_tokens
    return fits


def check_servable(w: Workload, e: EngineConfig, num_blocks: int, where: str = "",
                   layout: KVLayout | None = None) -> None:
    """A request that could never be scheduled would hang the replica: refuse it up front."""
    if len(w) == 0:
        raise ScenarioError(f"{where}workload: no requests to simulate")
    cls = SCHEDULERS[e.scheduler]
    capacity = num_blocks * e.block_size  # KV token slots per replica
    need, what = kv_cache_for(e, num_blocks, 0, layout).slots_needed(w.prompt_tokens, w.output_tokens, e.block_size)
    worst = int(np.argmax(need))
    if need[worst] > capacity:
        raise ScenarioError(
            f"{where}workload: request {worst} needs {int(need[worst])} KV token slots "
            f"({what}) but the cache holds {capacity} ({num_blocks} blocks x {e.block_size}); "
            f"raise engine.num_gpu_blocks / gpu_memory_utilization or shorten the request")
    if cls.token_budget and not cls.chunks_prompts:
        longest = w.prompt_tokens + w.output_tokens - 1
        worst = int(np.argmax(longest))
        if longest[worst] > e.max_num_batched_tokens:
            raise ScenarioError(
                f"{where}engine.max_num_batched_tokens: {e.max_num_batched_tokens} is below request "
                f"{worst}'s {int(longest[worst])} tokens (prompt + output - 1, what a recompute "
                f"prefills); the {e.scheduler} scheduler prefills whole prompts, so raise it to at "
                f"least {int(longest[worst])} or use a scheduler that chunks prompts "
                f"({', '.join(n for n, c in SCHEDULERS.items() if c.chunks_prompts)})")
