"""Six quantised checkpoints people deploy, sized module by module (sim/presets/quantization.py)
and checked by hand here: parameters against the published counts, bytes from each format's
storage rule (values, scales, zero points, layers kept unquantised), then run.

Fixtures (tests/fixtures/hf_configs/README.md): Qwen3-32B-FP8-Static-PerTensor (ModelOpt FP8) and
nvidia/Qwen3-235B-A22B-NVFP4 are copied unchanged from the aiconfigurator-core wheel; the three
RedHatAI Llama-3.1-8B-Instruct configs (compressed-tensors FP8-dynamic, W8A8, W4A16) and Meta's
Llama-3.1-405B-Instruct-FP8 (fbgemm_fp8) are the published base configs with the quantisation
section written as those checkpoints describe it."""
from __future__ import annotations

import pytest

from sim.config.errors import ScenarioError
from sim.presets.models import model_from_hf_config
from tests.presets.test_hf_configs import FIXTURES

# Llama-3.1-8B: 32 layers of 4,096 (GQA 32/8 heads of 128), MLP 14,336, vocabulary 128,256
L8 = dict(layers=32, h=4096, q=4096, kv=1024, inter=14336, vocab=128256)
PUBLISHED_8B = 8_030_261_248      # meta-llama/Llama-3.1-8B's parameter count
PUBLISHED_405B = 405_853_388_800  # meta-llama/Llama-3.1-405B's
PUBLISHED_32B = 32_762_123_264    # Qwen/Qwen3-32B's
PUBLISHED_235B = 235_093_634_560  # Qwen/Qwen3-235B-A22B's


def _llama_modules(layers, h, q, kv, inter, **_):
    """(out, in) of each linear module of one layer: q, k, v, o, gate, up, down."""
    return [(q, h), (kv, h), (kv, h), (h, q), (inter, h), (inter, h), (h, inter)]


def _other(layers, h, vocab, **_):
    """Embedding + LM head + 2 norms a layer + the final norm (bf16 in every format)."""
    return 2 * vocab * h + layers * 2 * h + h


def test_compressed_tensors_fp8_dynamic():
    m = model_from_hf_config(FIXTURES / "RedHatAI--Meta-Llama-3.1-8B-Instruct-FP8-dynamic.json")
    mods = _llama_modules(**L8)
    linear = L8["layers"] * sum(o * i for o, i in mods)
    assert m.num_params == linear + _other(**L8) == PUBLISHED_8B
    # FP8 values, one bf16 scale per output channel; activations dynamic (no stored scale)
    scales = L8["layers"] * sum(o for o, _ in mods) * 2
    assert m.weight_bytes == linear + scales + 2 * _other(**L8) == 9_083_953_152
    assert (m.linear_weight_bytes, m.quant_scheme) == (1.0, "fp8")


def test_compressed_tensors_w8a8_int8():
    m = model_from_hf_config(FIXTURES / "RedHatAI--Meta-Llama-3.1-8B-Instruct-quantized.w8a8.json")
    mods = _llama_modules(**L8)
    linear = L8["layers"] * sum(o * i for o, i in mods)
    assert m.num_params == PUBLISHED_8B
    assert m.weight_bytes == linear + L8["layers"] * sum(o for o, _ in mods) * 2 + 2 * _other(**L8)
    assert (m.linear_weight_bytes, m.quant_scheme) == (1.0, "int8")


def test_compressed_tensors_w4a16_group_128():
    m = model_from_hf_config(FIXTURES / "RedHatAI--Meta-Llama-3.1-8B-Instruct-quantized.w4a16.json")
    mods = _llama_modules(**L8)
    linear = L8["layers"] * sum(o * i for o, i in mods)
    assert m.num_params == PUBLISHED_8B
    # 4-bit values packed, one bf16 scale per 128 inputs of each row (symmetric: no zero point),
    # and each module's weight_shape (2 x int64) that pack-quantized stores
    groups = L8["layers"] * sum(o * (i // 128) for o, i in mods)
    shapes = L8["layers"] * len(mods) * 16
    assert m.weight_bytes == linear // 2 + 2 * groups + shapes + 2 * _other(**L8) == 5_700_595_200
    assert (m.linear_weight_bytes, m.quant_scheme) == (0.5, "int4")


def test_fbgemm_fp8_llama_405b_keeps_attention_and_end_layers_in_bf16():
    m = model_from_hf_config(FIXTURES / "meta-llama--Llama-3.1-405B-Instruct-FP8.json")
    c = dict(layers=126, h=16384, q=16384, kv=1024, inter=53248, vocab=128256)
    mods = _llama_modules(**c)
    attn, mlp = mods[:4], mods[4:]
    assert m.num_params == c["layers"] * sum(o * i for o, i in mods) + _other(**c) == PUBLISHED_405B
    quantised = (c["layers"] - 2) * sum(o * i for o, i in mlp)  # layers 1-124's MLPs
    row_scales = (c["layers"] - 2) * sum(o for o, _ in mlp) * 4  # one fp32 scale per output row
    bf16 = c["layers"] * sum(o * i for o, i in attn) + 2 * sum(o * i for o, i in mlp)
    assert m.weight_bytes == quantised + row_scales + 2 * bf16 + 2 * _other(**c)
    assert (m.linear_weight_bytes, m.quant_scheme) == (1.0, "fp8")


def test_modelopt_fp8_static_per_tensor_with_fp8_kv_scales():
    m = model_from_hf_config(FIXTURES / "Qwen--Qwen3-32B-FP8-Static-PerTensor.json")
    c = dict(layers=64, h=5120, q=64 * 128, kv=8 * 128, inter=25600, vocab=151936)
    mods = _llama_modules(**c)
    linear = c["layers"] * sum(o * i for o, i in mods)
    other = _other(**c) + c["layers"] * 2 * 128  # + Qwen3's q_norm and k_norm (head_dim each)
    assert m.num_params == linear + other == PUBLISHED_32B
    # weight_scale + input_scale (fp32) per module, k_scale + v_scale per layer
    assert m.weight_bytes == linear + 2 * other + c["layers"] * (7 * 8 + 8)
    assert (m.linear_weight_bytes, m.kv_cache_scales) == (1.0, "fp8")


def test_modelopt_nvfp4_moe_keeps_routers_and_lm_head_in_bf16():
    m = model_from_hf_config(FIXTURES / "nvidia--Qwen3-235B-A22B-NVFP4.json")
    layers, h, q, kv, e, w, vocab = 94, 4096, 64 * 128, 4 * 128, 128, 1536, 151936
    attn = [(q, h), (kv, h), (kv, h), (h, q)]
    expert = [(w, h), (w, h), (h, w)]
    router = e * h
    quantised = layers * (sum(o * i for o, i in attn) + e * sum(o * i for o, i in expert))
    modules = layers * (len(attn) + e * len(expert))
    other = 2 * vocab * h + layers * (2 * h + 2 * 128) + h
    assert m.num_params == quantised + layers * router + other == PUBLISHED_235B
    # E2M1 values (4 bits), one FP8 scale per 16, weight_scale_2 + input_scale (fp32) per module;
    # routers and everything else bf16; k/v scales per layer
    nvfp4 = quantised // 2 + quantised // 16 + modules * 8
    assert m.weight_bytes == nvfp4 + 2 * (layers * router + other) + layers * 8
    assert (m.linear_weight_bytes, m.quant_scheme, m.kv_cache_scales) == (0.5, "nvfp4", "fp8")


@pytest.mark.parametrize("fixture, gpu, measured", [
    ("RedHatAI--Meta-Llama-3.1-8B-Instruct-FP8-dynamic", "h100-sxm", True),   # FP8 GEMM tables
    ("RedHatAI--Meta-Llama-3.1-8B-Instruct-quantized.w4a16", "h100-sxm", False),  # no int4 rows: roofline
    ("nvidia--Qwen3-235B-A22B-NVFP4", "b200", False),
])
def test_they_run(fixture, gpu, measured, tmp_path):
    from sim.scenario import scenario_from_dict
    from sim.simulate import simulate
    tp = 8 if "235B" in fixture else 1
    sc = scenario_from_dict({"name": "q", "model": {"hf_config": str(FIXTURES / f"{fixture}.json")},
                             "hardware": gpu, "engine": {"tensor_parallel_size": tp, "scheduler": "chunked"},
                             "workload": {"num_requests": 20, "arrival": {"process": "poisson", "rate": 5.0},
                                          "prompt_tokens": {"dist": "fixed", "value": 256},
                                          "output_tokens": {"dist": "fixed", "value": 32}}}, base_dir=tmp_path)
    assert (sc.cost_model.name == "measured") is measured
    if not measured:
        assert sc.cost_model.notice  # the estimate is said out loud
    s = simulate(sc).summary
    assert s["completed"] == 20 and s["error_band"]["basis"]["widened_for"]


def test_an_unread_field_is_named(tmp_path):
    import json
    cfg = json.loads((FIXTURES / "RedHatAI--Meta-Llama-3.1-8B-Instruct-quantized.w4a16.json").read_text())
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["strategy"] = "attn_head"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ScenarioError, match=r"config_groups.group_0.weights.strategy: 'attn_head': not modelled"):
        model_from_hf_config(tmp_path)
    cfg["quantization_config"] = {"quant_method": "bitsandbytes"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ScenarioError, match=r"quant_method: 'bitsandbytes': not modelled"):
        model_from_hf_config(tmp_path)


@pytest.mark.parametrize("patch, says", [
    ({"first_k_dense_replace": 1000}, r"first_k_dense_replace: 1000 is not a number of layers in \[0, 61\]"),
    ({"n_routed_experts": 0}, "n_routed_experts: 0: a deepseek_v3 model needs at least one expert"),
    ({"num_experts_per_tok": 0}, r"num_experts_per_tok: 0 is not a whole number of experts in \[1, 256\]"),
    ({"num_experts_per_tok": 300}, r"num_experts_per_tok: 300 is not a whole number of experts in \[1, 256\]"),
    ({"model_type": ["deepseek_v3"]}, "model_type: a list is not a name"),
])
def test_moe_fields_that_cannot_be_right_are_refused(patch, says, tmp_path):
    """(issue 53: DeepSeek-V3 with first_k_dense_replace 1000 sized at 4.9 GB instead of 84 GB a GPU)"""
    import json
    base = json.loads((FIXTURES / "deepseek-ai--DeepSeek-V3.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**base, **patch}))
    with pytest.raises(ScenarioError, match=says):
        model_from_hf_config(tmp_path)


def test_gpt_oss_experts_per_token_must_agree_with_num_experts_per_tok(tmp_path):
    """gpt-oss's config names the routed experts per token twice; the two disagreeing was read as
    the second silently."""
    import json
    base = json.loads((FIXTURES / "openai--gpt-oss-20b.json").read_text())
    assert base["experts_per_token"] == base["num_experts_per_tok"] == 4
    (tmp_path / "config.json").write_text(json.dumps({**base, "experts_per_token": 100}))
    with pytest.raises(ScenarioError, match="experts_per_token: 100 but num_experts_per_tok is 4"):
        model_from_hf_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(base))
    assert model_from_hf_config(tmp_path).moe.experts_per_token == 4


@pytest.mark.parametrize("moe, says", [
    ({"num_experts": 0, "experts_per_token": 0, "expert_intermediate_size": 64}, "needs 1 <= experts_per_token"),
    ({"num_experts": 8, "experts_per_token": 9, "expert_intermediate_size": 64}, "9 routed experts a token of 8"),
    ({"num_experts": 8, "experts_per_token": 2, "expert_intermediate_size": 64, "dense_layers": 5},
     r"moe.dense_layers: 5 dense layers of 2 \(num_layers\)"),
])
def test_moe_fields_are_checked_against_each_other(moe, says):
    from sim.presets.models import model_from_fields
    base = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128,
            "vocab_size": 256, "moe": moe}
    with pytest.raises(ScenarioError, match=says):
        model_from_fields(base, "s.yaml: model")
