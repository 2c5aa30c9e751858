"""A CPU tier behind the GPU's prefix cache: vLLM's KV offloading (`--kv-offloading-size`, the native
backend: OffloadingConnector over an LRU CPU block store; vllm/v1/kv_offload/ and
distributed/kv_transfer/kv_connector/v1/offloading_connector.py), as one replica's connector.

What it does, as vLLM does it:
- **Stores are write-through.** Every full block a request computes is copied to CPU memory (one
  already there is skipped); room is made by evicting the least recently used blocks, never one
  being loaded. Stores run device-to-host, asynchronously, the other direction of the link from
  loads: they cost the step nothing here.
- **Lookups follow the GPU's.** A request about to be scheduled with no tokens computed (new, or
  resumed after a preemption) first takes its GPU prefix hits (sim/kv/prefix_cache.py); the
  consecutive blocks after them that CPU memory holds are loaded instead of recomputed. Looking a
  request up touches every block of its prompt in the LRU order (vLLM's `touch`), the first block
  last, so a prompt's tail is evicted before its head.
- **Loads are asynchronous.** The request gets GPU blocks for its hits and the loaded blocks at once,
  then waits outside the running batch (vLLM's WAITING_FOR_REMOTE_KVS) while others run; it joins
  at the first iteration boundary after its load ends, and its prefill starts after the loaded
  tokens. Loads cross the replica's host link one after another: a load of k blocks takes
  k x (KV bytes of a block on one GPU) / hardware.host_bandwidth, every TP rank loading its own
  shard over its own link at once.

Modelled coarsely, and said here: vLLM stores a request's blocks as each fills; here its shared
(hashed) prompt blocks are stored as they are computed, and the rest of its full blocks (its own,
which only its resumption after a preemption can hit) as one run when it leaves the GPU, evicted
as a unit (at most one request's blocks more room than block-by-block eviction would give). The CPU
block is the GPU's (vLLM may group several into one offloaded block). No fixed per-load latency.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class OffloadSpec:
    """One replica's CPU tier, resolved from the scenario: its size in GPU blocks and what loading
    one block back costs (seconds)."""
    num_blocks: int
    seconds_per_block: float

    @staticmethod
    def resolve(size_gib: float, bytes_per_block_per_rank: int, tensor_parallel_size: int,
                host_bandwidth: float) -> OffloadSpec:
        """vLLM's size is GiB over all TP ranks together; each rank keeps its shard of a block."""
        per_rank = size_gib * 2**30 / tensor_parallel_size
        return OffloadSpec(int(per_rank // bytes_per_block_per_rank), bytes_per_block_per_rank / host_bandwidth)


class CpuOffload:
    """The CPU tier of one replica and its host link, called by the scheduler at four points:
    `lookup` + `start_load` when it admits a request, `loaded` when that request joins, `computed`
    after each prefill chunk, `left` when a request leaves the GPU (finished or preempted)."""

    def __init__(self, spec: OffloadSpec, kv):
        self.capacity = spec.num_blocks
        self.seconds_per_block = spec.seconds_per_block
        self.kv = kv  # the replica's PrefixKVCache: the requests' hash chains, its block size
        # key -> blocks it stands for, least recently used first: a shared block's hash (1), or
        # ("own", rid) for a request's own full blocks past its chain (their count)
        self.lru: OrderedDict = OrderedDict()
        self.used = 0                       # blocks held
        self.pinned: dict = {}              # key -> loads reading it now (not evictable)
        self.stored: dict[int, int] = {}    # request -> chain blocks stored so far
        self.reading: dict[int, list] = {}  # request -> the keys its load reads
        self.link_free_at = 0.0             # s: when the host link ends its last load
        # statistics (summary kv_offloading)
        self.hit_tokens = 0
        self.loads = 0
        self.load_seconds: list[float] = []  # each load's wait, queueing on the link included
        self.stored_blocks = 0
        self.evicted_blocks = 0

    def restart(self) -> None:
        """The replica starts afresh (autoscaling): its CPU memory is empty; statistics are kept."""
        assert not self.reading, "restart with a load in flight"
        self.lru, self.used, self.pinned, self.stored = OrderedDict(), 0, {}, {}
        self.link_free_at = 0.0

    # -- admission ----------------------------------------------------------------------------
    def lookup(self, rid: int, num_tokens: int, gpu_hits: int) -> int:
        """Blocks of request `rid` to load from CPU memory after its `gpu_hits` GPU hit blocks, of
        `num_tokens` tokens in all (its last token is always computed, as on the GPU)."""
        chain = self.kv.hashes[rid]
        most = max(num_tokens - 1, 0) // self.kv.block_size
        lru, own = self.lru, ("own", rid)
        if own in lru:  # every block of the request is touched, last first: the first ends most recent
            lru.move_to_end(own)
        for h in reversed(chain[:most]):
            if h in lru:
                lru.move_to_end(h)
        i, stop = gpu_hits, min(most, len(chain))
        while i < stop and chain[i] in lru:
            i += 1
        if i >= len(chain) and own in lru:  # a preempted request's own blocks, after its chain
            i = max(i, min(most, len(chain) + lru[own]))
        return max(i - gpu_hits, 0)

    def start_load(self, rid: int, gpu_hits: int, blocks: int, now: float) -> float:
        """Load `blocks` blocks of request `rid` after its GPU hits; returns when they are in."""
        chain = self.kv.hashes[rid]
        keys = list(chain[gpu_hits:gpu_hits + blocks])
        if gpu_hits + blocks > len(chain):
            keys.append(("own", rid))
        for k in keys:
            self.pinned[k] = self.pinned.get(k, 0) + 1
        self.reading[rid] = keys
        start = max(now, self.link_free_at)
        ready = start + blocks * self.seconds_per_block
        self.link_free_at = ready
        self.loads += 1
        self.hit_tokens += blocks * self.kv.block_size
        self.load_seconds.append(ready - now)
        self.kv.cached_tokens[rid] += blocks * self.kv.block_size  # (vLLM's num_cached_tokens counts them)
        return ready

    def loaded(self, rid: int) -> None:
        """Request `rid`'s load is done: the blocks it read may be evicted again."""
        for k in self.reading.pop(rid):
            left = self.pinned[k] - 1
            if left:
                self.pinned[k] = left
            else:
                del self.pinned[k]

    # -- stores -------------------------------------------------------------------------------
    def computed(self, rid: int, tokens: int) -> None:
        """Request `rid` has `tokens` tokens computed: its full chain blocks among them are stored."""
        chain = self.kv.hashes[rid]
        full = min(tokens // self.kv.block_size, len(chain))
        done = self.stored.get(rid, 0)
        if full > done and self._store([(h, 1) for h in chain[done:full]]):
            self.stored[rid] = full  # (else tried again with the next chunk, as vLLM does)

    def left(self, rid: int, tokens: int) -> None:
        """Request `rid` leaves the GPU holding `tokens` computed tokens: the rest of its full
        blocks are stored (chain blocks one by one; its own ones past the chain as one run)."""
        self.computed(rid, tokens)
        self.stored.pop(rid, None)
        own = tokens // self.kv.block_size - len(self.kv.hashes[rid])
        if own > 0:
            self._store([(("own", rid), own)])

    def _store(self, entries: list) -> bool:
        """Store (key, blocks) entries at once, as vLLM's prepare_store does a request's new blocks:
        those already there are skipped; room for the rest is made from the least recently used
        end, or, if that cannot free enough, none of them is stored (False)."""
        lru = self.lru
        new = []
        for key, blocks in entries:
            held = lru.get(key)
            if held is None:
                new.append((key, blocks))
            elif held < blocks:  # a longer run of the same request's own blocks replaces it
                del lru[key]
                self.used -= held
                new.append((key, blocks))
        if not new:
            return True
        need = self.used + sum(b for _, b in new) - self.capacity
        if need > 0 and not self._evict(need):
            return False
        for key, blocks in new:
            lru[key] = blocks
        added = sum(b for _, b in new)
        self.used += added
        self.stored_blocks += added
        return True

    def _evict(self, need: int) -> bool:
        """Free at least `need` blocks from the least recently used end, skipping those being
        loaded; False (nothing evicted) if that many cannot be freed."""
        victims, freed = [], 0
        for key, blocks in self.lru.items():
            if key in self.pinned:
                continue
            victims.append(key)
            freed += blocks
            if freed >= need:
                break
        else:
            return False
        for key in victims:
            self.used -= self.lru.pop(key)
        self.evicted_blocks += freed
        return True
