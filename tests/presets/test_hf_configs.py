"""Real published config.json files (tests/fixtures/hf_configs/, from the AIConfigurator wheel):
dense Llama-style ones are sized as computed by hand here (gpt-oss-20b's in test_sliding_window.py);
architectures servesim does not model yet are refused naming the field (never a silent dense
sizing)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app
from sim.config.errors import ScenarioError
from sim.presets.memory import kv_bytes_per_token_per_rank
from sim.presets.models import model_from_hf_config

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs"


@pytest.mark.parametrize("name, layers, hidden, heads, kv, inter, vocab", [
    ("meta-llama--Meta-Llama-3.1-8B", 32, 4096, 32, 8, 14336, 128256),
    ("meta-llama--Meta-Llama-3.1-70B", 80, 8192, 64, 8, 28672, 128256),
])
def test_llama_31_weights_and_kv_bytes_by_hand(name, layers, hidden, heads, kv, inter, vocab):
    cfg = json.loads((FIXTURES / f"{name}.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"], cfg["intermediate_size"], cfg["vocab_size"]) == (
        layers, hidden, heads, kv, inter, vocab)
    m = model_from_hf_config(FIXTURES / f"{name}.json")
    hd = hidden // heads  # 128
    per_layer = (hidden * heads * hd          # q
                 + 2 * hidden * kv * hd       # k, v
                 + heads * hd * hidden        # o
                 + 3 * hidden * inter         # gate, up, down
                 + 2 * hidden)                # two RMSNorms
    params = layers * per_layer + 2 * vocab * hidden + hidden  # embedding, untied LM head, final norm
    assert m.weight_bytes == 2 * params           # bf16
    assert params == {"meta-llama--Meta-Llama-3.1-8B": 8_030_261_248,
                      "meta-llama--Meta-Llama-3.1-70B": 70_553_706_496}[name]
    assert kv_bytes_per_token_per_rank(m, 1) == 2 * layers * kv * hd * 2  # K and V, bf16


def _cfg(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def test_mixtral_8x7b_by_hand():
    c = _cfg("mistralai--Mixtral-8x7B-v0.1")
    m = model_from_hf_config(FIXTURES / "mistralai--Mixtral-8x7B-v0.1.json")
    h, layers, vocab, e, k = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], 8, 2
    hd, kv = h // c["num_attention_heads"], c["num_key_value_heads"]
    attn = h * h + 2 * h * kv * hd + h * h
    expert = 3 * h * c["intermediate_size"]          # Mixtral's experts are intermediate_size wide
    moe = e * expert + h * e                          # experts + router
    params = layers * (attn + moe + 2 * h) + 2 * vocab * h + h
    assert (c["num_local_experts"], c["num_experts_per_tok"]) == (e, k)
    assert m.num_params == params and m.weight_bytes == 2 * params     # bf16: ~93.4 GB
    assert round(params / 1e9, 1) == 46.7
    assert m.flops_per_token == 2 * (layers * (attn + k * expert + h * e) + vocab * h)
    assert kv_bytes_per_token_per_rank(m, 2) == 2 * layers * (kv // 2) * hd * 2


def test_qwen3_30b_a3b_by_hand():
    c = _cfg("Qwen--Qwen3-30B-A3B")
    m = model_from_hf_config(FIXTURES / "Qwen--Qwen3-30B-A3B.json")
    h, layers, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    heads, kv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    e, w = c["num_experts"], c["moe_intermediate_size"]
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
    # (+ q_norm and k_norm: head_dim weights each per layer)
    params = layers * (attn + e * 3 * h * w + h * e + 2 * h + 2 * hd) + 2 * vocab * h + h
    assert m.num_params == params and round(params / 1e9, 1) == 30.5
    assert m.kv_bytes_per_token == 2 * layers * kv * hd * 2


def test_deepseek_v3_by_hand():
    """MLA + 256 routed experts (8 per token) + 1 shared expert, 3 leading dense layers, fp8
    linear weights (bf16 embeddings, LM head, norms); the KV cache holds the 512-wide latent and
    the 64-wide rope key per layer, on every TP rank."""
    c = _cfg("deepseek-ai--DeepSeek-V3")
    m = model_from_hf_config(FIXTURES / "deepseek-ai--DeepSeek-V3.json")
    h, layers, vocab, heads = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], c["num_attention_heads"]
    r, rope, nope, v, qr = (c["kv_lora_rank"], c["qk_rope_head_dim"], c["qk_nope_head_dim"],
                            c["v_head_dim"], c["q_lora_rank"])
    attn = (h * qr + qr * heads * (nope + rope)            # q down + up
            + h * (r + rope) + r * heads * (nope + v)       # kv down (latent + rope key) + up
            + heads * v * h)                                # o
    dense = c["first_k_dense_replace"]
    w, e, shared = c["moe_intermediate_size"], c["n_routed_experts"], c["n_shared_experts"]
    mlp = dense * 3 * h * c["intermediate_size"] + (layers - dense) * (3 * h * w * (e + shared) + h * e)
    linear = layers * attn + mlp
    other = 2 * vocab * h + layers * (2 * h + r + qr) + h
    assert m.num_params == linear + other and round((linear + other) / 1e9) == 671
    # fp8 linear weights with one fp32 scale per 128 x 128 block; the routers in bf16
    tiles = lambda o, i: -(-o // 128) * -(-i // 128)  # noqa: E731
    attn_tiles = (tiles(qr, h) + tiles(heads * (nope + rope), qr) + tiles(r + rope, h)
                  + tiles(heads * (nope + v), r) + tiles(h, heads * v))
    mlp_tiles = (dense * (2 * tiles(c["intermediate_size"], h) + tiles(h, c["intermediate_size"]))
                 + (layers - dense) * (e + shared) * (2 * tiles(w, h) + tiles(h, w)))
    routers = (layers - dense) * h * e
    scales = 4 * (layers * attn_tiles + mlp_tiles)
    assert m.weight_bytes == (linear - routers) * 1 + routers * 2 + other * 2 + scales
    assert c["quantization_config"]["quant_method"] == "fp8"
    assert c["quantization_config"]["weight_block_size"] == [128, 128] and m.weight_block_size == 128
    assert m.kv_bytes_per_token == layers * (r + rope) * 2
    assert kv_bytes_per_token_per_rank(m, 8) == layers * (r + rope) * 2      # not split by TP
    assert kv_bytes_per_token_per_rank(m, 8, "fp8") == layers * (r + rope)


@pytest.mark.parametrize("change, message", [
    ({"kv_lora_rank": 512}, "kv_lora_rank: 512: experts or latent attention in a 'llama' config"),
    ({"num_local_experts": 8}, "num_local_experts: 8: experts or latent attention"),
    ({"quantization_config": {"quant_method": "bitsandbytes"}}, "quant_method: 'bitsandbytes': not modelled"),
    ({"layer_types": ["chunked_attention"] * 32}, "layer_types: 'chunked_attention' layers are not modelled"),
    ({"layer_types": ["sliding_attention", "full_attention"]}, "layer_types: 2 entries for 32 num_hidden_layers"),
    ({"layer_types": ["sliding_attention"] * 32}, "sliding_window: null: layer_types lists sliding_attention"),
    ({"model_type": "starcoder2"}, "model_type: 'starcoder2' is not modelled"),  # (an ungated MLP)
    ({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 64]}},
     r"weight_block_size: \[128, 64\]: only square blocks"),
])
def test_each_unmodelled_field_is_named(tmp_path, change, message):
    cfg = _cfg("meta-llama--Meta-Llama-3.1-8B")
    (tmp_path / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(ScenarioError, match=message):
        model_from_hf_config(tmp_path)


def test_an_inactive_sliding_window_is_fine(tmp_path):
    """Qwen2 configs carry sliding_window with use_sliding_window: false: full attention."""
    cfg = json.loads((FIXTURES / "meta-llama--Meta-Llama-3.1-8B.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "sliding_window": 4096,
                                                      "use_sliding_window": False}))
    assert model_from_hf_config(tmp_path).num_layers == 32


def _scenario(tmp_path: Path, config: str, hardware: str, tp: int) -> Path:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(f"model: {{hf_config: {FIXTURES / config}}}\nhardware: {hardware}\n"
                        f"engine: {{scheduler: chunked, tensor_parallel_size: {tp}, max_num_seqs: 32}}\n"
                        "workload: {arrival: {process: poisson, rate: 4}, num_requests: 40, "
                        "prompt_tokens: {dist: uniform, low: 100, high: 2000}, "
                        "output_tokens: {dist: uniform, low: 10, high: 200}}\n")
    return scenario


@pytest.mark.parametrize("config, hardware, tp", [
    ("mistralai--Mixtral-8x7B-v0.1.json", "a100-80gb", 2),  # (the A100 tables have no fused MoE)
    ("Qwen--Qwen3-30B-A3B.json", "a100-80gb", 1),
    ("openai--gpt-oss-20b.json", "a100-80gb", 1),  # MoE, MXFP4 experts, half its layers windowed
])
def test_moe_models_without_measured_rows_simulate_on_the_roofline_and_say_so(tmp_path, config, hardware, tp):
    import json as _json

    out = tmp_path / "o"
    r = CliRunner().invoke(app, ["run", str(_scenario(tmp_path, config, hardware, tp)), "--out", str(out), "-q"])
    assert r.exit_code == 0, r.output
    assert "estimated (roofline), not measured" in r.stderr
    s = _json.loads((out / "summary.json").read_text())
    assert s["completed"] == 40 and s["run"]["cost_model"]["name"] == "roofline"
    again = tmp_path / "again"  # the resolved scenario (moe/mla fields included) repeats the run
    assert CliRunner().invoke(app, ["run", str(out / "scenario.yaml"), "--out", str(again), "-q"]).exit_code == 0
    assert (again / "requests.csv").read_bytes() == (out / "requests.csv").read_bytes()


def test_mixtral_does_not_fit_one_h100(tmp_path):
    r = CliRunner().invoke(app, ["run", str(_scenario(tmp_path, "mistralai--Mixtral-8x7B-v0.1.json",
                                                      "h100-sxm", 1)), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "needs 93.4 GB of weights per GPU" in r.stderr


def test_expert_parallel_puts_whole_experts_on_gpus():
    """Mixtral: 8 experts of 3 x 4096 x 14336 per layer x 32 layers; over 3 GPUs the busiest holds
    ceil(8/3) = 3 whole experts, over 2 GPUs exactly half: the same as tensor parallelism."""
    from sim.presets.memory import weights_per_gpu

    m = model_from_hf_config(FIXTURES / "mistralai--Mixtral-8x7B-v0.1.json")
    routed_bytes = 32 * 8 * 3 * 4096 * 14336 * 2
    rest = m.weight_bytes - routed_bytes
    assert weights_per_gpu(m, 2, True) == weights_per_gpu(m, 2, False) == m.weight_bytes / 2
    assert weights_per_gpu(m, 3, True) == rest / 3 + 3 * routed_bytes / 8


def test_roofline_reads_the_experts_a_batch_touches_by_hand():
    """One token routed to 2 of 8 Mixtral experts reads, per MoE layer, 1 - (1 - 2/8)^1 = 1/4 of
    the routed weights in expectation; 64 tokens read 1 - (3/4)^64 of them (all but ~1e-8)."""
    from sim.cost.registry import RooflineCost
    from sim.presets.hardware import HARDWARE_PRESETS

    m = model_from_hf_config(FIXTURES / "mistralai--Mixtral-8x7B-v0.1.json")
    hw = HARDWARE_PRESETS["h100-sxm"]
    r = RooflineCost(m, hw, 2, overhead_s=0, overhead_per_seq_s=0)
    byte_s = hw.hbm_bandwidth * 0.85
    routed = 32 * 8 * 3 * 4096 * 14336 * 2 / 2                          # bytes per GPU
    fixed = (m.linear_params_total * 2 - routed * 2 + 32000 * 4096 * 2) / 2
    for tokens in (1, 64):
        read = (fixed + routed * (1 - (1 - 2 / 8) ** tokens)) / byte_s
        assert r._linear_time(tokens, tokens) == pytest.approx(
            read + r._allreduce_fixed_s + r._allreduce_s_per_token * tokens, rel=1e-12)


def test_fp8_weights_use_the_fp8_peak_and_mla_attention_prices_the_latent():
    from sim.cost.registry import RooflineCost
    from sim.presets.hardware import HARDWARE_PRESETS

    m = model_from_hf_config(FIXTURES / "deepseek-ai--DeepSeek-V3.json")
    hw = HARDWARE_PRESETS["h200"]
    r = RooflineCost(m, hw, 8)
    assert r._s_per_token == pytest.approx(2 * m.active_layer_params_total / 8 / (hw.fp8_flops * 0.7))
    # absorbed MLA: QK over 512 + 64 dims and PV over 512 per pair and head, 128 / 8 heads per GPU
    assert r._s_per_pair == pytest.approx(61 * 16 * (2 * (512 + 64) + 2 * 512) / (hw.bf16_flops * 0.7))


@pytest.mark.parametrize("config, preset, gpu, tp", [
    ("mistralai--Mixtral-8x7B-v0.1.json", "mixtral-8x7b", "h100-sxm", 2),
    ("Qwen--Qwen3-30B-A3B.json", "qwen3-30b-a3b", "h100-sxm", 1),
    ("nvidia--Llama-3.1-70B-Instruct-FP8.json", "llama-3.1-70b-fp8", "h100-sxm", 4),
    ("deepseek-ai--DeepSeek-V3.json", "deepseek-v3", "h200", 8),
    ("openai--gpt-oss-20b.json", "gpt-oss-20b", "h100-sxm", 1),
    ("openai--gpt-oss-120b.json", "gpt-oss-120b", "h100-sxm", 1),
])
def test_moe_and_fp8_configs_are_their_presets_and_get_measured_costs(tmp_path, config, preset, gpu, tp):
    """The MoE, MLA and FP8 presets are the published configs (every field but the name), so a
    scenario that reads the config gets the preset's shipped profile, composed from the fused-MoE,
    MLA-module or FP8 GEMM tables."""
    from dataclasses import replace

    from sim.presets.models import MODEL_PRESETS

    assert replace(model_from_hf_config(FIXTURES / config), name=preset) == MODEL_PRESETS[preset]
    out = tmp_path / "o"
    r = CliRunner().invoke(app, ["run", str(_scenario(tmp_path, config, gpu, tp)), "--out", str(out), "-q"])
    assert r.exit_code == 0, r.output
    assert "estimated (roofline)" not in r.stderr
    cost = json.loads((out / "summary.json").read_text())["run"]["cost_model"]
    assert cost["name"] == "measured" and cost["profile"].endswith(f"{gpu}/{preset}-tp{tp}.yaml")


def test_modelopt_fp8_checkpoint_reads_its_hf_quant_config(tmp_path):
    """NVIDIA's Llama-3.1-70B-Instruct-FP8 (ModelOpt) says nothing of FP8 in config.json: its
    hf_quant_config.json beside it (quant_algo FP8, lm_head excluded) does. Linear layers at 1 byte,
    embedding, LM head and norms at bf16; without the file it would be sized as bf16 (141 GB)."""
    m = model_from_hf_config(FIXTURES / "nvidia--Llama-3.1-70B-Instruct-FP8.json")
    assert m.linear_weight_bytes == 1
    layers, h, q, kv, inter, vocab = 80, 8192, 64 * 128, 8 * 128, 28672, 128256
    linear = layers * (h * q + 2 * h * kv + q * h + 3 * h * inter)
    other = 2 * vocab * h + layers * 2 * h + h
    # + each linear module's fp32 weight_scale and input_scale (ModelOpt FP8, static activations),
    # and each layer's k_scale and v_scale (kv_cache_quant_algo FP8)
    assert m.weight_bytes == linear * 1 + other * 2 + layers * 7 * 8 + layers * 8 == 72_656_376_832
    cfg = _cfg("nvidia--Llama-3.1-70B-Instruct-FP8")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "W4A8_AWQ"}}))
    with pytest.raises(ScenarioError, match="hf_quant_config.json quantization.quant_algo: 'W4A8_AWQ': not modelled"):
        model_from_hf_config(tmp_path)
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "FP8"}}))
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "quantization_config": {"quant_method": "fp8"}}))
    with pytest.raises(ScenarioError, match="quantization_config and an hf_quant_config.json beside it"):
        model_from_hf_config(tmp_path)


def test_weight_block_size_is_for_fp8_weights_only(tmp_path):
    from sim.presets.models import model_from_fields

    base = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128,
            "vocab_size": 256}
    with pytest.raises(ScenarioError, match=r"s.yaml: model.weight_block_size: 128: block scales are "
                                            r"modelled for FP8 weights only \(linear_weight_bytes: 1\)"):
        model_from_fields({**base, "weight_block_size": 128}, "s.yaml: model")
    assert model_from_fields({**base, "weight_block_size": 128, "linear_weight_bytes": 1},
                             "m").weight_block_size == 128


def test_llama4_scout_is_sized_by_hand():
    """Llama-4-Scout-17B-16E (Meta's config.json, from the AIConfigurator wheel): its text decoder.
    Per layer: attention q 5120x5120 + k, v 2 x 5120x1024 + o 5120x5120 = 62,914,560; 16 routed +
    1 shared experts of 3 x 5120 x 8192 = 2,139,095,040, router 5120 x 16 = 81,920. 48 layers, an
    untied 202,048 x 5120 embedding and LM head (2,068,971,520), 2 norms a layer + the final one
    (496,640): 107,769,861,120 parameters, 215.5 GB in bf16. Chunked attention on the 36 RoPE
    layers (every 4th of 48 is global), sized as a window of one chunk (8192)."""
    m = model_from_hf_config(FIXTURES / "meta-llama--Llama-4-Scout-17B-16E-Instruct.json")
    per_layer = 62_914_560 + 17 * 3 * 5120 * 8192 + 5120 * 16
    assert m.num_params == 48 * per_layer + 2 * 202_048 * 5120 + 2 * 48 * 5120 + 5120 == 107_769_861_120
    assert m.weight_bytes == 2 * 107_769_861_120
    assert (m.moe.num_experts, m.moe.experts_per_token, m.moe.expert_intermediate_size, m.moe.shared_experts,
            m.moe.dense_layers) == (16, 1, 8192, 1, 0)
    assert (m.sliding_window, m.sliding_layers) == (8192, 36)
    # KV per token per rank at TP 8: 48 layers x K and V x 8 heads x 128 x 2 bytes / 8
    assert kv_bytes_per_token_per_rank(m, 8) == 48 * 2 * 8 * 128 * 2 // 8 == 24_576


def test_llama4_maverick_alternates_dense_and_moe_layers_by_hand(tmp_path):
    """interleave_moe_layer_step 2: of 48 layers the 24 with (i + 1) % 2 == 0 are MoE (128 experts of
    8,192, top-1, plus one shared of the same width, a 5,120 x 128 router), the other 24 dense MLPs of
    intermediate_size_mlp 16,384. Attention: q and o 5,120 x 5,120, k and v 5,120 x 1,024 a layer.
    Embedding and LM head (untied) 202,048 x 5,120 each; norms 2 x 5,120 a layer + the final one.
    400,711,848,960 in all (Meta: "400B"); per token 16,149,708,800 matmul weights (Meta: "17B active",
    the embedding included)."""
    m = model_from_hf_config(FIXTURES / "meta-llama--Llama-4-Maverick-17B-128E-Instruct.json")
    attention = 2 * 5120 * 5120 + 2 * 5120 * 1024
    dense, expert = 3 * 5120 * 16384, 3 * 5120 * 8192
    moe = 128 * expert + expert + 5120 * 128
    embed = 2 * 202048 * 5120
    norms = 48 * 2 * 5120 + 5120
    assert m.num_params == 48 * attention + 24 * dense + 24 * moe + embed + norms == 400_711_848_960
    assert m.matmul_params == 48 * attention + 24 * dense + 24 * (2 * expert + 5120 * 128) + 202048 * 5120
    assert (m.intermediate_size, m.moe.dense_layers, m.moe.num_experts) == (16384, 24, 128)
    cfg = json.loads((FIXTURES / "meta-llama--Llama-4-Maverick-17B-128E-Instruct.json").read_text())
    cfg["text_config"]["interleave_moe_layer_step"] = 0
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ScenarioError, match="interleave_moe_layer_step: 0 is not a positive integer"):
        model_from_hf_config(tmp_path / "config.json")


def test_llama4_with_a_vision_encoder_says_it_is_not_counted(tmp_path):
    from sim.config.errors import ServesimWarning

    cfg = json.loads((FIXTURES / "meta-llama--Llama-4-Scout-17B-16E-Instruct.json").read_text())
    cfg["vision_config"] = {"hidden_size": 1408, "num_hidden_layers": 34}
    cfg["text_config"]["no_rope_layers"] = [1, 1, 1, 0] * 12
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.warns(ServesimWarning, match="the vision encoder .* is not counted"):
        m = model_from_hf_config(tmp_path / "config.json")
    assert m.sliding_layers == 36 and m.num_params == 107_769_861_120


def test_llama4_scout_runs_on_costs_composed_from_measured_kernels(tmp_path):
    """Scout's experts (hidden 5120, 16 of width 8192, top-1) are a shape the kernel tables time (every
    measured MoE shape is imported, not only the presets'): composed, measured, no notice."""
    raw = {"name": "scout", "model": {"hf_config": str(FIXTURES / "meta-llama--Llama-4-Scout-17B-16E-Instruct.json")},
           "hardware": "h100-sxm", "engine": {"scheduler": "chunked", "tensor_parallel_size": 8},
           "workload": {"arrival": {"process": "poisson", "rate": 4}, "num_requests": 50,
                        "prompt_tokens": {"dist": "fixed", "value": 12000}, "output_tokens": {"dist": "fixed", "value": 50}}}
    import servesim

    r = servesim.run(raw)
    assert r.summary["completed"] == 50
    assert r.scenario.cost_model.name == "measured" and r.scenario.cost_model.notice is None
    assert r.summary["run"]["cost_model"]["profile"].startswith("<composed: ")


def test_capacity_on_llama4_scout_from_its_config():
    """servesim capacity reads the config: 107.8B parameters, 16.1B active per token (48 layers of
    attention + 1 routed + 1 shared expert + router, plus the LM head: 48 x 314,654,720 +
    1,034,485,760), 24,576 KV bytes per token per GPU at TP 8."""
    result = CliRunner().invoke(app, ["capacity", "--model", str(FIXTURES / "meta-llama--Llama-4-Scout-17B-16E-Instruct.json"),
                                      "--gpu", "h100-sxm", "--tp", "8", "--json"])
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    assert d["num_params"] == 107_769_861_120
    assert d["active_params"] == 48 * (62_914_560 + 2 * 3 * 5120 * 8192 + 5120 * 16) + 202_048 * 5120
    assert d["kv_bytes_per_token"] == 24_576 and d["sliding_window"] == 8192


# ---- Llama-shaped model types beyond Llama's (transformers 5.19.0's config defaults, the README)

def _dense_params(c: dict, qkv_bias: bool = False) -> int:
    """A gated-MLP decoder's weights from its config, by hand: attention (head_dim from the config
    or hidden / heads), gate/up/down, 2 norms a layer, embedding, LM head unless tied, final norm."""
    h, layers, vocab, inter = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], c["intermediate_size"]
    heads, kv = c["num_attention_heads"], c["num_key_value_heads"]
    hd = c.get("head_dim") or h // heads
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h + ((heads + 2 * kv) * hd if qkv_bias else 0)
    per_layer = attn + 3 * h * inter + 2 * h
    return layers * per_layer + vocab * h * (1 if c["tie_word_embeddings"] else 2) + h


@pytest.mark.parametrize("name, params", [
    # Granite: Llama plus scalar multipliers (no weights): Llama-2-7B's shape and count by default
    ("transformers--GraniteConfig-defaults", 6_738_415_616),
    # Phi-3 / Phi-4: q/k/v and gate/up fused, the same weights; the defaults are Phi-3-mini's 3.82 B
    ("transformers--Phi3Config-defaults", 3_821_079_552),
    # Gemma (1): head_dim 256 x 16 heads (4,096) over hidden 3,072, tied embeddings: Gemma-7B's 8.54 B
    ("transformers--GemmaConfig-defaults", 8_537_680_896),
    # OLMo-2: q/k RMSNorms besides (2 x 4,096 a layer, not counted)
    ("transformers--Olmo2Config-defaults", 6_888_361_984),
])
def test_llama_shaped_model_types_by_hand(name, params):
    c = _cfg(name)
    m = model_from_hf_config(FIXTURES / f"{name}.json")
    assert _dense_params(c) == params and m.num_params == params and m.weight_bytes == 2 * params
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    assert m.kv_bytes_per_token == 2 * c["num_hidden_layers"] * c["num_key_value_heads"] * hd * 2
    assert m.sliding_layers == 0 and m.moe is None


def test_qwen2_moe_by_hand():
    """Qwen1.5-MoE-A2.7B's layout (transformers' Qwen2MoeConfig defaults): 60 routed experts of 1,408,
    4 per token, one shared expert of 5,632 (4 x 1,408) in every layer, q/k/v biases (qkv_bias)."""
    c = _cfg("transformers--Qwen2MoeConfig-defaults")
    m = model_from_hf_config(FIXTURES / "transformers--Qwen2MoeConfig-defaults.json")
    h, layers, vocab, e, k, w = 2048, 24, 151936, 60, 4, 1408
    assert (c["hidden_size"], c["num_hidden_layers"], c["vocab_size"], c["num_experts"],
            c["num_experts_per_tok"], c["moe_intermediate_size"], c["shared_expert_intermediate_size"]) == (
        h, layers, vocab, e, k, w, 4 * w)
    attn = 4 * h * h + 3 * h                       # q, k, v, o (16 heads of 128) + q/k/v biases
    routed, router, shared = e * 3 * h * w, h * e, 4 * 3 * h * w
    params = layers * (attn + routed + router + shared + 2 * h) + 2 * vocab * h + h
    assert m.moe.num_experts == e and m.moe.experts_per_token == k and m.moe.shared_experts == 4
    assert m.attention_bias and m.num_params == params and round(params / 1e9, 1) == 14.3
    matmul = 4 * h * h  # (FLOPs count matmul weights: no biases)
    assert m.flops_per_token == 2 * (layers * (matmul + k * 3 * h * w + router + shared) + vocab * h)


def test_new_model_types_simulate_on_composed_kernel_costs():
    """Granite on an A100, Gemma on an L40S, OLMo-2 on an H100 get step costs composed from the GPU's
    measured kernel tables, as a Llama config does (no roofline notice)."""
    from sim.scenario import scenario_from_dict
    for name, gpu in (("transformers--GraniteConfig-defaults", "a100-80gb"),
                      ("transformers--GemmaConfig-defaults", "l40s"),
                      ("transformers--Olmo2Config-defaults", "h100-sxm")):
        sc = scenario_from_dict({"model": {"hf_config": str(FIXTURES / f"{name}.json")}, "hardware": gpu,
                                 "workload": {"arrival": {"process": "poisson", "rate": 1.0}, "num_requests": 5,
                                              "prompt_tokens": {"dist": "fixed", "value": 100},
                                              "output_tokens": {"dist": "fixed", "value": 10}}})
        assert sc.cost_model.name == "measured" and sc.cost_model.notice is None, (name, sc.cost_model.notice)


def test_multimodal_gemma3_is_its_text_decoder(tmp_path):
    """A Gemma 3 multimodal config.json (model_type gemma3, the decoder under text_config) is sized as
    its text decoder, with a warning that the vision encoder is not counted."""
    text = _cfg("transformers--Gemma3TextConfig-defaults")
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gemma3", "text_config": text, "torch_dtype": "bfloat16",
                                "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152}}))
    with pytest.warns(UserWarning, match="vision encoder"):
        m = model_from_hf_config(path)
    from dataclasses import replace
    assert replace(m, name="x") == replace(model_from_hf_config(FIXTURES / "transformers--Gemma3TextConfig-defaults.json"),
                                           name="x")
