"""The engine's scalar knobs as data (issue 49): each one's name, kind, range and the vLLM flag it
is, in one table. sim/scenario.py parses the engine section by it, in its order (so the first bad
key in that order is the one a refusal names); tests/config/test_knobs.py holds EngineConfig's
fields and docs/reference.md's engine table to it. A new scalar knob is a row here, its field (and
default) on EngineConfig and its row in the docs; its checks across keys stay in
sim/scenario._check_engine, and what it changes, in the layer that uses it.

The engine's sections (speculative, disaggregation, autoscaling, admission, lora, routing) are not
knobs: each is parsed by its own module beside this one.

    python -m sim.config.knobs      # the table, one line a knob
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sim.config.checks import MAX_BLOCKS, MAX_COUNT, MAX_OFFLOAD_GIB, MAX_REPLICAS, MAX_SECONDS, MAX_TOKENS

MAX_BLOCK_SIZE = 1024  # tokens; bigger "pages" make paging pointless and usually mean a typo
# (a hybrid model's blocks are raised past it, to multiples of 16: vLLM's, sim/presets/memory.hybrid_block_size)
MAX_HYBRID_BLOCK_SIZE = 8192


def power_of_two_block(block: int) -> bool:
    return 1 <= block <= MAX_BLOCK_SIZE and not block & (block - 1)


def block_size_ok(block: int) -> bool:
    """A power of two in [1, MAX_BLOCK_SIZE], or a multiple of 16 up to MAX_HYBRID_BLOCK_SIZE (a hybrid's)."""
    return power_of_two_block(block) or (0 < block <= MAX_HYBRID_BLOCK_SIZE and block % 16 == 0)


@dataclass(frozen=True)
class Knob:
    """One scalar engine key. `kind`: "int", "number", "bool" or "choice" (its names: the registry
    `choices` names, which sim/scenario.py resolves: the plug-ins' registries sit above config/)."""
    name: str
    kind: str
    flag: str = ""                 # vLLM's command-line flag ("": servesim's own, or derived from others)
    lo: float = 0
    hi: float | None = None
    cap: float | None = None       # a sanity bound, said apart from the range (sim/config/checks.py)
    open_lo: bool = False
    optional: bool = False         # absent (or null): None, i.e. vLLM's default or off
    choices: str = ""
    rule: Callable[[Any], bool] | None = None  # a further check of the value, and what a failure says
    rule_says: str = ""


ENGINE_KNOBS: tuple[Knob, ...] = (
    Knob("block_size", "int", "--block-size", lo=1, hi=MAX_HYBRID_BLOCK_SIZE, rule=block_size_ok,
         rule_says=f"is not a power of two in [1, {MAX_BLOCK_SIZE}] (vLLM uses 16)"),
    # (vLLM has no --scheduler: chunked is --enable-chunked-prefill, continuous its --no- form)
    Knob("scheduler", "choice", choices="schedulers"),
    Knob("max_num_seqs", "int", "--max-num-seqs", lo=1, cap=MAX_COUNT),
    Knob("max_num_batched_tokens", "int", "--max-num-batched-tokens", lo=1, cap=MAX_TOKENS),
    Knob("gpu_memory_utilization", "number", "--gpu-memory-utilization", lo=0, hi=1, open_lo=True),
    Knob("num_gpu_blocks", "int", "--num-gpu-blocks-override", lo=1, cap=MAX_BLOCKS, optional=True),
    Knob("tensor_parallel_size", "int", "--tensor-parallel-size", lo=1, cap=MAX_COUNT),
    Knob("pipeline_parallel_size", "int", "--pipeline-parallel-size", lo=1, cap=MAX_COUNT),
    Knob("data_parallel_size", "int", "--data-parallel-size", lo=1, cap=MAX_COUNT),
    Knob("all2all_backend", "choice", "--all2all-backend", choices="all2all_backends"),
    Knob("replicas", "int", lo=1, cap=MAX_REPLICAS),
    # router (replicas > 1) and batch_timeout_s (static) are accepted and ignored where they do not
    # apply, so that a sweep over replicas or schedulers can start from any scenario.
    Knob("router", "choice", choices="routers"),
    Knob("policy", "choice", choices="policies"),
    Knob("batch_timeout_s", "number", lo=0, cap=MAX_SECONDS),
    Knob("kv_cache_dtype", "choice", "--kv-cache-dtype", choices="kv_cache_dtypes"),
    Knob("enable_expert_parallel", "bool", "--enable-expert-parallel"),
    Knob("enable_prefix_caching", "bool", "--enable-prefix-caching", optional=True),
    Knob("scheduler_reserve_full_isl", "bool", "--scheduler-reserve-full-isl"),
    Knob("enforce_eager", "bool", "--enforce-eager"),
    Knob("max_cudagraph_capture_size", "int", "--max-cudagraph-capture-size", lo=1, cap=MAX_TOKENS, optional=True),
    Knob("kv_offloading_size", "number", "--kv-offloading-size", lo=0, cap=MAX_OFFLOAD_GIB, open_lo=True,
         optional=True),
    Knob("kv_offloading_backend", "choice", "--kv-offloading-backend", choices="offloading_backends"),
)


if __name__ == "__main__":
    for k in ENGINE_KNOBS:
        bounds = "" if k.kind in ("bool", "choice") else f" [{k.lo:g}, {'inf' if k.hi is None else f'{k.hi:g}'}]"
        print(f"{k.name:28} {k.kind:7}{bounds:14} {k.flag or '-':30} {'optional' if k.optional else ''}")
