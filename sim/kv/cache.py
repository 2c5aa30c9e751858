"""KV-cache memory: paged blocks (vLLM) for the iteration-level schedulers, a contiguous
per-request reservation (HF / FasterTransformer style) for the static baseline.

Both are ask-then-do: `allocate` returns False when the memory is not there ("does not fit" is a
normal answer, not an exception) and changes nothing in that case.

Physical block ids are not tracked: without prefix caching any free block serves as well as
another, so the free list reduces to a count and nothing simulated depends on which ids a request
holds. Holding only counts keeps allocation O(1) and lets decode runs allocate in bulk.
"""
from __future__ import annotations

import numpy as np


class PagedKVCache:
    """Blocks of `block_size` tokens from a shared pool. A request holding `c` tokens holds
    `blocks_for(c)` blocks; the scheduler asks for the difference when a request grows."""

    cached_blocks = 0  # no prefix caching: no block carries a hash

    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free = num_blocks  # blocks on the free list

    @classmethod
    def for_replica(cls, num_blocks: int, block_size: int, num_requests: int) -> PagedKVCache:
        return cls(num_blocks, block_size)  # counts blocks: no per-request state

    def slots_needed(self, prompt: np.ndarray, output: np.ndarray, block_size: int):
        """Token slots each request needs at its largest, and why (for messages)."""
        return (-(-(prompt + output - 1) // block_size) * block_size,
                "prompt + output - 1 tokens of KV")

    @property
    def used(self) -> int:
        return self.num_blocks - self.free

    def blocks_for(self, num_tokens):
        """Blocks that hold `num_tokens` tokens (ceil division; works on arrays)."""
        return -(-num_tokens // self.block_size)

    def growth(self, computed: int, new_tokens: int) -> int:
        """Blocks a request holding `computed` tokens must add to hold `new_tokens` more."""
        return self.blocks_for(computed + new_tokens) - self.blocks_for(computed)

    def sequence_blocks(self, num_tokens: int) -> int:
        """Blocks the admission gate asks for a whole sequence of `num_tokens` tokens."""
        return self.blocks_for(num_tokens)

    def slide(self, computed_before: int, computed: int) -> int:
        """A request's computed tokens grew: nothing falls out of a window here (blocks freed: 0)."""
        return 0

    def allocate(self, blocks: int) -> bool:
        """Take `blocks` from the free list. False (and no change) if there are not that many."""
        if blocks > self.free:
            return False
        self.free -= blocks
        return True

    def release(self, blocks: int) -> None:
        self.free += blocks

    def restart(self) -> None:
        """The replica starts afresh (sim/kv/prefix_cache.PrefixKVCache's): nothing cached to drop here."""

    # the prefix-caching calls of sim/kv/prefix_cache.PrefixKVCache, for a cache without it
    def lookup(self, rid: int, num_tokens: int) -> list[int]:
        return []

    def admit(self, rid: int, hits: list[int], new_blocks: int, num_tokens: int) -> bool:
        return self.allocate(new_blocks)

    def can_take(self, hits: list[int], new_blocks: int) -> bool:
        """Would `new_blocks` fresh blocks fit now (beside the cached `hits`; none here)?"""
        return new_blocks <= self.free

    def commit(self, rid: int, computed: int) -> None:
        pass

    def free_request(self, rid: int, blocks: int, preempted: bool = False,
                     computed: int | None = None) -> None:
        self.free += blocks


class WindowedKVCache(PagedKVCache):
    """vLLM's hybrid KV-cache manager for sliding-window models (`SlidingWindowManager`): every
    block of the pool holds `block_size` tokens of one group's layers (sim/presets/models.KVLayout); a
    request holds blocks in each group, all of its tokens' in a full-attention group, and in a
    sliding-window group only from the block of the oldest token the next one still attends
    (`computed - window + 1`): blocks wholly behind it are freed as the request advances.

    vLLM frees them when the request next allocates, in the scheduler's pass over the running
    requests; here as soon as the iteration that pushed them out of the window ends, and the
    scheduler takes them back for its ordered pass when that order decides who is preempted
    (sim/schedulers/iteration_level.py, `_lazy_releases`). Admission's whole-sequence gate asks, per sliding
    group, for at most
    vLLM's cap: cdiv(window - 1 + tokens in flight, block_size) + 1, tokens in flight being two
    iterations' max_num_batched_tokens (async scheduling's two batches)."""

    def __init__(self, num_blocks: int, block_size: int, layout, max_num_batched_tokens: int):
        super().__init__(num_blocks, block_size)
        self.layout = layout
        self.groups, self.sliding_groups, self.window = layout.groups, layout.sliding_groups, layout.window
        self.cap = -(-(layout.window - 1 + 2 * max_num_batched_tokens) // block_size) + 1

    def blocks_for(self, num_tokens):
        return self.layout.held(num_tokens, self.block_size)

    def growth(self, computed: int, new_tokens: int) -> int:
        # the blocks behind the window went at the end of the last iteration (`slide`)
        bs = self.block_size
        return self.groups * (-(-(computed + new_tokens) // bs) - -(-computed // bs))

    def sequence_blocks(self, num_tokens):
        """(arrays too: slots_needed)"""
        blocks = -(-num_tokens // self.block_size)
        return (self.groups - self.sliding_groups) * blocks + self.sliding_groups * np.minimum(blocks, self.cap)

    def slide(self, computed_before: int, computed: int) -> int:
        """Free the sliding groups' blocks that `computed_before` -> `computed` pushed out of the
        window; returns how many."""
        behind = self.layout.behind
        freed = self.sliding_groups * (behind(computed, self.block_size) - behind(computed_before, self.block_size))
        self.free += freed
        return freed

    def slots_needed(self, prompt: np.ndarray, output: np.ndarray, block_size: int):
        """Token slots (blocks x block_size, over every group) each request asks admission for at
        its largest, and why."""
        return self.sequence_blocks(prompt + output - 1) * block_size, (
            "prompt + output - 1 tokens of KV in each of its "
                                   f"{self.groups} layer groups, the windowed ones capped at {self.cap} blocks")


class ContiguousKVCache:
    """Each request reserves its whole KV span up front; capacity counted in token slots."""

    def __init__(self, num_blocks: int, block_size: int, num_requests: int):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.capacity = num_blocks * block_size                  # token slots
        self.free_tokens = self.capacity
        self.reserved = np.zeros(num_requests, dtype=np.int64)  # token slots reserved per request

    @classmethod
    def for_replica(cls, num_blocks: int, block_size: int, num_requests: int) -> ContiguousKVCache:
        return cls(num_blocks, block_size, num_requests)

    @property
    def used(self) -> int:
        """Blocks' worth of token slots reserved (rounded up): the paged caches' measure, for a
        router reading KV utilisation."""
        return -(-(self.capacity - self.free_tokens) // self.block_size)

    def restart(self) -> None:
        """The replica starts afresh: nothing is cached in a contiguous cache."""

    @staticmethod
    def slots_needed(prompt: np.ndarray, output: np.ndarray, block_size: int):
        """Token slots each request reserves (its prompt + the longest output), and why."""
        return prompt + int(output.max()), "its prompt + the longest output (static batching reserves both)"

    def allocate(self, rid: int, num_tokens: int) -> bool:
        if num_tokens > self.free_tokens:
            return False
        self.reserved[rid] = num_tokens
        self.free_tokens -= num_tokens
        return True

    def release(self, rid) -> None:
        self.free_tokens += int(self.reserved[rid].sum())
        self.reserved[rid] = 0


class StateKVCache(PagedKVCache):
    """vLLM's hybrid KV-cache manager for a model with linear-attention layers (Qwen3-Next): the
    pool's blocks serve both kinds of group (sim/presets/models.KVLayout): a request holds, in each
    full-attention group, the blocks of its tokens, and in each linear-attention group one block,
    its recurrent state (vLLM's MambaManager with mamba_cache_mode none), from its first computed
    token until it finishes or is preempted. Without prefix caching (vLLM's default for hybrids
    here: sim/scenario.py)."""

    def __init__(self, num_blocks: int, block_size: int, layout):
        super().__init__(num_blocks, block_size)
        self.full, self.states = layout.full_groups, layout.state_groups

    def blocks_for(self, num_tokens):
        """(arrays too) the attention blocks of `num_tokens` tokens in each full group, and one
        state block in each linear group once there is a token"""
        return self.full * -(-num_tokens // self.block_size) + self.states * (num_tokens > 0)

    def slots_needed(self, prompt: np.ndarray, output: np.ndarray, block_size: int):
        return self.blocks_for(prompt + output - 1) * block_size, (
            f"prompt + output - 1 tokens of KV in {self.full} attention group(s) and one "
            f"state block in each of {self.states} linear-attention group(s)")
