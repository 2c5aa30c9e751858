"""vLLM V1's block pool (vllm/v1/core/block_pool.py) in its plain form, one dict entry per block:
the readable statement of the rules sim/kv/prefix_cache.py lists, which PrefixKVCache implements
with run-length segments and lazy hits. tests/kv/test_prefix_cache.py holds it to a reference pool
(a list scan) and states the by-hand cases with it; it is test code, not part of sim/."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixCache:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.ref = [0] * num_blocks
        self.block_hash: list[object | None] = [None] * num_blocks
        self.cached: dict[object, dict[int, None]] = {}  # hash -> its blocks, first cached first
        self.held: dict[int, list[int]] = {}             # request -> its blocks, in token order
        self.num_cached: dict[int, int] = {}             # request -> leading blocks with a hash
        self.evicted: list[object] = []                  # hashes lost to reuse, in order (metrics, tests)

    # -- state ----------------------------------------------------------------------------------
    @property
    def free(self) -> int:
        """Blocks an allocation can take (free, cached or not)."""
        return len(self.free_queue)

    @property
    def used(self) -> int:
        return self.num_blocks - len(self.free_queue)

    # -- lookup ---------------------------------------------------------------------------------
    def cached_prefix(self, hashes: Sequence, num_tokens: int) -> list[int]:
        """Blocks holding the longest cached prefix of `hashes` (no side effects). At most
        (num_tokens - 1) // block_size: the last token is always computed."""
        hits = []
        for h in hashes[: max(num_tokens - 1, 0) // self.block_size]:
            blocks = self.cached.get(h)
            if not blocks:
                break
            hits.append(next(iter(blocks)))
        return hits

    def can_allocate(self, hits: Sequence[int], new_blocks: int) -> bool:
        """Would `allocate(rid, hits, new_blocks)` succeed? Hits now in the free queue stop being
        allocatable once touched."""
        touched_free = sum(1 for b in hits if self.ref[b] == 0)
        return new_blocks <= len(self.free_queue) - touched_free

    # -- changes --------------------------------------------------------------------------------
    def allocate(self, rid: int, hits: Sequence[int], new_blocks: int) -> bool:
        """Give request `rid` the hit blocks (one more reference each) and `new_blocks` more from
        the head of the free queue. False, and no change, if they are not there."""
        if not self.can_allocate(hits, new_blocks):
            return False
        held = self.held.setdefault(rid, [])
        if not held:
            self.num_cached[rid] = len(hits)  # hit blocks are cached already
        for b in hits:  # touch
            if self.ref[b] == 0:
                del self.free_queue[b]
            self.ref[b] += 1
            held.append(b)
        for _ in range(new_blocks):
            b, _ = self.free_queue.popitem(last=False)
            if self.block_hash[b] is not None:
                self.evict(b)
            self.ref[b] = 1
            held.append(b)
        return True

    def evict(self, b: int) -> None:
        """Block `b` is reused for new tokens: it loses its hash."""
        h = self.block_hash[b]
        blocks = self.cached[h]
        del blocks[b]
        if not blocks:
            del self.cached[h]
        self.block_hash[b] = None
        self.evicted.append(h)

    def cache_full_blocks(self, rid: int, hashes: Sequence, num_full_blocks: int) -> None:
        """Request `rid` has filled its first `num_full_blocks` blocks: those with a hash in
        `hashes` are cached from now on (blocks past the hashes, e.g. of generated tokens whose
        identity the simulation does not know, are not)."""
        held, start = self.held[rid], self.num_cached.get(rid, 0)
        stop = min(num_full_blocks, len(hashes), len(held))
        for i in range(start, stop):
            b, h = held[i], hashes[i]
            self.block_hash[b] = h
            self.cached.setdefault(h, {})[b] = None
        self.num_cached[rid] = max(start, stop)

    def free_request(self, rid: int) -> None:
        """Request `rid` finished or was preempted: one reference fewer on each of its blocks,
        last block first; a block nobody references joins the free queue: at the tail keeping
        its hash (LRU), or, without one (it can never be hit), at the head, to be reused first
        (vLLM 0.32's BlockPool.free_blocks: append_n / prepend_n, each in that order)."""
        first = []
        for b in reversed(self.held.pop(rid, [])):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                if self.block_hash[b] is None:
                    first.append(b)
                else:
                    self.free_queue[b] = None
        for b in reversed(first):  # prepend_n: first[0] becomes the head
            self.free_queue[b] = None
            self.free_queue.move_to_end(b, last=False)
        self.num_cached.pop(rid, None)
