"""Hybrid models (Gated DeltaNet + attention: Qwen3-Next, Qwen3.5): their weights, the state each
sequence holds, vLLM's block size and KV-cache groups for them, the scheduler's blocks, and the
refusals. Numbers worked by hand in each test."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sim.config.errors import ScenarioError
from sim.kv.cache import StateKVCache
from sim.presets import memory
from sim.presets.hardware import HARDWARE_PRESETS
from sim.presets.models import MODEL_PRESETS, KVLayout, LinearAttentionSpec, model_from_hf_config, pipeline_stage
from sim.scenario import scenario_from_dict
from sim.simulate import simulate
from simhelpers import make_workload

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs"
QN = MODEL_PRESETS["qwen3-next-80b-a3b"]
_ONE = {"arrival": {"process": "burst"}, "num_requests": 1, "prompt_tokens": {"dist": "fixed", "value": 1},
        "output_tokens": {"dist": "fixed", "value": 1}}
# 4 layers, 1 attention (2 KV heads of 16) + 3 Gated DeltaNet (2 key / 4 value heads of 16, conv 4)
TINY = {"name": "tiny-hybrid", "num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "num_kv_heads": 2,
        "head_dim": 16, "intermediate_size": 128, "vocab_size": 256,
        "linear_attention": {"layers": 3, "num_key_heads": 2, "num_value_heads": 4, "key_head_dim": 16,
                             "value_head_dim": 16, "conv_kernel": 4}}


def _scenario(model=None, **engine):
    return scenario_from_dict({"model": model or TINY, "hardware": "h100-sxm", "cost_model": "unit",
                               "engine": {"scheduler": "chunked", **engine}, "workload": _ONE})


def test_qwen3_next_weights_match_the_published_count():
    """79,674,391,296 published (Qwen3-Next-80B-A3B's safetensors), 3,874,929,408 active: counted here
    but for the shared experts' sigmoid gates (48 layers x 2,048) and the attention layers' q/k norms
    (12 x 2 x 256), which servesim does not count."""
    uncounted = 48 * 2048  # (the q/k norms, 12 x 2 x 256, are counted: ModelSpec.qk_norm)
    assert QN.num_params == 79_674_391_296 - uncounted
    assert QN.active_layer_params_total + QN.other_params == 3_874_929_408 - uncounted
    # one GDN layer: in_proj_qkvz 2048 x (2 x 2048 + 2 x 4096) + in_proj_ba 2048 x 64 + out_proj 4096 x 2048
    assert QN.linear_attention.layer_params(2048) == 2048 * 12288 + 2048 * 64 + 4096 * 2048
    # a gated attention layer: q and its gate 2 x 2048 x 4096, k and v 2 x 2048 x 512, o 4096 x 2048
    assert QN.attention_params == 2 * 2048 * 4096 + 2 * 2048 * 512 + 4096 * 2048
    assert QN.attention_layers == 12 and QN.kv_bytes_per_token == 2 * 12 * 2 * 256 * 2


def test_qwen35_configs_read_as_hybrids():
    """The published Qwen3.5 configs (text decoder under text_config, a vision encoder beside it):
    layer_types gives 30 of 40 (35B-A3B) and 48 of 64 (27B) linear layers, mamba_ssm_dtype float32
    a 4-byte recurrent state; 35B-A3B has no dense width, so k x the expert width stands in."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        moe = model_from_hf_config(FIXTURES / "Qwen--Qwen3.5-35B-A3B.json")
        dense = model_from_hf_config(FIXTURES / "Qwen--Qwen3.5-27B.json")
    assert any("vision encoder" in str(w.message) for w in seen)
    assert moe.linear_attention == LinearAttentionSpec(30, 16, 32, 128, 128, 4, state_dtype_bytes=4)
    assert dense.linear_attention == LinearAttentionSpec(48, 16, 48, 128, 128, 4, state_dtype_bytes=4)
    assert moe.attention_output_gate and moe.moe.shared_experts == 1 and moe.intermediate_size == 8 * 512
    assert (moe.attention_layers, dense.attention_layers, dense.moe) == (10, 16, None)


def test_a_qwen3_next_config_reads_as_the_preset(tmp_path):
    """The architecture keys of Qwen3-Next's config.json (every fourth layer full attention by
    full_attention_interval) give the preset's spec."""
    cfg = {"model_type": "qwen3_next", "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 16,
           "num_key_value_heads": 2, "head_dim": 256, "intermediate_size": 5120, "vocab_size": 151936,
           "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512,
           "shared_expert_intermediate_size": 512, "decoder_sparse_step": 1, "mlp_only_layers": [],
           "full_attention_interval": 4, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
           "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_value_head_dim": 128,
           "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = model_from_hf_config(tmp_path / "config.json", name="qwen3-next-80b-a3b")
    assert m == QN
    cfg["layer_types"] = ["full_attention"] * 48
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ScenarioError, match="0 of 48 layers are linear attention; servesim models a hybrid with both"):
        model_from_hf_config(tmp_path / "config.json")


def test_state_bytes_and_vllms_block_size_by_hand():
    """Per GPU a GDN layer keeps conv (4 - 1) x (2 x 2048 + 4096) / TP x 2 B and the recurrent
    32 / TP x 128 x 128 x 2 B; the attention block must hold it: 16 x cdiv(state, 16 x K+V of a token
    and layer) tokens (32 on B200 at head_dim 256)."""
    h100, b200 = HARDWARE_PRESETS["h100-sxm"], HARDWARE_PRESETS["b200"]
    assert memory.linear_state_bytes(QN, 1) == 3 * 8192 * 2 + 32 * 128 * 128 * 2 == 1_097_728
    assert memory.linear_state_bytes(QN, 4) == 3 * 2048 * 2 + 8 * 128 * 128 * 2 == 274_432
    # TP1: 2 KV heads x 256 x 2 (K, V) x 2 B = 2,048 B a token: 1,097,728 / 2,048 = 536 -> 544
    assert memory.hybrid_block_size(QN, h100, 1) == 544
    # TP4: 1 KV head (replicated) -> 1,024 B: 268 tokens -> 272 (16s), 288 (32s, B200)
    assert memory.hybrid_block_size(QN, h100, 4) == 272 and memory.hybrid_block_size(QN, b200, 4) == 288
    # a larger block asked for stays; an FP8 KV cache halves a token's bytes: twice the tokens
    assert memory.hybrid_block_size(QN, h100, 4, block_size=512) == 512
    assert memory.hybrid_block_size(QN, h100, 4, "fp8") == 544
    assert memory.hybrid_block_size(MODEL_PRESETS["llama-3-8b"], h100, 1) == 16


def test_kv_groups_and_budget_by_hand():
    """12 attention + 36 GDN layers: vLLM groups them in 12s (36 >= 1.5 x 12): one attention group
    and three state groups sharing one pool; a block is 272 tokens x 1,024 B x 12 layers at TP4 on
    H200. A sequence of 4,096 tokens holds ceil(4096 / 272) = 16 attention blocks + 3 state blocks."""
    assert QN.kv_layout == KVLayout(12, 1, 0, 0, state_groups=3)
    b = memory.kv_budget(QN, HARDWARE_PRESETS["h200"], tensor_parallel_size=4, gpu_memory_utilization=0.9,
                         block_size=272)
    assert b.block_bytes == 272 * 1024 * 12 == 3_342_336
    free = 0.9 * 141e9 - QN.weight_bytes / 4 - b.activation_reserve_bytes
    assert b.num_gpu_blocks == int(free // 3_342_336)
    assert b.blocks_per_seq(4096) == 16 + 3 and b.blocks_per_seq(0) == 0
    assert b.max_concurrent_seqs(4096) == b.num_gpu_blocks // 19
    with pytest.raises(ScenarioError, match="block_size 16 is too small .* vLLM raises it to 272"):
        memory.kv_budget(QN, HARDWARE_PRESETS["h200"], tensor_parallel_size=4, gpu_memory_utilization=0.9,
                         block_size=16)


def test_state_cache_holds_one_block_per_state_group_while_a_request_has_tokens():
    kv = StateKVCache(100, 32, KVLayout(1, 1, state_groups=3))
    assert kv.blocks_for(0) == 0 and kv.blocks_for(1) == 4 and kv.blocks_for(32) == 4 and kv.blocks_for(33) == 5
    assert kv.growth(0, 10) == 4 and kv.growth(10, 22) == 0 and kv.growth(32, 1) == 1
    assert kv.blocks_for(np.array([0, 1, 64, 65])).tolist() == [0, 4, 5, 6]
    slots, why = kv.slots_needed(np.array([40]), np.array([2]), 32)
    assert slots.tolist() == [(2 + 3) * 32] and "state block" in why


def test_the_state_blocks_keep_a_second_request_waiting():
    """The tiny hybrid: K+V of a token and its one attention layer 2 x 2 x 16 x 2 = 128 B, a GDN layer's
    state 3 x (2 x 32 + 64) x 2 + 4 x 16 x 16 x 2 = 2,816 B -> blocks of 16 x cdiv(2816, 2048) = 32
    tokens. On 6 blocks, A (40 + 2 tokens: 2 + 3 blocks) and B (20 + 2: 1 + 3) cannot run together:
    A [0,1] prefills, [1,2] decodes and leaves; B [2,3], [3,4]. A plain model's 3 blocks would fit both."""
    sc = _scenario(num_gpu_blocks=6, max_num_batched_tokens=64, max_num_seqs=4)
    assert sc.engine.block_size == 32 and not sc.engine.enable_prefix_caching
    r = simulate(sc, workload=make_workload([0.0, 0.0], [40, 20], [2, 2]))
    assert r.steps[["start_s", "prefill_tokens", "decode_tokens"]].values.tolist() == \
        [[0, 40, 0], [1, 0, 1], [2, 20, 0], [3, 0, 1]]
    assert r.requests["ttft_s"].tolist() == [1.0, 3.0]
    # the state blocks count as full in the KV accounting: tokens written + 3 x 32 a running request,
    # over its blocks' slots, 1 s each: (40 + 96) + (41 + 96) on 5 x 32, (20 + 96) + (21 + 96) on 4 x 32
    assert r.summary["kv_waste"] == pytest.approx(1 - (136 + 137 + 116 + 117) / (160 + 160 + 128 + 128), rel=1e-12)


def test_refusals_name_the_key():
    with pytest.raises(ScenarioError, match="engine.enable_prefix_caching: prefix caching with tiny-hybrid's "
                                            "linear-attention layers is not modelled"):
        _scenario(enable_prefix_caching=True)
    with pytest.raises(ScenarioError, match="the static scheduler is not modelled"):
        scenario_from_dict({"model": TINY, "hardware": "h100-sxm", "engine": {"scheduler": "static"},
                            "workload": _ONE})
    with pytest.raises(ScenarioError, match="with engine.speculative is not modelled"):
        _scenario(speculative={"method": "ngram", "num_speculative_tokens": 2, "acceptance_rate": 0.7})
    with pytest.raises(ScenarioError, match=r"tensor_parallel_size 4 does not divide tiny-hybrid's "
                                            r"linear-attention heads \(2 key, 4 value\)"):
        _scenario(tensor_parallel_size=4)
    huge = {**TINY["linear_attention"], "num_value_heads": 4096, "value_head_dim": 4096}
    with pytest.raises(ScenarioError, match="state needs attention blocks of .* servesim takes at most 8,192"):
        _scenario(model={**TINY, "linear_attention": huge})
    with pytest.raises(ScenarioError, match="layers: 4 of 4 layers"):
        _scenario(model={**TINY, "linear_attention": {**TINY["linear_attention"], "layers": 4}})
    with pytest.raises(ScenarioError, match="num_value_heads: 3 is not a multiple of num_key_heads"):
        _scenario(model={**TINY, "linear_attention": {**TINY["linear_attention"], "num_value_heads": 3}})


def test_pipeline_stage_keeps_its_share_of_linear_layers():
    stage = pipeline_stage(QN, 2)  # 24 layers, 36 x 24 // 48 = 18 of them GDN
    assert (stage.num_layers, stage.linear_attention.layers, stage.attention_layers) == (24, 18, 6)


def test_hybrid_pipeline_stages_and_data_parallel_ranks():
    """PP2: a stage of 24 layers holds 6 attention and 18 GDN layers, grouped in 6s (1 attention + 3
    state groups), its GDN kernels priced for its 18 layers. DP2 x TP2 with EP: each GPU keeps the
    non-expert weights split by TP2 and 512 / 4 = 128 whole experts; each rank's step is its own
    (36 GDN layers) plus the all-to-all."""
    from sim.build import cost_model
    from sim.cost.expert_parallel import ExpertParallelCost
    from sim.cost.linear_attention import LinearAttentionCost
    from sim.cost.pipeline import PipelineCost

    base = {"model": "qwen3-next-80b-a3b", "hardware": "h200", "workload": _ONE}
    pp = scenario_from_dict({**base, "engine": {"scheduler": "chunked", "tensor_parallel_size": 2,
                                                "pipeline_parallel_size": 2}})
    assert pp.budget.layout == KVLayout(6, 1, state_groups=3) and pp.engine.block_size == 544
    cost = cost_model(pp)
    assert isinstance(cost, PipelineCost) and isinstance(cost.stage, LinearAttentionCost) and cost.stage.layers == 18
    dp = scenario_from_dict({**base, "engine": {"scheduler": "chunked", "tensor_parallel_size": 2,
                                                "data_parallel_size": 2, "enable_expert_parallel": True}})
    routed = QN.routed_expert_params * QN.expert_bytes_per_weight
    assert dp.budget.weight_bytes_per_gpu == pytest.approx((QN.weight_bytes - routed) / 2 + 128 * routed / 512,
                                                           rel=1e-12)
    cost = cost_model(dp)
    assert isinstance(cost, ExpertParallelCost) and isinstance(cost.inner, LinearAttentionCost)
    assert cost.inner.layers == 36


def test_capacity_prints_the_state_and_the_raised_block():
    from cli import app

    r = CliRunner().invoke(app, ["capacity", "--model", "qwen3-next-80b-a3b", "--gpu", "h200", "--tp", "4",
                                 "--seq-len", "4096", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["linear_state_bytes"] == 274_432 and out["blocks_per_seq"] == 19
    assert out["block_bytes"] == 3_342_336
