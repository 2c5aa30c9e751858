"""sim/prefix_cache.py against a deliberately plain reference model of vLLM V1's block pool (lists
and linear scans), on random operation sequences; plus hand-worked cases."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.prefix_cache import PrefixCache

BS = 4  # tokens per block


class ReferencePool:
    """The V1 rules written as plainly as possible: a list of free block ids (head evicted first),
    a list of (hash, block) in the order blocks were cached, a reference count per block."""

    def __init__(self, n: int):
        self.hash = [None] * n
        self.ref = [0] * n
        self.free = list(range(n))
        self.cache_order: list[tuple] = []
        self.held: dict[int, list[int]] = {}
        self.ncached: dict[int, int] = {}
        self.evicted: list = []

    def lookup(self, hashes, tokens):
        out = []
        for h in hashes[: max(tokens - 1, 0) // BS]:
            blocks = [b for hh, b in self.cache_order if hh == h]
            if not blocks:
                break
            out.append(blocks[0])
        return out

    def allocate(self, rid, hits, n):
        if n > len(self.free) - len([b for b in hits if self.ref[b] == 0]):
            return False
        if not self.held.get(rid):
            self.held[rid] = []
            self.ncached[rid] = len(hits)
        for b in hits:
            if self.ref[b] == 0:
                self.free.remove(b)
            self.ref[b] += 1
            self.held[rid].append(b)
        for _ in range(n):
            b = self.free.pop(0)
            if self.hash[b] is not None:
                self.cache_order.remove((self.hash[b], b))
                self.evicted.append(self.hash[b])
                self.hash[b] = None
            self.ref[b] = 1
            self.held[rid].append(b)
        return True

    def cache(self, rid, hashes, full):
        start = self.ncached.get(rid, 0)
        stop = min(full, len(hashes), len(self.held[rid]))
        for i in range(start, stop):
            b = self.held[rid][i]
            self.hash[b] = hashes[i]
            self.cache_order.append((hashes[i], b))
        self.ncached[rid] = max(start, stop)

    def free_request(self, rid):
        for b in reversed(self.held.pop(rid, [])):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free.append(b)
        self.ncached.pop(rid, None)


op = st.one_of(
    st.tuples(st.just("admit"), st.integers(0, 5), st.integers(0, 2), st.integers(0, 6), st.integers(1, 7)),
    st.tuples(st.just("grow"), st.integers(0, 5), st.integers(1, 3)),
    st.tuples(st.just("free"), st.integers(0, 5)),
)


@settings(max_examples=400, deadline=None)
@given(st.integers(4, 24), st.lists(op, max_size=60))
def test_block_pool_matches_the_reference(num_blocks, ops):
    real, ref = PrefixCache(num_blocks, BS), ReferencePool(num_blocks)
    hashes_of: dict[int, list] = {}
    for o in ops:
        rid = o[1]
        if o[0] == "admit" and rid not in ref.held:
            _, _, doc, shared, extra = o
            # a prompt of `shared` blocks of document `doc` (a chain every request of that
            # document shares), then blocks of its own, then `extra` tokens of a partial block
            own = [(doc, "own", rid, len(hashes_of), i) for i in range(2)]
            hashes = [(doc, i) for i in range(shared)] + own
            tokens = len(hashes) * BS + extra
            hashes_of[rid] = hashes
            hits = real.cached_prefix(hashes, tokens)
            assert hits == ref.lookup(hashes, tokens)
            need = -(-tokens // BS) - len(hits)
            assert real.allocate(rid, hits, need) == ref.allocate(rid, hits, need)
            if rid in ref.held:
                real.cache_full_blocks(rid, hashes, tokens // BS)
                ref.cache(rid, hashes, tokens // BS)
        elif o[0] == "grow" and rid in ref.held:
            assert real.allocate(rid, [], o[2]) == ref.allocate(rid, [], o[2])
        elif o[0] == "free":
            real.free_request(rid)
            ref.free_request(rid)
        assert real.free == len(ref.free) and list(real.free_queue) == ref.free
        assert real.evicted == ref.evicted and real.held == ref.held
        assert real.ref == ref.ref and min(real.ref) >= 0
        assert sorted(map(repr, ((h, b) for h, bs in real.cached.items() for b in bs))) == \
            sorted(map(repr, ref.cache_order))
        assert real.used == sum(1 for r in real.ref if r > 0)  # blocks held are exactly those referenced


def test_a_shared_prefix_hit_after_the_first_request_frees_its_blocks():
    """4-token blocks, 6 blocks. A: 3 shared blocks + 2 own tokens (4 blocks). Freed, A's blocks
    wait in the free queue keeping their hashes; B with the same 3-block prefix hits all 3 (its
    prompt is 14 tokens: (14 - 1) // 4 = 3 blocks may hit) and needs 1 new block, which comes from
    the head of the free queue: block 4 (never used), not a cached one."""
    pool = PrefixCache(6, BS)
    prefix = ["p0", "p1", "p2"]
    assert pool.cached_prefix(prefix, 14) == []
    assert pool.allocate(0, [], 4)                      # blocks 0, 1, 2, 3
    pool.cache_full_blocks(0, prefix, 14 // BS)          # 3 full blocks cached
    pool.free_request(0)                                 # tail first: 3, 2, 1, 0 join the queue
    assert list(pool.free_queue) == [4, 5, 3, 2, 1, 0]
    hits = pool.cached_prefix(prefix, 14)
    assert hits == [0, 1, 2]
    assert pool.allocate(1, hits, 1)
    assert pool.held[1] == [0, 1, 2, 4] and pool.evicted == []
    assert list(pool.free_queue) == [5, 3]


def test_the_last_token_is_always_computed():
    """A 12-token prompt of 3 cached blocks may hit only (12 - 1) // 4 = 2 of them."""
    pool = PrefixCache(8, BS)
    pool.allocate(0, [], 3)
    pool.cache_full_blocks(0, ["a", "b", "c"], 3)
    assert pool.cached_prefix(["a", "b", "c"], 12) == [0, 1]
    assert pool.cached_prefix(["a", "b", "c"], 13) == [0, 1, 2]


def test_eviction_under_pressure_takes_the_least_recently_freed_tail_first():
    """3 blocks. A caches a, b (2 blocks) and frees them (b, then a, join the queue after the
    never-used block 2). C needs 3 blocks: it takes 2, then b's block, then a's: evicting b
    before a, the prefix last."""
    pool = PrefixCache(3, BS)
    pool.allocate(0, [], 2)
    pool.cache_full_blocks(0, ["a", "b"], 2)
    pool.free_request(0)
    assert list(pool.free_queue) == [2, 1, 0]
    assert pool.allocate(1, [], 2)
    assert pool.evicted == ["b"] and pool.cached_prefix(["a", "b"], 9) == [0]
    assert not pool.can_allocate([], 2) and pool.allocate(1, [], 1)
    assert pool.evicted == ["b", "a"] and pool.cached == {}


def test_a_preempted_request_resumes_on_what_is_still_cached():
    """A (2 cached blocks + 1 partial) is preempted: its blocks are freed, not erased; while B
    takes only the never-used blocks, A's resumption hits both cached blocks."""
    pool = PrefixCache(5, BS)
    pool.allocate(0, [], 3)
    pool.cache_full_blocks(0, ["x", "y"], 2)
    pool.free_request(0)                                 # preemption
    pool.allocate(1, [], 2)                              # blocks 3 and 4
    hits = pool.cached_prefix(["x", "y"], 11)
    assert hits == [0, 1] and pool.allocate(0, hits, 1)  # block 2, uncached
    assert pool.ref == [1, 1, 1, 1, 1] and pool.evicted == []


def test_running_requests_share_blocks_through_reference_counts():
    pool = PrefixCache(6, BS)
    pool.allocate(0, [], 3)
    pool.cache_full_blocks(0, ["s0", "s1"], 2)
    hits = pool.cached_prefix(["s0", "s1"], 10)
    assert hits == [0, 1] and pool.allocate(1, hits, 1)
    assert pool.ref[:4] == [2, 2, 1, 1] and pool.used == 4
    pool.free_request(0)
    assert pool.ref[:4] == [1, 1, 0, 1] and list(pool.free_queue) == [4, 5, 2]
