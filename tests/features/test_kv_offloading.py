"""KV offloading to CPU memory (sim/features/kv_offloading/cpu_tier.py; vLLM's --kv-offloading-size): timelines worked
by hand with the unit cost model, the LRU rules, and the knobs' refusals."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from sim.config.errors import ScenarioError
from sim.features.kv_offloading import offload_spec
from sim.features.kv_offloading.cpu_tier import CpuOffload, OffloadSpec
from sim.planning.vllm_command import vllm_serve
from sim.presets.hardware import HARDWARE_PRESETS, is_preset
from sim.scenario import scenario_from_dict
from sim.simulate import simulate
from sim.workload.generators import Workload
from simhelpers import make_workload

# llama-3-8b: 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 bytes = 131,072 bytes a token; a 4-token
# block is 524,288 bytes, so a host link of 524,288 B/s loads one block a second
BLOCK_BYTES = 4 * 131_072
HW = {"name": "h100-sxm", "memory_bytes": 80e9, "hbm_bandwidth": 3.35e12, "bf16_flops": 989e12,
      "interconnect_bandwidth": 450e9, "host_bandwidth": BLOCK_BYTES}
_ONE = {"arrival": {"process": "burst"}, "num_requests": 1, "prompt_tokens": {"dist": "fixed", "value": 1},
        "output_tokens": {"dist": "fixed", "value": 1}}


def _gib(blocks: int) -> float:
    return blocks * BLOCK_BYTES / 2**30


def _scenario(cpu_blocks: int | None, hardware=None, **engine):
    e = {"block_size": 4, **engine}
    if cpu_blocks is not None:
        e["kv_offloading_size"] = _gib(cpu_blocks)
    return scenario_from_dict({"model": "llama-3-8b", "hardware": hardware or HW, "cost_model": "unit",
                               "engine": e, "workload": _ONE})


def _evicted_prefix(cpu_blocks: int | None):
    """A and B share a 12-token (3-block) prefix (14-token prompts, 2 output tokens); C (16 tokens,
    nothing shared) runs between them on a 5-block GPU cache and evicts A's cached blocks there."""
    w = Workload(arrival_s=np.array([0.0, 4.0, 10.0]), prompt_tokens=np.array([14, 16, 14]),
                 output_tokens=np.array([2, 2, 2]), priority=np.zeros(3, np.int64),
                 prefix=[((("system",),), 12), None, ((("system",),), 12)])
    sc = _scenario(cpu_blocks, scheduler="chunked", max_num_seqs=8, max_num_batched_tokens=64, num_gpu_blocks=5)
    return simulate(sc, workload=w)


def test_a_cpu_hit_costs_the_transfer_and_skips_the_recompute():
    """A (0-2) stores its 3 shared blocks to CPU as they are computed; C (4-6) evicts them from the
    GPU. B arrives at 10: no GPU hit, 3 CPU hits, loaded at 1 block/s -> in at 13, while nothing else
    runs (the replica sleeps until then); [13,14] B prefills its last 2 tokens only, first token at
    14, done at 15. Without offloading B recomputes all 14 tokens in [10,11]."""
    on, off = _evicted_prefix(100), _evicted_prefix(None)
    cols = ["start_s", "count", "prefill_tokens", "decode_tokens"]
    assert off.steps[cols].values.tolist() == [[0, 1, 14, 0], [1, 1, 0, 1], [4, 1, 16, 0], [5, 1, 0, 1],
                                               [10, 1, 14, 0], [11, 1, 0, 1]]
    assert on.steps[cols].values.tolist() == [[0, 1, 14, 0], [1, 1, 0, 1], [4, 1, 16, 0], [5, 1, 0, 1],
                                              [13, 1, 2, 0], [14, 1, 0, 1]]
    assert on.requests["first_token_s"].tolist() == [1.0, 5.0, 14.0]
    assert on.requests["finish_s"].tolist() == [2.0, 6.0, 15.0]
    assert on.requests["cached_tokens"].tolist() == [0, 0, 12]  # vLLM counts loaded tokens as cached
    assert on.summary["prefix_cache_hit_rate"] == 0.0  # the GPU's own
    k = on.summary["kv_offloading"]
    # queried: 14 + 16 + 14 prompt tokens; stored: A's 3 shared blocks, then C's 4 full own blocks
    # (17 tokens computed when it finished) as one run; B's 3 were there already
    assert k["cpu_hit_rate"] == 12 / 44 and k["cpu_hit_tokens"] == 12 and k["loads"] == 1
    assert k["load_ms"]["mean"] == 3000.0 and k["stored_blocks"] == 7 and k["evicted_blocks"] == 0
    assert "kv_offloading" not in off.summary


def test_a_cpu_tier_too_small_evicts_the_oldest_and_changes_nothing():
    """With room for 4 blocks, C's run of 4 evicts A's 3 (the least recently used): B finds nothing
    in either tier and recomputes, as without offloading."""
    small, off = _evicted_prefix(4), _evicted_prefix(None)
    assert small.steps.drop(columns=[]).equals(off.steps)
    k = small.summary["kv_offloading"]
    assert k["cpu_hit_tokens"] == 0 and k["loads"] == 0
    assert k["stored_blocks"] == 3 + 4 + 3 and k["evicted_blocks"] == 3 + 4  # B's 3 evict C's run


@pytest.mark.parametrize("ff", [True, False])
def test_a_preempted_request_loads_its_own_blocks_back(ff):
    """tests/schedulers/test_sim_schedulers.py's preemption timeline (A and B: prompt 4, output 7;
    4 GPU blocks of 4 tokens) with a CPU tier: B is preempted at 5 holding 2 full blocks, which go to
    CPU memory as its own run; the GPU evicts the second for A at 5. B resumes at 7 (A done): its first
    block is still on the GPU, its second comes from CPU (1 block, 1 s: in at 8), so only its ninth
    token is computed: [8,9] prefill 1 token -> token 6 at 9, token 7 at 10. Without the tier it
    recomputes 5 tokens in [7,8] and finishes at 9: here the load is the slower path (1 s a block)."""
    sc = _scenario(100, scheduler="continuous", max_num_seqs=2, max_num_batched_tokens=16, num_gpu_blocks=4)
    r = simulate(sc, workload=make_workload([0.0, 0.0], 4, 7), fast_forward=ff)
    assert r.requests["finish_s"].tolist() == [7.0, 10.0]
    assert r.requests["preemptions"].tolist() == [0, 1]
    rows = r.steps[["start_s", "num_seqs", "prefill_tokens", "decode_tokens"]].values.tolist()
    assert rows[-4:] == [[5, 1, 0, 1], [6, 1, 0, 1], [8, 1, 1, 0], [9, 1, 0, 1]]
    k = r.summary["kv_offloading"]
    # queried: 4 + 4, then B's resumption 9; stored: B's 2 own blocks, A's 2 at its finish (10 tokens)
    assert k["cpu_hit_tokens"] == 4 and k["cpu_hit_rate"] == 4 / 17 and k["loads"] == 1
    assert k["load_ms"]["mean"] == 1000.0 and k["stored_blocks"] == 4


class _Cache:  # what CpuOffload reads of the GPU cache
    def __init__(self, hashes, block_size=4):
        self.hashes, self.block_size = hashes, block_size
        self.cached_tokens = [0] * len(hashes)


def test_lookups_touch_the_prompt_so_its_tail_is_evicted_first():
    """vLLM's touch: a looked-up prompt's blocks become the most recently used, its first block
    last of all; a store that needs room then evicts the least recently used."""
    kv = _Cache([[1, 2, 3], [4]])
    tier = CpuOffload(OffloadSpec(3, 0.5), kv)
    tier.computed(0, 12)                       # 1, 2, 3 stored
    assert list(tier.lru) == [1, 2, 3]
    assert tier.lookup(0, 13, gpu_hits=1) == 2  # blocks 2 and 3 after one GPU hit; touched 3, 2, 1
    assert list(tier.lru) == [3, 2, 1]
    tier.computed(1, 4)                        # 4 needs room: 3, the prompt's tail, goes
    assert list(tier.lru) == [2, 1, 4] and tier.evicted_blocks == 1
    assert tier.lookup(0, 13, gpu_hits=0) == 2  # 1, 2 then a gap
    assert tier.lookup(0, 8, gpu_hits=0) == 1   # the last token is always computed: 1 block at most


def test_a_block_being_loaded_is_not_evicted_and_loads_queue_on_the_link():
    kv = _Cache([[1, 2], [3, 4], [5, 6, 7]])
    tier = CpuOffload(OffloadSpec(4, 0.5), kv)
    tier.computed(0, 8)
    tier.computed(1, 8)                           # full: 1, 2, 3, 4
    assert tier.start_load(0, 0, 2, now=10.0) == 11.0  # 2 blocks x 0.5 s
    assert tier.start_load(1, 0, 1, now=10.5) == 11.5  # waits for the link: 11 + 0.5
    tier.computed(2, 12)  # 5, 6, 7 need 3 blocks: 1, 2 and 3 are being loaded, only 4 could go:
    assert list(tier.lru) == [1, 2, 3, 4] and tier.stored_blocks == 4  # none is stored (vLLM's rule)
    tier.loaded(0)
    tier.left(2, 12)  # now 1, 2 and 4 may go (3 stays pinned): stored as it leaves
    assert list(tier.lru) == [3, 5, 6, 7] and tier.evicted_blocks == 3 and tier.used == 4
    assert kv.cached_tokens == [8, 4, 0] and tier.hit_tokens == 12 and tier.loads == 2
    assert tier.load_seconds == [1.0, 1.0]


def test_the_tier_size_and_load_cost_follow_vllm_and_the_host_link():
    """llama-3-8b, block 16: 2 MiB a block on one GPU. 64 GiB at TP1: 32,768 blocks, each loaded in
    2 MiB / 64 GB/s. vLLM's size is over all TP ranks: at TP2 each rank keeps 32 GiB of 1 MiB
    half-blocks, 32,768 again, each half loaded over its own link in half the time."""
    def spec(tp):
        sc = scenario_from_dict({"model": "llama-3-8b", "hardware": "h100-sxm", "workload": _ONE,
                                 "engine": {"kv_offloading_size": 64, "tensor_parallel_size": tp}})
        return offload_spec(sc.features["kv_offloading"], sc)
    assert spec(1) == OffloadSpec(32_768, 2 * 2**20 / 64e9)
    assert spec(2) == OffloadSpec(32_768, 2**20 / 64e9)
    assert _scenario(None).features["kv_offloading"] is None


def test_the_knobs_refusals_and_the_vllm_command():
    for engine, message in (
            ({"kv_offloading_size": 0}, "engine.kv_offloading_size: 0 is not a number > 0"),
            ({"kv_offloading_size": 8, "kv_offloading_backend": "lmcache"},
             "engine.kv_offloading_backend: 'lmcache' is not modelled; only 'native'"),
            ({"kv_offloading_backend": "lmcache"}, "without engine.kv_offloading_size"),
            ({"kv_offloading_size": 8, "enable_prefix_caching": False}, "modelled over prefix caching"),
            ({"kv_offloading_size": 8, "scheduler": "static"}, "(the static scheduler has none)"),
            ({"kv_offloading_size": 8, "speculative": {"method": "ngram", "num_speculative_tokens": 2,
                                                                    "acceptance_rate": 0.5}},
             "engine.kv_offloading_size: not modelled together with engine.speculative"),
            ({"kv_offloading_size": 8, "disaggregation": {"prefill_replicas": 1, "decode_replicas": 1}},
             "engine.kv_offloading_size: not modelled together with engine.disaggregation"),
            ({"kv_offloading_size": 0.001}, "holds no KV block (2,097,152 bytes per GPU for llama-3-8b)")):
        with pytest.raises(ScenarioError, match=message.replace("(", r"\(").replace(")", r"\)")):
            scenario_from_dict({"model": "llama-3-8b", "hardware": "h100-sxm", "workload": _ONE, "engine": engine})
    no_link = {k: v for k, v in HW.items() if k != "host_bandwidth"}
    with pytest.raises(ScenarioError, match="hardware.host_bandwidth"):
        _scenario(10, hardware=no_link)
    sc = scenario_from_dict({"model": "llama-3-8b", "hardware": "h100-sxm", "workload": _ONE,
                             "engine": {"kv_offloading_size": 64}})
    assert "--kv-offloading-size 64 --kv-offloading-backend native" in vllm_serve(sc)
    # a preset's host link set to a measured figure keeps the preset's measured kernel tables
    assert is_preset(replace(HARDWARE_PRESETS["h100-sxm"], host_bandwidth=40e9))


def test_offloading_under_pressure_keeps_every_invariant():
    """Multi-turn chats on a small GPU cache: every request finishes; each request's cached tokens
    are its GPU hits plus its CPU loads; the CPU tier never holds more than its size; turning it on
    raises the share of prompt tokens not recomputed."""
    raw = {"model": "llama-3-8b", "hardware": "h100-sxm", "cost_model": "roofline", "seed": 3,
           "engine": {"scheduler": "chunked", "num_gpu_blocks": 1500, "max_num_seqs": 64},
           "workload": {"arrival": {"process": "closed_loop", "users": 40, "think_time": 1.0,
                                    "turns": {"dist": "fixed", "value": 4}},
                        "num_requests": 320, "prompt_tokens": {"dist": "fixed", "value": 600},
                        "output_tokens": {"dist": "fixed", "value": 60}}}
    off = simulate(scenario_from_dict(raw))
    raw["engine"]["kv_offloading_size"] = 4.0
    on = simulate(scenario_from_dict(raw))
    assert on.summary["completed"] == off.summary["completed"] == 320
    k = on.summary["kv_offloading"]
    assert k["loads"] > 0 and 0 < k["cpu_hit_rate"] < 1 and k["cpu_blocks_per_replica"] == 2048
    gpu, cpu = on.summary["prefix_cache_hit_rate"], k["cpu_hit_rate"]
    assert gpu + cpu > off.summary["prefix_cache_hit_rate"]
    queried = k["cpu_hit_tokens"] / cpu
    assert on.requests["cached_tokens"].sum() == pytest.approx(k["cpu_hit_tokens"] + gpu * queried, rel=1e-12)
    assert k["stored_blocks"] - k["evicted_blocks"] <= 2048  # what the tier holds at the end


def test_a_refused_knob_names_the_set_that_gave_it():
    """The --set that turned a knob bad is what the line names (the feature's own knob checks once
    blamed the scenario file for a --set engine.kv_offloading_backend)."""
    from sim.scenario import load_scenario
    for sets, says in ((["engine.kv_offloading_backend=lmcache"], "--set engine.kv_offloading_backend: 'lmcache' "
                                                                 "without engine.kv_offloading_size"),
                       (["engine.kv_offloading_size=0.001"], "--set engine.kv_offloading_size: 0.001 GiB over 1 "
                                                             "GPU(s) holds no KV block"),
                       (["engine.kv_offloading_size=8", "engine.enable_prefix_caching=false"],
                        "--set engine.kv_offloading_size: offloading is modelled over prefix caching")):
        with pytest.raises(ScenarioError) as e:
            load_scenario("scenarios/quickstart.yaml", overrides=sets)
        assert str(e.value).startswith(says), str(e.value)
