"""A paged KV cache with prefix caching, as vLLM V1's block pool does it (vllm/v1/core/block_pool.py
and kv_cache_manager.py), for requests that carry block hashes instead of token ids.

- Only full blocks are cached, each under the hash of its tokens chained over its parent's hash
  (the caller supplies the chain: a request's `hashes`, one per full block of its prompt).
- Free blocks wait in one queue in eviction order: allocation takes from the head, and a block
  taken from there loses its hash (eviction); a freed block goes to the tail and keeps its hash,
  so it can be hit until it is reused (LRU).
- A hit (`touch`) takes the block out of the free queue and counts one more reference; blocks are
  shared between running requests through those reference counts.
- A request frees its blocks last block first, so its tail is evicted before its prefix; a block
  without a hash (partly filled, or never cached) goes to the head of the queue instead, to be
  reused first (vLLM 0.32: BlockPool.free_blocks prepends those, appends the hashed ones).
- A lookup never covers the whole prompt: the last token is always computed, so at most
  (tokens - 1) // block_size blocks hit.
- Two requests may fill identical blocks at the same time: both stay cached (vLLM does not
  de-duplicate; block ids never change once given), and a lookup takes the first cached.

Ask-then-do like sim/kv/cache.py: `can_allocate` answers, `allocate` acts and changes nothing when
it cannot. Block ids are ints 0..num_blocks-1.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any


def block_hashes(prefix, rid: int, prompt_tokens: int, block_size: int) -> list:
    """The hash chain of a request's full prompt blocks that others may share. `prefix` = (ids,
    unit): its first len(ids) x unit tokens are identified unit by unit by chained ids (Mooncake's
    hash_ids: 512 tokens each; a shared system prompt: one unit). Block i ends at token
    e = (i + 1) x block_size: inside the described prefix its hash is (the id of the unit holding
    token e - 1, the offset of e in that unit), which names everything before e because the ids are
    chained. Blocks past it are the request's own, named ("own", rid, i) by `own_hash` and cached
    only when the request is preempted (nobody else can hit them)."""
    if prefix is None:
        return []
    ids, unit = prefix
    described = min(len(ids) * unit, prompt_tokens)
    out = []
    for i in range(described // block_size):
        end = (i + 1) * block_size
        u = (end - 1) // unit
        out.append((ids[u], end - u * unit))
    return out


def request_chains(prefixes: list, prompts: list[int], block_size: int) -> list[list[int]]:
    """block_hashes of every request, each hash named by a small int (equal hashes, equal ints:
    an int hashes and compares faster than block_hashes' nested tuples in the cache's dicts),
    built once per distinct chain and shared read-only: block i's hash does not depend on the
    prompt's length (a prompt ending inside the prefix has a slice of the prefix's chain), nor, for
    a prefix of one id (a system prompt), on its unit's length."""
    longest: dict = {}  # (ids, unit; 0 for one id) -> the longest chain built yet
    sliced: dict = {}   # (that key, blocks) -> its first `blocks` hashes
    names: dict = {}    # hash -> its int
    none: list = []
    out = []
    for rid, (p, n) in enumerate(zip(prefixes, prompts)):
        if p is None:
            out.append(none)
            continue
        ids, unit = p
        blocks = min(n, len(ids) * unit) // block_size
        key = (ids, unit if len(ids) > 1 else 0)
        chain = sliced.get((key, blocks))
        if chain is None:
            whole = longest.get(key)
            if whole is None or len(whole) < blocks:
                whole = longest[key] = [names.setdefault(h, len(names))
                                        for h in block_hashes(p, rid, len(ids) * unit, block_size)]
            chain = sliced[(key, blocks)] = whole if len(whole) == blocks else whole[:blocks]
        out.append(chain)
    return out


def own_hash(rid: int, i: int) -> tuple:
    return ("own", rid, i)


class PrefixKVCache:
    """The paged KV cache of sim/kv/cache.py (the same count API the schedulers use) with prefix
    caching underneath, cheap enough to run on every iteration.

    Only blocks that can be hit carry identities: the shared prompt blocks a request fills
    (`commit`), the hits it takes (`admit`), and, when it is preempted, its own full prompt blocks
    (its resumption may hit them; nobody else can). All other blocks (decode tokens, partial blocks,
    own blocks of a request that finishes) are hashless and interchangeable, so the free queue keeps
    them as run-length segments: freeing k of them appends one segment, allocating takes from the
    head segment in O(1), whatever k is. Cached blocks sit in the same queue one entry each, in the
    order they were freed, so eviction order is vLLM's (sim/kv/prefix_cache.PrefixCache is the same
    rules block by block; a hypothesis test checks both against one reference model). A hit takes a
    cached block out of the queue lazily: its entry is skipped when it reaches the head.
    """

    def __init__(self, num_blocks: int, block_size: int, hashes: list, prompt_tokens: Sequence[int],
                 reports: bool = True):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.reports = reports    # False: own blocks only (nothing shared): no hit-rate outputs
        self.hashes = hashes      # per request: block_hashes(...) of its shared prompt blocks
        self.prompt = prompt_tokens
        self.queue: deque = deque([[num_blocks]])  # [count] segments of hashless blocks, (id, gen) cached ones
        self.free = num_blocks
        self.queued: dict[int, int] = {}  # cached block in the queue -> generation of its live entry
        self.generation = 0
        # ids for identified blocks: those given back (popped last-in first), then never-given ones
        # from `next_id` up; `ref` grows with them. (A list of every id, and a count per block, up
        # front cost ~36 bytes a block: 0.7 GB for the 19M blocks a tiny model has on an H100.)
        self.ids: list[int] = []
        self.next_id = 0
        self.ref: list[int] = []  # identified block -> references, a group (below) counting once
        self.block_hash: dict[int, object] = {}         # identified block -> its hash
        self.cached_blocks = 0  # len(block_hash): blocks holding a prompt block's hash, in use or
                                # waiting in the free queue to be hit (read every iteration)
        self.cached: dict[object, dict[int, None]] = {}  # hash -> its blocks, first cached first
        self.first: dict[object, int] = {}               # hash -> its first cached block (lookups)
        # (id(chain), blocks looked up) -> (chain, hits): lookups remembered while `first` holds.
        # One that hit every block it looked up stays right when hashes are added (only an
        # eviction can change it); one that stopped short is forgotten then.
        self.lookups: dict[tuple, tuple] = {}
        self.lookups_short: dict[tuple, tuple] = {}
        # Requests admitted with the same hit list (a lookup's answer, shared while `first` holds)
        # reference its blocks as one group: `ref` counts the group once, while it has holders. A
        # block is free exactly when nothing references it, which is all `ref` is read for, so
        # joining or leaving a group that others hold costs O(1), not a pass over the prompt.
        self.group: dict[int, list[int]] = {}  # request -> the hit list it holds as a group
        self.holders: dict[int, int] = {}      # id(hit list) -> requests holding it (> 0)
        self.held: dict[int, list[int]] = {}            # request -> its identified blocks, in order
        self.num_cached: dict[int, int] = {}            # request -> leading blocks with a hash
        self.own_cached: dict[int, int] = {}            # request -> own blocks cached at preemption
        self.evicted: list = []
        self.queried_tokens = 0  # prefix_cache_hit_rate = hit / queried (vLLM's definition)
        self.hit_tokens = 0
        self.cached_tokens = [0] * len(hashes)  # per request: tokens found cached, summed over admissions

    def restart(self) -> None:
        """The replica starts afresh (an autoscaled fleet starting it again): every block free and
        hashless, nothing cached. Only when no request holds a block (a released replica's); the
        hit statistics and each request's cached tokens are kept."""
        assert self.free == self.num_blocks and not self.held, "restart with blocks held"
        self.queue = deque([[self.num_blocks]])
        self.queued, self.generation = {}, 0
        self.ids, self.next_id, self.ref = [], 0, []
        self.block_hash, self.cached_blocks, self.cached, self.first = {}, 0, {}, {}
        self._forget_lookups()
        self.group, self.holders, self.num_cached, self.own_cached = {}, {}, {}, {}
        self.evicted = []

    # the count API of PagedKVCache (`free`: blocks an allocation can take, an attribute as there)
    @property
    def used(self) -> int:
        return self.num_blocks - self.free

    def _take_ids(self, need: int) -> list[int]:
        """`need` ids for blocks that get an identity: the last given back first, then new ones in
        increasing order (what popping a stack of every id, highest at the bottom, would give)."""
        ids = self.ids
        k = min(need, len(ids))
        new = ids[len(ids) - k:]
        del ids[len(ids) - k:]
        new.reverse()
        fresh = need - k
        if fresh:
            start = self.next_id
            new.extend(range(start, start + fresh))
            self.next_id = start + fresh
            self.ref.extend([0] * fresh)
        return new

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def sequence_blocks(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def slide(self, computed_before: int, computed: int) -> int:
        """(full attention: nothing leaves a window; blocks freed: 0)"""
        return 0

    def growth(self, computed: int, new_tokens: int) -> int:
        return self.blocks_for(computed + new_tokens) - self.blocks_for(computed)

    def allocate(self, blocks: int) -> bool:
        """Take `blocks` hashless blocks from the head of the free queue; a cached block met there
        is evicted (it loses its hash and becomes hashless)."""
        free = self.free
        if blocks > free:
            return False
        if blocks:  # (the scheduler asks every iteration, mostly for none)
            self.free = free - blocks
            if self.queued:  # (else the queue is hashless blocks only: nothing to keep in order)
                head = self.queue[0]
                if head.__class__ is list and head[0] > blocks:  # the common case: the head segment
                    head[0] -= blocks
                else:
                    self._take(blocks)
        return True

    def _take(self, blocks: int) -> None:
        """allocate's walk of the free queue from its head."""
        queue = self.queue
        head = queue[0]
        if head.__class__ is list and head[0] >= blocks:  # the common case: from the head segment
            head[0] -= blocks
            if not head[0]:
                queue.popleft()
            return
        queued, named, cached, first = self.queued, self.block_hash, self.cached, self.first
        ids, evicted = self.ids, self.evicted
        while blocks:
            head = queue[0]
            if head.__class__ is list:  # a segment of hashless blocks
                take = min(head[0], blocks)
                head[0] -= take
                blocks -= take
                if not head[0]:
                    queue.popleft()
                continue
            queue.popleft()
            b, gen = head
            if queued.get(b) != gen:
                continue  # taken by a hit since it was queued
            del queued[b]
            # evicted: block b is reused for new tokens and loses its hash
            h = named.pop(b)
            same = cached[h]
            del same[b]
            if not same:
                del cached[h]
                del first[h]
                self._forget_lookups()
            elif first[h] == b:
                first[h] = next(iter(same))
                self._forget_lookups()
            ids.append(b)  # (its reference count is 0: it was free)
            evicted.append(h)
            blocks -= 1
        self.cached_blocks = len(named)

    def _one_segment(self) -> None:
        """With no cached block waiting in the free queue (stale entries of blocks taken by hits
        aside), the queue is hashless blocks only: their order does not matter, so it is one
        segment of `free` blocks. While that lasts the queue itself is not kept up to date (the
        fast path of a run that shares nothing: allocations and frees only count); this rebuilds
        it just before a cached block joins it."""
        queue = self.queue
        if len(queue) == 1 and isinstance(queue[0], list):
            queue[0][0] = self.free
        else:
            queue.clear()
            queue.append([self.free])

    def _queue_hashless(self, tail: int, head: int = 0) -> None:
        """`tail` hashless blocks join the free queue at its tail, then `head` more at its head."""
        self.free += tail + head
        if not self.queued:  # hashless blocks only: just count them (_one_segment)
            return
        queue = self.queue
        end: Any  # (a [count] segment, an (id, generation) entry, or None)
        if tail:
            end = queue[-1] if queue else None
            if end.__class__ is list:
                end[0] += tail
            else:
                queue.append([tail])
        if head:
            end = queue[0] if queue else None
            if end.__class__ is list:
                end[0] += head
            else:
                queue.appendleft([head])

    # prefix caching
    def cached_prefix(self, chain: list, num_tokens: int) -> list[int]:
        n = max(num_tokens - 1, 0) // self.block_size
        hits: list = list(map(self.first.get, chain if n >= len(chain) else chain[:n]))
        if None in hits:  # the longest prefix: up to the first block not cached
            del hits[hits.index(None):]
        return hits

    def lookup(self, rid: int, num_tokens: int) -> list[int]:
        """Blocks of the longest cached prefix of request `rid` (no side effects; the list is
        read-only): its shared blocks, then, after a preemption, its own."""
        chain = self.hashes[rid]
        if self.own_cached:
            own = self.own_cached.get(rid)
            if own:
                chain = chain + [own_hash(rid, i) for i in range(len(chain), len(chain) + own)]
                return self.cached_prefix(chain, num_tokens)
        if not chain:
            return []
        # many requests share a chain and `first` rarely changes: the answer is remembered per
        # (chain, blocks looked up) until it does (a chain only ever grows at its end, so its
        # first n hashes never change; the entry keeps the chain alive, so its id is not reused)
        key = (id(chain), min(max(num_tokens - 1, 0) // self.block_size, len(chain)))
        seen = self.lookups.get(key) or self.lookups_short.get(key)
        if seen is not None and seen[0] is chain:
            return seen[1]
        hits = self.cached_prefix(chain, num_tokens)
        (self.lookups if len(hits) == key[1] else self.lookups_short)[key] = (chain, hits)
        return hits

    def _forget_lookups(self) -> None:
        """`first` lost or changed a hash (an eviction): no remembered lookup is sure any more."""
        self.lookups.clear()
        self.lookups_short.clear()

    def can_take(self, hits: list[int], new_blocks: int) -> bool:
        """Would `new_blocks` fresh blocks fit beside the `hits`, once the hits that sit in the free
        queue are taken out of it (vLLM counts them as evictable computed blocks)?"""
        return new_blocks <= self.free - list(map(self.ref.__getitem__, hits)).count(0)

    def admit(self, rid: int, hits: list[int], new_blocks: int, num_tokens: int) -> bool:
        """Take the hits and `new_blocks` hashless blocks for request `rid` (False: no change)."""
        if not hits:  # the common case: a plain allocation (and a lookup that found nothing)
            if not self.allocate(new_blocks):
                return False
            self.queried_tokens += num_tokens
            return True
        held, ref = self.held.get(rid), self.ref
        if not held and self.holders.get(id(hits)):
            # the very hit list a running request holds as a group: all referenced, none free
            if new_blocks > self.free:
                return False
            self.holders[id(hits)] += 1
            free_hits = 0
        else:
            free_hits = list(map(ref.__getitem__, hits)).count(0)  # hits waiting in the free queue
            if new_blocks > self.free - free_hits:
                return False
            if free_hits:
                queued = self.queued
                for b in hits:  # touch
                    if not ref[b]:
                        del queued[b]  # taken out of the free queue (its entry there goes stale)
                    ref[b] += 1
            else:
                for b in hits:
                    ref[b] += 1
            if held:  # (blocks held already: per block only)
                held.extend(hits)
            else:
                self.holders[id(hits)] = 1
        if not held:
            self.held[rid] = list(hits)
            self.num_cached[rid] = len(hits)
            self.group[rid] = hits
        self.free -= free_hits
        self.allocate(new_blocks)
        self.queried_tokens += num_tokens
        hit = len(hits) * self.block_size
        self.hit_tokens += hit
        self.cached_tokens[rid] += hit
        return True

    def commit(self, rid: int, computed: int) -> None:
        """Request `rid` has `computed` tokens in the cache: its full shared prompt blocks become
        cached (hashless blocks it holds are given identities for them)."""
        chain = self.hashes[rid]
        if chain:
            full = min(computed // self.block_size, len(chain))
            if full > self.num_cached.get(rid, 0):  # (else: nothing new to name)
                self._claim(rid, full, chain)

    def _claim(self, rid: int, full: int, chain: list) -> None:
        """Request `rid`'s first `full` blocks hold `chain`'s hashes from now on: hashless blocks it
        holds are given ids (the next ones `ids` would pop, in that order) and are cached."""
        held = self.held.setdefault(rid, [])
        start = self.num_cached.get(rid, 0)
        need = full - len(held)
        if need > 0:
            new = self._take_ids(need)
            ref = self.ref
            for b in new:
                ref[b] = 1
            held.extend(new)
        stop = min(full, len(chain))
        blocks, hashes = held[start:stop], chain[start:stop]
        self.block_hash.update(zip(blocks, hashes))
        self.cached_blocks = len(self.block_hash)
        cached, first = self.cached, self.first
        for b, h in zip(blocks, hashes):
            same = cached.get(h)
            if same is None:
                cached[h] = {b: None}
                first[h] = b
                if self.lookups_short:
                    self.lookups_short.clear()
            else:
                same[b] = None
        self.num_cached[rid] = max(start, full)

    def free_request(self, rid: int, blocks: int, preempted: bool = False,
                     computed: int | None = None) -> None:
        """Request `rid`, holding `blocks` blocks for its `computed` tokens (default: its prompt),
        finished or (`preempted`) was preempted. A preempted request's own full blocks (prompt and
        generated tokens: vLLM hashes every full block of a request) are cached first, so that its
        resumption can hit them. Its hashless blocks (its tail) join the free queue first, then its
        identified blocks, last first, each once nobody references it (keeping its hash)."""
        chain = self.hashes[rid]
        if preempted or (chain and self.num_cached.get(rid, 0) < len(chain)):  # (else all named)
            tokens = int(self.prompt[rid]) if computed is None else computed
            full = min(blocks, tokens // self.block_size)
            if preempted and full > len(chain):
                self.own_cached[rid] = full - len(chain)
                chain = chain + [own_hash(rid, i) for i in range(len(chain), full)]
            # a chain past the prompt (a multi-turn session's, sim/workload/sessions.py) names its generated
            # blocks too: the next turn of the conversation may hit them
            full = min(full, len(chain))
            if full > self.num_cached.get(rid, 0):
                self._claim(rid, full, chain)
        held = self.held.pop(rid, None)
        if held is None and not self.queued:  # hashless blocks, freed to a queue of hashless blocks
            self.free += blocks
            return
        if held is None:
            held = []
        else:
            self.num_cached.pop(rid, None)
        k = blocks - len(held)
        if k:
            # vLLM hashes every full block of a request (these are anonymous here only because
            # nobody else can hit them): they join the tail; a partly filled block has no hash and
            # joins the head, to be reused first (BlockPool.free_blocks). Unknown `computed`: all
            # at the tail.
            partial = min(k, blocks - computed // self.block_size) if computed is not None else 0
            self._queue_hashless(k - partial, partial)
        if not held:
            return
        hits = self.group.pop(rid, None)
        if hits is not None:
            left = self.holders[id(hits)] - 1
            if left:  # the group's blocks stay referenced: only the blocks past them
                self.holders[id(hits)] = left
                held = held[len(hits):]
                if not held:
                    return
            else:
                del self.holders[id(hits)]
        ref, queued, queue, named = self.ref, self.queued, self.queue, self.block_hash
        for b in held:
            ref[b] -= 1
        if 0 not in map(ref.__getitem__, held):  # every block stays referenced by another request
            return
        gen = start = self.generation
        if not any(map(ref.__getitem__, held)) and all(map(named.__contains__, held)):
            # nobody else holds any of them, all cached (a prompt nobody shared): all to the tail,
            # last block first, each under its own generation
            if not queued:
                self._one_segment()
            entries = list(zip(reversed(held), range(gen + 1, gen + 1 + len(held))))
            queued.update(entries)
            queue.extend(entries)
            self.free += len(held)
            self.generation = gen + len(held)
            return
        for b in reversed(held):  # last block first: those nobody references any more
            if not ref[b]:
                if b not in named:  # never cached (e.g. claimed then nothing): hashless
                    self.ids.append(b)
                    self._queue_hashless(0, 1)
                    continue
                if not queued:  # the first cached block to wait: the hashless ones ahead of it
                    self._one_segment()
                gen += 1
                queued[b] = gen
                queue.append((b, gen))
        self.free += gen - start  # (each queued entry has its own generation)
        self.generation = gen
