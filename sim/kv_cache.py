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
    def __init__(self, num_blocks: int, block_size: int, num_requests: int):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free = num_blocks                               # blocks on the free list
        self.held = np.zeros(num_requests, dtype=np.int64)  # blocks each request holds

    @property
    def used(self) -> int:
        return self.num_blocks - self.free

    def blocks_for(self, num_tokens):
        """Blocks that hold `num_tokens` tokens (ceil division; works on arrays)."""
        return -(-num_tokens // self.block_size)

    def allocate(self, rid: int, num_tokens: int) -> bool:
        """Grow request `rid` to hold `num_tokens` tokens. False (and no change) if it doesn't fit."""
        need = self.blocks_for(num_tokens) - self.held[rid]
        if need > self.free:
            return False
        if need > 0:
            self.held[rid] += need
            self.free -= need
        return True

    def allocate_many(self, rids: np.ndarray, num_tokens: np.ndarray) -> bool:
        """All-or-nothing `allocate` for many requests at once."""
        need = np.maximum(self.blocks_for(num_tokens) - self.held[rids], 0)
        total = int(need.sum())
        if total > self.free:
            return False
        self.held[rids] += need
        self.free -= total
        return True

    def release(self, rid) -> None:
        """Return every block of `rid` (one id or an array of ids) to the free list."""
        self.free += int(self.held[rid].sum())
        self.held[rid] = 0


class ContiguousKVCache:
    """Each request reserves its whole KV span up front; capacity counted in token slots."""

    def __init__(self, num_blocks: int, block_size: int, num_requests: int):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.capacity = num_blocks * block_size                  # token slots
        self.free_tokens = self.capacity
        self.reserved = np.zeros(num_requests, dtype=np.int64)  # token slots reserved per request

    @property
    def used(self) -> int:
        """Reserved memory in block units (rounded up), comparable with the paged cache."""
        return -(-(self.capacity - self.free_tokens) // self.block_size)

    def allocate(self, rid: int, num_tokens: int) -> bool:
        if num_tokens > self.free_tokens:
            return False
        self.reserved[rid] = num_tokens
        self.free_tokens -= num_tokens
        return True

    def release(self, rid) -> None:
        self.free_tokens += int(self.reserved[rid].sum())
        self.reserved[rid] = 0
