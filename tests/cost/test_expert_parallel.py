"""Data-parallel attention with expert parallelism (engine.data_parallel_size; sim/cost/expert_parallel.py):
memory per GPU, the all-to-all's bytes and time by hand, the run's engines, and the refusals."""
from __future__ import annotations

import shlex

import pandas as pd
import pytest

from sim.build import cost_model
from sim.config.errors import ScenarioError
from sim.cost.batch import BatchStats
from sim.cost.composer import TABLES
from sim.cost.expert_parallel import all_to_all_bytes_per_token, allgather_bytes_per_token, moe_layers
from sim.cost.step_cost import RooflineCost
from sim.planning.vllm_command import vllm_serve
from sim.presets.hardware import HARDWARE_PRESETS
from sim.presets.models import MODEL_PRESETS
from sim.scenario import scenario_from_dict
from sim.simulate import simulate

DS = MODEL_PRESETS["deepseek-v3"]  # 61 layers (3 dense), 256 routed experts, 8 a token, hidden 7,168
H200 = HARDWARE_PRESETS["h200"]
_ONE = {"arrival": {"process": "burst"}, "num_requests": 1, "prompt_tokens": {"dist": "fixed", "value": 1},
        "output_tokens": {"dist": "fixed", "value": 1}}


def _scenario(cost="roofline", workload=_ONE, **engine):
    return scenario_from_dict({"model": "deepseek-v3", "hardware": "h200", "cost_model": cost,
                               "engine": {"scheduler": "chunked", **engine}, "workload": workload})


def test_deepseek_v3_memory_per_gpu_at_dp8_ep8_by_hand():
    """DeepSeek-V3 (FP8 in 128 x 128 blocks with fp32 scales, routers bf16): 673,150,552,416 weight
    bytes, 654,068,416,512 of them routed experts (653,908,770,816 of values and 159,645,696 of their
    scales: 2,554,954,752 per expert index over the 58 MoE layers). DP8 x TP1 with EP: each GPU keeps
    the 19,082,135,904 bytes of everything else whole and 256 / 8 = 32 experts: 100,840,687,968
    bytes. TP8 (EP or not): everything else split 8 ways."""
    dp = _scenario(data_parallel_size=8, enable_expert_parallel=True)
    experts = 653_908_770_816 + 159_645_696
    rest = 672_880_769_024 + 110_137_696 + 159_645_696 - experts
    assert rest == 19_082_135_904 and experts // 256 == 2_554_954_752
    assert dp.budget.weight_bytes_per_gpu == rest + 32 * 2_554_954_752 == 100_840_687_968
    assert dp.engine.gpus_per_replica == 8
    tp = _scenario(tensor_parallel_size=8, enable_expert_parallel=True)
    assert tp.budget.weight_bytes_per_gpu == rest / 8 + 32 * 2_554_954_752
    # MLA keeps the whole latent on every TP rank: TP8's eight GPUs hold one cache's worth of
    # tokens; DP8's eight hold eight caches
    assert dp.budget.kv_bytes_per_token == tp.budget.kv_bytes_per_token


def test_the_all_to_all_by_hand():
    """vLLM's default allgather_reducescatter over 8 ranks: a rank receives the other 7 ranks' hidden
    states (7,168 x 2 bytes each) and as many back: 2 x 7 x 14,336 = 200,704 bytes per own token per
    MoE layer, as DeepEP's dispatch of a token to its 8 experts, 7/8 elsewhere, and back (2 x 8 x
    14,336 x 7 / 8). Over NVLink (450 GB/s, 2 us a transfer, two a layer) a step of T tokens adds
    58 x (4 us + T x 200,704 / 450e9)."""
    assert all_to_all_bytes_per_token(DS, 8) == 200_704 == allgather_bytes_per_token(DS, 8) and moe_layers(DS) == 58
    sc = _scenario(data_parallel_size=8, enable_expert_parallel=True)
    cost = cost_model(sc)
    inner = RooflineCost(DS, H200, 1, data_parallel_size=8)
    stats = BatchStats(num_decodes=32, decode_context_sum=32 * 2000)
    assert cost.step_time(stats) == pytest.approx(inner.step_time(stats) + 58 * (4e-6 + 32 * 200_704 / 450e9),
                                                  rel=1e-12)
    # 16 ranks span two nodes: InfiniBand, 50 GB/s and 5 us; the all-gather grows with the ranks
    # (2 x 15 x 14,336 a token) where DeepEP's dispatch would not (2 x 8 x 14,336 x 15 / 16)
    wide = cost_model(_scenario(data_parallel_size=16, enable_expert_parallel=True))
    inner16 = RooflineCost(DS, H200, 1, data_parallel_size=16)
    per_token = 2 * 15 * 7168 * 2
    assert wide.step_time(stats) == pytest.approx(inner16.step_time(stats) + 58 * (10e-6 + 32 * per_token / 50e9),
                                                  rel=1e-12)
    deepep = cost_model(_scenario(data_parallel_size=16, enable_expert_parallel=True,
                                  all2all_backend="deepep_high_throughput"))
    assert deepep.measured is None  # (timed at EP8 on one node only)
    assert deepep.step_time(stats) == pytest.approx(
        inner16.step_time(stats) + 58 * (10e-6 + 32 * 2 * 8 * 7168 * 2 * 15 / 16 / 50e9), rel=1e-12)


def test_deepep_at_ep8_is_priced_from_its_measured_dispatch_and_combine():
    """DeepSeek-V3 at DP8 on H200 with DeepEP's low-latency kernels: each MoE layer costs the dispatch
    and the combine AIConfigurator timed at the rank's tokens (moe_a2a.csv, us converted to ms), read
    here off the table by hand: at 128 tokens 112.1 + 100.6 us (below ~100 tokens the low-latency timings
    are a noisy ~50 us plateau that the monotone fit evens out); and the run says the all-to-all is measured."""
    table = pd.read_csv(TABLES / "h200_sxm" / "moe_a2a.csv")
    rows = table[(table["comm_backend"] == "deepep_ll") & (table["ep_size"] == 8) & (table["hidden_size"] == 7168)
                 & (table["topk"] == 8) & (table["num_experts"] == 256) & (table["num_tokens"] == 128)]
    layer_ms = float(rows["latency_ms"].sum())
    assert len(rows) == 2 and layer_ms == pytest.approx(0.1121 + 0.1006, abs=2e-4)
    sc = _scenario(cost=None, data_parallel_size=8, enable_expert_parallel=True, all2all_backend="deepep_low_latency")
    assert "its deepep_low_latency all-to-all measured (DeepEP at EP8" in sc.cost_model.notice
    cost = cost_model(sc)
    stats = BatchStats(num_decodes=128, decode_context_sum=128 * 2000)
    assert cost.step_time(stats) == pytest.approx(cost.inner.step_time(stats) + 58 * layer_ms / 1e3, rel=1e-9)
    default = _scenario(cost=None, data_parallel_size=8, enable_expert_parallel=True)
    assert "allgather_reducescatter all-to-all a stated model" in default.cost_model.notice
    with pytest.raises(ScenarioError, match="engine.all2all_backend: 'deepep_low_latency' is used by expert parallelism"):
        _scenario(all2all_backend="deepep_low_latency")


def test_a_rank_reads_its_share_of_the_experts_touched_by_every_rank():
    """A DP8 rank's GPU holds 1/8 of the experts, as a TP8 GPU does; they are touched by the tokens
    of all 8 ranks: one decode per rank touches what 8 decodes do on one TP8 replica, so the expert
    reads match while the rest of the step (attention, everything else whole) is the rank's own."""
    dp, tp = RooflineCost(DS, H200, 1, data_parallel_size=8), RooflineCost(DS, H200, 8)
    expert_s_dp, miss = dp._moe
    expert_s_tp, _ = tp._moe
    assert expert_s_dp == pytest.approx(expert_s_tp, rel=1e-12)
    one = BatchStats(num_decodes=1, decode_context_sum=100)
    flat = RooflineCost(DS, H200, 1)  # the same rank without the group: every expert, its own token
    assert dp.step_time(one) < flat.step_time(one)
    assert 1 - miss ** 8 == pytest.approx(1 - (1 - 8 / 256) ** 8)


def test_data_parallel_ranks_run_as_engines_and_say_so_to_vllm():
    w = {"arrival": {"process": "poisson", "rate": 4}, "num_requests": 80,
         "prompt_tokens": {"dist": "fixed", "value": 500}, "output_tokens": {"dist": "fixed", "value": 20}}
    sc = _scenario(workload=w, data_parallel_size=4, enable_expert_parallel=True, tensor_parallel_size=2,
                   router="least_loaded")
    words = shlex.split(vllm_serve(sc))
    assert words[words.index("--data-parallel-size") + 1] == "4" and "--enable-expert-parallel" in words
    r = simulate(sc)
    assert r.summary["completed"] == 80
    assert sorted(r.steps["replica"].unique()) == [0, 1, 2, 3]  # four engines, one per DP rank
    assert sc.engine.gpus_per_replica == 8
    assert "estimated (roofline)" in _scenario(cost=None, data_parallel_size=8,
                                               enable_expert_parallel=True).cost_model.notice
    with pytest.raises(ScenarioError, match="raise tensor_parallel_size or data_parallel_size"):
        _scenario(data_parallel_size=2, enable_expert_parallel=True)  # 345.9 GB a GPU


def test_the_knobs_refusals():
    for engine, message in (
            ({"data_parallel_size": 2}, "modelled with expert parallelism (set engine.enable_expert_parallel"),
            ({"data_parallel_size": 2, "enable_expert_parallel": True, "pipeline_parallel_size": 2},
             "with engine.pipeline_parallel_size > 1 is not modelled"),
            ({"data_parallel_size": 2, "enable_expert_parallel": True, "scheduler": "static"},
             "with the static scheduler is not modelled")):
        with pytest.raises(ScenarioError, match=message.replace("(", r"\(")):
            _scenario(**engine)
    with pytest.raises(ScenarioError, match="no measured profile covers DP/EP"):
        _scenario(cost="measured", data_parallel_size=8, enable_expert_parallel=True)
    with pytest.raises(ScenarioError, match="llama-3-8b is not a mixture of experts.*engine.replicas: 2"):
        scenario_from_dict({"model": "llama-3-8b", "hardware": "h100-sxm", "workload": _ONE,
                            "engine": {"data_parallel_size": 2}})
