"""sim/kv/prefix_cache.py against a deliberately plain reference model of vLLM V1's block pool (lists
and linear scans), on random operation sequences; plus hand-worked cases."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from block_pool import PrefixCache

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
        first, last = [], []  # vLLM 0.32: hashless blocks to the head (reused first), hashed to the tail
        for b in reversed(self.held.pop(rid, [])):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                (first if self.hash[b] is None else last).append(b)
        self.free = first + self.free + last
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


kv_ops = st.lists(st.one_of(st.tuples(st.just("admit"), st.integers(0, 5)),
                            st.tuples(st.just("grow"), st.integers(0, 5), st.integers(1, 3)),
                            st.tuples(st.just("free"), st.integers(0, 5))), max_size=60)
prompt = st.tuples(st.integers(0, 2), st.integers(0, 6), st.integers(1, 7))


@settings(max_examples=400, deadline=None)
@given(st.integers(4, 24), st.lists(prompt, min_size=6, max_size=6), kv_ops)
def test_the_simulators_kv_cache_matches_the_reference(num_blocks, prompts, ops):
    """sim/kv/prefix_cache.PrefixKVCache (run-length segments for hashless blocks, lazy hits) against
    the same reference, on everything a simulation can observe: hits, success, free blocks, the
    order of evictions and the cached hashes. Requests have fixed prompts: `shared` blocks of
    document `doc` (shared chains) and `extra` tokens more; only shared blocks carry hashes."""
    _kv_cache_against_the_reference(num_blocks, prompts, ops)


@settings(max_examples=400, deadline=None)
@given(st.integers(4, 24), st.lists(prompt, min_size=3, max_size=3), kv_ops)
def test_the_simulators_kv_cache_matches_the_reference_with_repeated_prompts(num_blocks, prompts, ops):
    """The same, each prompt sent by two requests (rids i and i + 3): they get the same hit list,
    held as one group (PrefixKVCache.group) while either runs."""
    _kv_cache_against_the_reference(num_blocks, prompts + prompts, ops)


def test_groups_lookups_and_evictions_against_the_reference():
    """Directed sequences against the reference model: a group's last holder leaving (its blocks
    to the free queue, last first) and the next request with the same hit list taking them back,
    a hit through a shorter prefix of the same blocks, evictions from the queue's head, and taking
    a hit list back when its blocks and one more do not fit (`crowded`), for 7 to 13 blocks.
    Requests 0-2 share a 3-block prompt of document 0, request 3 its first block, 4 and 5 a
    2-block prompt of document 1 (whose commit adds hashes: the lookup of 0-2 stays remembered)."""
    prompts = [(0, 3, 1), (0, 3, 1), (0, 3, 1), (0, 1, 1), (1, 2, 1), (1, 2, 1)]
    ops = [("admit", 0), ("admit", 1), ("free", 0), ("free", 1),
           ("admit", 2), ("free", 2),
           ("admit", 4), ("admit", 5), ("free", 4), ("free", 5),
           ("admit", 3),
           ("grow", 3, 3), ("grow", 3, 3),
           ("free", 3), ("admit", 0), ("admit", 1), ("free", 0)]

    def crowded(num_blocks):  # only request 1's 3 freed blocks are free when 2 asks for them + 1
        return [("admit", 0), ("admit", 1), ("free", 0), ("free", 1), ("admit", 4),
                ("grow", 4, num_blocks - 6), ("admit", 2), ("free", 4), ("admit", 2), ("free", 2)]

    for num_blocks in range(7, 14):
        _kv_cache_against_the_reference(num_blocks, prompts, ops)
        _kv_cache_against_the_reference(num_blocks, prompts, crowded(num_blocks))


def _kv_cache_against_the_reference(num_blocks, prompts, ops):
    from sim.kv.prefix_cache import PrefixKVCache

    made: dict = {}  # one chain object per distinct prefix, shared as request_chains shares them
    chains = [made.setdefault((doc, shared), [(doc, i) for i in range(shared)]) for doc, shared, _ in prompts]
    tokens = [len(c) * BS + extra for c, (_, _, extra) in zip(chains, prompts)]
    kv = PrefixKVCache(num_blocks, BS, chains, tokens)
    ref = ReferencePool(num_blocks)
    admissions = 0
    shared = lambda hashes: [h for h in hashes if h[0] != "own"]  # noqa: E731
    for o in ops:
        rid = o[1]
        if o[0] == "admit" and rid not in ref.held:
            hits = kv.lookup(rid, tokens[rid])
            ref_hits = ref.lookup(chains[rid], tokens[rid])
            assert len(hits) == len(ref_hits)
            need = -(-tokens[rid] // BS) - len(hits)
            ok = kv.admit(rid, hits, need, tokens[rid])
            assert ok == ref.allocate(rid, ref_hits, need)
            if ok:
                kv.commit(rid, tokens[rid])
                # vLLM hashes the request's own full blocks too: never hit (unique per admission),
                # but hashed blocks are freed to the tail and the rest to the head
                admissions += 1
                own = [("own", rid, admissions, i) for i in range(len(chains[rid]), tokens[rid] // BS)]
                ref.cache(rid, chains[rid] + own, tokens[rid] // BS)
        elif o[0] == "grow" and rid in ref.held:
            assert kv.allocate(o[2]) == ref.allocate(rid, [], o[2])
        elif o[0] == "free" and rid in ref.held:
            kv.free_request(rid, len(ref.held[rid]), computed=tokens[rid])
            ref.free_request(rid)
        assert kv.free == len(ref.free) and kv.evicted == shared(ref.evicted)
        assert sorted(map(repr, (h for h, bs in kv.cached.items() for _ in bs))) == \
            sorted(repr(h) for h, _ in ref.cache_order if h[0] != "own")
        assert kv.used == num_blocks - len(ref.free)
        assert kv.cached_blocks == sum(map(len, kv.cached.values()))  # (kept as a count)


def test_a_shared_prefix_hit_after_the_first_request_frees_its_blocks():
    """4-token blocks, 6 blocks. A: 3 shared blocks + 2 own tokens (4 blocks). Freed, A's blocks
    wait in the free queue keeping their hashes; B with the same 3-block prefix hits all 3 (its
    prompt is 14 tokens: (14 - 1) // 4 = 3 blocks may hit) and needs 1 new block, which comes from
    the head of the free queue: block 3, A's partial block, which has no hash and so was put at the
    head to be reused first (vLLM 0.32), not a cached one."""
    pool = PrefixCache(6, BS)
    prefix = ["p0", "p1", "p2"]
    assert pool.cached_prefix(prefix, 14) == []
    assert pool.allocate(0, [], 4)                      # blocks 0, 1, 2, 3
    pool.cache_full_blocks(0, prefix, 14 // BS)          # 3 full blocks cached
    pool.free_request(0)            # last block first: 3 (no hash) to the head, 2, 1, 0 to the tail
    assert list(pool.free_queue) == [3, 4, 5, 2, 1, 0]
    hits = pool.cached_prefix(prefix, 14)
    assert hits == [0, 1, 2]
    assert pool.allocate(1, hits, 1)
    assert pool.held[1] == [0, 1, 2, 3] and pool.evicted == []
    assert list(pool.free_queue) == [4, 5]


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
    pool.free_request(0)            # its uncached block 2 goes to the head, to be reused first
    assert pool.ref[:4] == [1, 1, 0, 1] and list(pool.free_queue) == [2, 4, 5]


# ---------------------------------------------------------------- in the simulator

import json as _json
from pathlib import Path

import numpy as np
import pytest

from sim.config.errors import ScenarioError
from sim.scenario import scenario_from_dict
from sim.simulate import simulate
from sim.workload.generators import Workload
from sim.workload.traces import read_trace
from simhelpers import make_scenario

ROOT = Path(__file__).resolve().parents[2]


def test_mooncake_hit_rate_equals_the_hash_ids_under_an_infinite_cache():
    """The bundled Mooncake sample, one request at a time (1000 s apart, so each finishes before
    the next arrives), 512-token blocks (Mooncake's own) and room for everything: the simulated
    hit rate equals the one computed directly from hash_ids here (a request hits the longest
    prefix of its ids already cached, at most (prompt - 1) // 512 blocks; it caches its full
    blocks), and TTFT is lower than with caching off."""
    trace = ROOT / "scenarios/traces/mooncake_conv.jsonl"
    rows = [_json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
    seen, hit, queried = set(), 0, 0
    for r in rows:
        ids, n = r["hash_ids"], r["input_length"]
        k = 0
        while k < min(len(ids), (n - 1) // 512) and ids[k] in seen:
            k += 1
        hit, queried = hit + 512 * k, queried + n
        seen.update(ids[: n // 512])
    table = read_trace(trace)
    w = Workload(arrival_s=np.arange(len(table)) * 1000.0, prompt_tokens=table["prompt_tokens"].to_numpy(),
                 output_tokens=table["output_tokens"].to_numpy(), priority=np.zeros(len(table), np.int64),
                 prefix=table["prefix"].tolist())
    results = {}
    for on in (True, False):
        sc = make_scenario(cost_model="roofline", scheduler="chunked", block_size=512, num_gpu_blocks=100_000,
                           max_num_batched_tokens=8192, enable_prefix_caching=on)
        results[on] = simulate(sc, workload=w)
    s = results[True].summary
    assert s["completed"] == len(rows) and s["prefix_cache_hit_rate"] == hit / queried
    assert hit > 0  # the sample's prompts do share prefixes (3.3% of tokens, one at a time)
    assert results[True].requests["cached_tokens"].sum() == hit
    assert "prefix_cache_hit_rate" not in results[False].summary
    assert s["ttft_ms"]["mean"] < results[False].summary["ttft_ms"]["mean"]


def _two(enable):
    """A and B share a 12-token (3-block) system prompt; 14-token prompts, 2 output tokens, unit
    cost, block_size 4. B arrives at 5, after A has finished (at 2) and freed its blocks."""
    w = Workload(arrival_s=np.array([0.0, 5.0]), prompt_tokens=np.array([14, 14]),
                 output_tokens=np.array([2, 2]), priority=np.zeros(2, np.int64),
                 prefix=[((("system",),), 12)] * 2)
    sc = make_scenario(scheduler="chunked", block_size=4, max_num_seqs=8, max_num_batched_tokens=64,
                       enable_prefix_caching=enable)
    return simulate(sc, workload=w)


def test_a_shared_prefix_timeline_by_hand():
    """With caching, B finds A's 3 full prompt blocks (12 tokens; (14 - 1) // 4 = 3 may hit) and
    prefills only its last 2 tokens in [5, 6]; its first token comes at 6 and it finishes at 7."""
    on, off = _two(True), _two(False)
    cols = ["start_s", "count", "prefill_tokens", "decode_tokens"]
    assert on.steps[cols].values.tolist() == [[0, 1, 14, 0], [1, 1, 0, 1], [5, 1, 2, 0], [6, 1, 0, 1]]
    assert off.steps[cols].values.tolist() == [[0, 1, 14, 0], [1, 1, 0, 1], [5, 1, 14, 0], [6, 1, 0, 1]]
    assert on.requests["cached_tokens"].tolist() == [0, 12]
    assert on.requests["first_token_s"].tolist() == [1.0, 6.0] and on.requests["finish_s"].tolist() == [2.0, 7.0]
    assert on.summary["prefix_cache_hit_rate"] == 12 / 28
    # cached blocks over time (steps.csv, with caching only): none while A prefills, then A's 3
    # shared blocks, kept (free, hashed) until B hits them; B's own blocks are not cached
    assert on.steps["kv_blocks_cached"].tolist() == [0, 3, 3, 3]
    assert "kv_blocks_cached" not in off.steps


def test_a_generated_shared_prefix_hits_and_the_knob_rules(tmp_path):
    base = {"model": "llama-3-8b", "hardware": "h100-sxm", "cost_model": "roofline",
            "engine": {"scheduler": "chunked"},
            "workload": {"arrival": {"process": "poisson", "rate": 2}, "num_requests": 60,
                         "prompt_tokens": {"dist": "fixed", "value": 1200},
                         "output_tokens": {"dist": "fixed", "value": 20},
                         "prefix": {"tokens": 1024, "groups": 2, "share": 1.0}}}
    r = simulate(scenario_from_dict(base))
    # 60 requests, 2 system prompts of 1024 tokens = 64 blocks: all but the first of each group
    # hit them (at most; concurrent first requests may both miss)
    assert 0.7 < r.summary["prefix_cache_hit_rate"] <= 58 * 1024 / (60 * 1200)
    off = simulate(scenario_from_dict({**base, "engine": {"scheduler": "chunked", "enable_prefix_caching": False}}))
    assert "prefix_cache_hit_rate" not in off.summary
    assert r.summary["ttft_ms"]["mean"] < off.summary["ttft_ms"]["mean"]
    with pytest.raises(ScenarioError, match="engine.enable_prefix_caching: the static scheduler has no prefix caching"):
        scenario_from_dict({**base, "engine": {"scheduler": "static", "enable_prefix_caching": True}})
    with pytest.raises(ScenarioError, match="workload.prefix.share: 1.5"):
        scenario_from_dict({**base, "workload": {**base["workload"], "prefix": {"tokens": 8, "groups": 1,
                                                                                 "share": 1.5}}})


def test_invariants_under_pressure_with_caching():
    """A small cache that evicts and preempts: every request finishes once, blocks stay within
    capacity, reference counts never go negative and the cache ends empty but for cached blocks."""
    rng = np.random.default_rng(3)
    n = 80
    prompt = rng.integers(20, 200, n)
    w = Workload(arrival_s=np.sort(rng.uniform(0, 1, n)), prompt_tokens=prompt,
                 output_tokens=rng.integers(1, 60, n), priority=np.zeros(n, np.int64),
                 prefix=[((("doc", int(g)),), 96) if g < 3 else None for g in rng.integers(0, 5, n)])
    import sim.simulate as sim_mod

    sc = make_scenario(cost_model="roofline", scheduler="chunked", block_size=16, num_gpu_blocks=30,
                       max_num_seqs=16, max_num_batched_tokens=256)
    r = sim_mod.simulate(sc, workload=w)
    assert r.summary["completed"] == n and r.summary["preemptions"] > 0
    assert (r.steps["kv_blocks_used"] <= r.steps["kv_blocks_total"]).all()
    assert 0 < r.summary["prefix_cache_hit_rate"] < 1


def _routed(router: str):
    """8 requests, 10 s apart (each finishes before the next), system prompts A A B B A A B B of
    3 blocks (block_size 4), 14-token prompts, 2 replicas."""
    groups = ["A", "A", "B", "B", "A", "A", "B", "B"]
    w = Workload(arrival_s=np.arange(8) * 10.0, prompt_tokens=np.full(8, 14), output_tokens=np.full(8, 2),
                 priority=np.zeros(8, np.int64), prefix=[(((g,),), 12) for g in groups])
    sc = make_scenario(scheduler="chunked", block_size=4, max_num_seqs=8, max_num_batched_tokens=64,
                       replicas=2, router=router)
    return simulate(sc, workload=w)


def test_prefix_aware_routing_by_hand():
    """Round robin sends A to replicas 0, 1, 0, 1: the second A misses on replica 1, so does each
    group's first visit to each replica: hits at requests 4-7 only (4 x 12 tokens). Prefix-aware:
    request 0 goes to the lightest (0, tie -> lower index); request 1 finds A cached on replica 0;
    B (2) is cached nowhere: lightest, replica 0 again (all idle); then every request hits on
    replica 0: 6 x 12 tokens."""
    rr, pa = _routed("round_robin"), _routed("prefix_aware")
    assert rr.requests["replica"].tolist() == [0, 1, 0, 1, 0, 1, 0, 1]
    assert pa.requests["replica"].tolist() == [0] * 8
    assert rr.summary["prefix_cache_hit_rate"] == 4 * 12 / (8 * 14)
    assert pa.summary["prefix_cache_hit_rate"] == 6 * 12 / (8 * 14)


def test_prefix_aware_gives_way_to_load():
    """The rule, with stand-in caches: replica 0 holds 3 blocks of the request's prefix, replica 1
    none. It wins while its load is at most 2 x the lightest + 1, and loses beyond."""
    from sim.runtime.routers import PrefixAware

    class Cache:
        def __init__(self, hit):
            self.hit, self.prompt = hit, [100]

        def lookup(self, rid, num_tokens):
            return [0] * self.hit

    from types import SimpleNamespace

    seen = lambda *caches: SimpleNamespace(caches=list(caches))  # noqa: E731  (what Signals carries)
    r = PrefixAware(2)
    r.attach(seen(Cache(3), Cache(0)))
    assert r.choose(0, [3, 1]) == 0       # 3 <= 2 x 1 + 1
    assert r.choose(0, [4, 1]) == 1       # 4 > 3: the least loaded instead
    r.attach(seen(Cache(2), Cache(2)))
    assert r.choose(0, [5, 4]) == 1       # equal hits: the less loaded
    r.attach(seen(Cache(0), Cache(0)))
    assert r.choose(0, [2, 1]) == 1       # nothing cached: least loaded


def test_a_csv_hash_ids_column_drives_prefix_caching(tmp_path):
    import yaml

    from sim.scenario import load_scenario

    trace = Path(__file__).parents[2] / "scenarios" / "traces" / "shared_prefix.csv"
    raw = {"name": "csv-hashes", "model": "llama-3-8b", "hardware": "h100-sxm", "cost_model": "roofline",
           "engine": {"scheduler": "chunked", "block_size": 16},
           "workload": {"trace": str(trace), "hash_block_tokens": 16}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    r = simulate(load_scenario(tmp_path / "s.yaml"))  # requests 0.5 s apart: one at a time
    # ids '1 2 3', '1 2 4', '1 2', '': request 1 hits blocks 1, 2 (32 tokens); request 2's 24 tokens
    # may hit (24 - 1) // 16 = 1 block; request 3 has no ids
    assert r.requests["cached_tokens"].tolist() == [0, 32, 16, 0]
    assert r.summary["prefix_cache_hit_rate"] == pytest.approx(48 / (40 + 40 + 24 + 40))
    with pytest.raises(ScenarioError, match=r"shared_prefix_bad.csv:3: hash_ids 'a b' is not block ids"):
        bad = tmp_path / "shared_prefix_bad.csv"
        bad.write_text("arrival_s,prompt_tokens,output_tokens,hash_ids\n0,8,2,1\n1,8,2,a b\n")
        from sim.workload.traces import read_trace
        read_trace(bad)


def test_request_chains_equal_block_hashes_request_by_request():
    """The shared, sliced chains the scheduler builds are each request's own block_hashes: system
    prompts cut short by short prompts (one id, unit = the prompt), multi-id Mooncake-style prefixes,
    and requests with no prefix."""
    import random

    from sim.kv.prefix_cache import block_hashes, request_chains

    rng = random.Random(7)
    prefixes, prompts = [], []
    for _ in range(400):
        n = rng.randint(1, 3000)
        kind = rng.random()
        if kind < 0.4:
            p = (((("prefix", rng.randint(0, 2)),), min(512, n)))
        elif kind < 0.8:
            ids = tuple(rng.randint(0, 5) for _ in range(rng.randint(1, 6)))
            p = (ids[: 1 + rng.randint(0, len(ids) - 1)], 512)
        else:
            p = None
        prefixes.append(p)
        prompts.append(n)
    chains = request_chains(prefixes, prompts, 16)
    hashes = [block_hashes(p, rid, n, 16) for rid, (p, n) in enumerate(zip(prefixes, prompts))]
    assert list(map(len, chains)) == list(map(len, hashes))
    # each hash is named by one int, and each int names one hash
    pairs = {(name, h) for chain, hs in zip(chains, hashes) for name, h in zip(chain, hs)}
    assert len(pairs) == len({n for n, _ in pairs}) == len({h for _, h in pairs}) > 20
    assert len({id(c) for c in chains}) < len(chains)  # shared, not one list per request
