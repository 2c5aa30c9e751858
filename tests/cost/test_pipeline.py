"""Pipeline parallelism (engine.pipeline_parallel_size; sim/cost/pipeline.py): the pipeline's period
and bubble by hand, the stage's memory, the hop's link, and the knob's refusals."""
from __future__ import annotations

import shlex

import numpy as np
import pytest

from sim.build import cost_model
from sim.config.errors import ScenarioError
from sim.cost.batch import BatchStats
from sim.cost.pipeline import PipelineCost, hop_link
from sim.cost.step_cost import RooflineCost, UnitCost
from sim.planning.search_report import _knobs
from sim.planning.vllm_command import vllm_serve
from sim.presets.hardware import HARDWARE_PRESETS
from sim.presets.memory import kv_bytes_per_token_per_rank
from sim.presets.models import MODEL_PRESETS, pipeline_stage
from sim.scenario import scenario_from_dict
from sim.simulate import simulate

H100 = HARDWARE_PRESETS["h100-sxm"]
_ONE = {"arrival": {"process": "burst"}, "num_requests": 1, "prompt_tokens": {"dist": "fixed", "value": 1},
        "output_tokens": {"dist": "fixed", "value": 1}}


def _decodes(n: int, context: int) -> BatchStats:
    return BatchStats(num_decodes=n, decode_context_sum=context)


def test_the_bubble_at_two_stages_by_hand():
    """Every microbatch takes one unit per stage (no hop). One request: its microbatch must cross
    both stages before it can go again, period 2 x 1 with one stage idle at a time (a 50% bubble);
    two requests: two microbatches keep both stages busy, period 1 + 1 = 2 for twice the work; three:
    microbatches of 2 and 1 decodes, still 2."""
    pipe = PipelineCost(UnitCost(), stages=2, microbatch_tokens=8192, hop_s_per_token=0.0, hop_latency_s=0.0)
    assert [pipe.step_time(_decodes(n, 10 * n)) for n in (1, 2, 3)] == [2.0, 2.0, 2.0]
    four = PipelineCost(UnitCost(), stages=4, microbatch_tokens=8192, hop_s_per_token=0.0, hop_latency_s=0.0)
    assert four.step_time(_decodes(1, 10)) == 4.0 and four.step_time(_decodes(6, 60)) == 4.0
    assert list(pipe.step_times(_decodes(1, 10), 3)) == [2.0, 2.0, 2.0]


def test_microbatches_split_decodes_evenly_and_prefills_by_tokens():
    """3 decodes (context 100) and a 10-token chunk at context 5 with 4 tokens a batch: decodes
    2 + 1 (contexts 100 x 2 // 3 = 66 and 33, the remainder 1 to the first: 67 + 33); the chunk cut
    into 4 @ 5, 4 @ 9, 2 @ 13, each (longest first) onto the microbatch with the fewest tokens so far:
    4 @ 5 -> #2 (1 token, then 5), 4 @ 9 -> #1 (2, then 6), 2 @ 13 -> #2 (5 < 6)."""
    pipe = PipelineCost(UnitCost(), stages=2, microbatch_tokens=4, hop_s_per_token=0.0, hop_latency_s=0.0)
    stats = BatchStats(prefill_lens=np.array([10]), prefill_contexts=np.array([5]), num_decodes=3,
                       decode_context_sum=100)
    a, b = pipe.microbatches(stats)
    assert (a.num_decodes, a.decode_context_sum, a.prefill_lens.tolist(), a.prefill_contexts.tolist()) == \
        (2, 67, [4], [9])
    assert (b.num_decodes, b.decode_context_sum, b.prefill_lens.tolist(), b.prefill_contexts.tolist()) == \
        (1, 33, [4, 2], [5, 13])
    assert sum(m.total_tokens for m in (a, b)) == stats.total_tokens


def test_a_roofline_pipeline_of_two_stages_by_hand():
    """Llama-3-8B at PP2 on H100s: each stage is 16 layers (with the LM head); a hop sends 4096 x 2
    bytes a token over NVLink (450 GB/s, 2 us). One decode: 2 x (stage + hop); two decodes of the same
    context: two microbatches, the same period for twice the tokens."""
    m = MODEL_PRESETS["llama-3-8b"]
    stage = RooflineCost(pipeline_stage(m, 2), H100, 1)
    hop = 2e-6 + 4096 * 2 / 450e9
    sc = scenario_from_dict({"model": "llama-3-8b", "hardware": "h100-sxm", "cost_model": "roofline",
                             "workload": _ONE, "engine": {"pipeline_parallel_size": 2}})
    pipe = cost_model(sc)
    one = stage.step_time(_decodes(1, 500))
    assert pipe.step_time(_decodes(1, 500)) == pytest.approx(2 * (one + hop), rel=1e-12)
    assert pipe.step_time(_decodes(2, 1000)) == pytest.approx(2 * (one + hop), rel=1e-12)
    assert pipeline_stage(m, 2).num_layers == 16 and pipeline_stage(m, 3).num_layers == 11
    assert pipeline_stage(m, 1) is m


def test_a_stage_holds_its_layers_weights_and_kv():
    """Llama-3-8B at PP2: 16 layers' KV a token per GPU (2 x 16 x 8 x 128 x 2 = 65,536 bytes, half of
    TP1's), its weights half the layers' plus the embedding, the head (128,256 x 4,096 x 2 bytes
    each) and the final norm (4,096 x 2), of 16,060,522,496 B in all: 9,080,938,496 B."""
    sc = scenario_from_dict({"model": "llama-3-8b", "hardware": "h100-sxm", "workload": _ONE,
                             "engine": {"pipeline_parallel_size": 2}})
    b = sc.budget
    assert b.kv_bytes_per_token == 65_536 == kv_bytes_per_token_per_rank(MODEL_PRESETS["llama-3-8b"], 1) // 2
    whole = 2 * 128_256 * 4_096 * 2 + 4_096 * 2
    assert b.weight_bytes_per_gpu == (16_060_522_496 - whole) / 2 + whole == 9_080_938_496
    assert sc.engine.gpus_per_replica == 2
    # DeepSeek-V3 (61 layers, 3 dense first) in 16 stages: 4 layers a stage, the last all MoE
    ds = pipeline_stage(MODEL_PRESETS["deepseek-v3"], 16)
    assert (ds.num_layers, ds.moe.dense_layers) == (4, 0)


def test_a_replica_past_one_node_hops_over_the_gpus_network():
    assert hop_link(H100, 8) == (450e9, 2e-6)
    assert hop_link(H100, 16) == (50e9, 5e-6)  # eight ConnectX-7 400 Gb/s in a DGX H100: 50 GB/s a GPU
    assert hop_link(HARDWARE_PRESETS["a100-80gb"], 16) == (25e9, 5e-6)
    with pytest.raises(ScenarioError, match="l40s has no network figure"):
        scenario_from_dict({"model": "llama-3-8b", "hardware": "l40s", "workload": _ONE,
                            "engine": {"tensor_parallel_size": 8, "pipeline_parallel_size": 2}})


def test_a_pipeline_run_counts_its_gpus_and_says_so_to_vllm():
    raw = {"model": "llama-3-8b", "hardware": "h100-sxm", "cost_model": "roofline",
           "engine": {"scheduler": "chunked", "pipeline_parallel_size": 2, "replicas": 2},
           "workload": {"arrival": {"process": "poisson", "rate": 8}, "num_requests": 200,
                        "prompt_tokens": {"dist": "fixed", "value": 500},
                        "output_tokens": {"dist": "fixed", "value": 50}}}
    sc = scenario_from_dict(raw)
    words = shlex.split(vllm_serve(sc))
    assert words[words.index("--pipeline-parallel-size") + 1] == "2"
    r = simulate(sc)
    assert r.summary["completed"] == 200
    one = simulate(scenario_from_dict({**raw, "engine": {**raw["engine"], "pipeline_parallel_size": 1}}))
    # 4 GPUs against 2: MFU is measured over every GPU a replica holds
    assert r.summary["mfu"] < one.summary["mfu"]
    assert _knobs({"pipeline_parallel_size": 2, "max_num_seqs": 8, "max_num_batched_tokens": 64}) == "PP2, 8 / 64"


def test_the_knobs_refusals():
    for engine, message in (
            ({"pipeline_parallel_size": 33}, "33 stages for llama-3-8b's 32 layers; at most 32"),
            ({"pipeline_parallel_size": 2, "scheduler": "static"}, "with the static scheduler is not modelled"),
            ({"pipeline_parallel_size": 2, "speculative": {"method": "ngram", "num_speculative_tokens": 2,
                                                           "acceptance_rate": 0.5}},
             "pipeline parallelism with engine.speculative is not modelled"),
            ({"pipeline_parallel_size": 0}, "engine.pipeline_parallel_size: 0")):
        with pytest.raises(ScenarioError, match=message):
            scenario_from_dict({"model": "llama-3-8b", "hardware": "h100-sxm", "workload": _ONE, "engine": engine})
    with pytest.raises(ScenarioError, match="a profile prices the whole model"):
        scenario_from_dict({"model": "llama-3-8b", "hardware": "h100-sxm", "workload": _ONE,
                            "cost_model": {"profile": "scenarios/profiles/example-h100-llama-3-8b.yaml"},
                            "engine": {"pipeline_parallel_size": 2}})
    with pytest.raises(ScenarioError, match="sliding-window layers is not modelled"):
        scenario_from_dict({"model": "mistral-7b", "hardware": "h100-sxm", "workload": _ONE,
                            "engine": {"pipeline_parallel_size": 2}})
