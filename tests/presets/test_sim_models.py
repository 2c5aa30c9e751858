"""Model and hardware presets, derived sizes, config parsing, and the KV memory budget."""
import json
from dataclasses import replace

import pytest

from sim.config.errors import ScenarioError
from sim.presets.hardware import HARDWARE_PRESETS, hardware_from_fields
from sim.presets.memory import kv_budget
from sim.presets.models import MODEL_PRESETS, model_from_fields, model_from_hf_config

# Parameter counts Hugging Face reports for each checkpoint (sum of tensor sizes).
HF_PARAM_COUNTS = {
    "llama-2-7b": 6_738_415_616,
    "llama-2-13b": 13_015_864_320,
    "llama-2-70b": 68_976_648_192,
    "llama-3-8b": 8_030_261_248,
    "llama-3-70b": 70_553_706_496,
    "mistral-7b": 7_241_732_096,
    "qwen2.5-7b": 7_615_616_512,
    "qwen2.5-32b": 32_763_876_352,
}


@pytest.mark.parametrize("name, expected", sorted(HF_PARAM_COUNTS.items()))
def test_param_counts_match_published_checkpoints(name, expected):
    assert MODEL_PRESETS[name].num_params == expected


def test_preset_config_values():
    m = MODEL_PRESETS["llama-3-70b"]
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_kv_heads, m.head_dim,
            m.intermediate_size, m.vocab_size) == (80, 8192, 64, 8, 128, 28672, 128256)
    q = MODEL_PRESETS["qwen2.5-7b"]
    assert (q.num_layers, q.hidden_size, q.num_kv_heads, q.head_dim, q.attention_bias) == \
        (28, 3584, 4, 128, True)
    assert MODEL_PRESETS["mistral-7b"].vocab_size == 32000
    assert all(not m.tie_word_embeddings for m in MODEL_PRESETS.values())
    assert all(name == m.name for name, m in MODEL_PRESETS.items())


def test_kv_bytes_per_token():
    llama2 = MODEL_PRESETS["llama-2-7b"]
    assert llama2.kv_bytes_per_token == 524_288  # "512 KB per token" in fp16
    assert llama2.kv_bytes_per_token // llama2.num_layers == 16_384  # the "16 KB" is per layer
    assert MODEL_PRESETS["llama-3-8b"].kv_bytes_per_token == 131_072  # GQA: 8 kv heads
    assert MODEL_PRESETS["llama-3-70b"].kv_bytes_per_token == 327_680


def test_weight_bytes_and_flops():
    m = MODEL_PRESETS["llama-3-8b"]
    assert m.weight_bytes == 2 * 8_030_261_248
    # matmul params = all params minus embedding (lm_head is untied) minus 65 norms of 4096.
    matmul = 8_030_261_248 - 128256 * 4096 - (2 * 32 + 1) * 4096
    assert m.flops_per_token == 2 * matmul


def test_qwen_biases_counted_and_tying_removes_lm_head():
    q = MODEL_PRESETS["qwen2.5-7b"]
    no_bias = replace(q, attention_bias=False)
    assert q.num_params - no_bias.num_params == 28 * (3584 + 2 * 512)
    tied = replace(q, tie_word_embeddings=True)
    assert q.num_params - tied.num_params == 152064 * 3584
    assert tied.flops_per_token == q.flops_per_token  # tied lm_head is still a matmul


def test_tiny_preset():
    t = MODEL_PRESETS["tiny"]
    assert (t.num_layers, t.hidden_size, t.num_attention_heads, t.num_kv_heads, t.head_dim,
            t.intermediate_size, t.vocab_size) == (2, 64, 4, 2, 16, 128, 256)
    # embed + 2 x (q 64x64 + k,v 64x32 + o 64x64 + mlp 3x64x128 + 2 norms) + norm + lm_head
    assert t.num_params == 256 * 64 + 2 * (4096 + 2 * 2048 + 4096 + 3 * 8192 + 128) + 64 + 256 * 64


def _write_config(tmp_path, **cfg):
    path = tmp_path / "Meta-Llama-3-8B" / "config.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(cfg))
    return path


LLAMA3_CONFIG = dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
                     num_key_value_heads=8, intermediate_size=14336, vocab_size=128256,
                     torch_dtype="bfloat16", tie_word_embeddings=False, model_type="llama",
                     attention_bias=False)


def test_hf_config_round_trip(tmp_path):
    path = _write_config(tmp_path, **LLAMA3_CONFIG)
    m = model_from_hf_config(path)
    assert m == replace(MODEL_PRESETS["llama-3-8b"], name="Meta-Llama-3-8B")
    assert model_from_hf_config(path.parent, name="x").name == "x"  # folder works too


def test_hf_config_defaults_and_qwen_bias(tmp_path):
    cfg = {k: v for k, v in LLAMA3_CONFIG.items()
           if k not in ("num_key_value_heads", "torch_dtype", "attention_bias")}
    m = model_from_hf_config(_write_config(tmp_path, **{**cfg, "head_dim": None,
                                                         "model_type": "qwen2"}))
    assert (m.num_kv_heads, m.head_dim, m.dtype_bytes, m.attention_bias) == (32, 128, 2, True)
    m32 = model_from_hf_config(_write_config(tmp_path, **{**cfg, "torch_dtype": "float32"}))
    assert m32.dtype_bytes == 4


def test_hf_config_errors(tmp_path):
    cfg = {k: v for k, v in LLAMA3_CONFIG.items() if k != "intermediate_size"}
    path = _write_config(tmp_path, **cfg)
    with pytest.raises(ScenarioError, match=r"config\.json: missing key 'intermediate_size'"):
        model_from_hf_config(path)
    with pytest.raises(ScenarioError, match="file not found"):
        model_from_hf_config(tmp_path / "nope.json")
    with pytest.raises(ScenarioError, match="torch_dtype 'int3'.*allowed: float32"):
        model_from_hf_config(_write_config(tmp_path, **{**LLAMA3_CONFIG, "torch_dtype": "int3"}))
    path.write_text("{not json")
    with pytest.raises(ScenarioError, match="not valid JSON"):
        model_from_hf_config(path)


TINY_FIELDS = dict(num_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                   vocab_size=256)


def test_model_from_fields():
    m = model_from_fields({**TINY_FIELDS, "name": "m", "num_kv_heads": 2}, "s.yaml: model")
    assert m == replace(MODEL_PRESETS["tiny"], name="m")


@pytest.mark.parametrize("change, message", [
    ({"num_layer": 2}, "s.yaml: model.num_layer: unknown key \\(did you mean 'num_layers'\\?\\); allowed: name, num_layers"),
    ({"hidden_size": None}, "s.yaml: model.hidden_size: missing; required: num_layers"),
    ({"hidden_size": -1}, "s.yaml: model.hidden_size: -1 is not an integer >= 1"),
    ({"num_layers": 2.5}, "model.num_layers: 2.5 is not an integer >= 1"),
    ({"num_layers": True}, "model.num_layers: true is not an integer >= 1"),
    ({"num_kv_heads": 3}, r"model.num_kv_heads: 3 does not divide num_attention_heads \(4\)"),
    ({"dtype_bytes": 3}, "model.dtype_bytes: 3 is not one of 1, 2, 4"),
    ({"attention_bias": "yes"}, "model.attention_bias: 'yes' is not true or false"),
    ({"name": ""}, "model.name: '' is not a non-empty string"),
])
def test_model_from_fields_errors(change, message):
    fields = {k: v for k, v in {**TINY_FIELDS, **change}.items() if v is not None}
    with pytest.raises(ScenarioError, match=message):
        model_from_fields(fields, "s.yaml: model")
    with pytest.raises(ScenarioError, match="s.yaml: model: a list is not a mapping"):
        model_from_fields([1], "s.yaml: model")


def test_hardware_presets():
    h = HARDWARE_PRESETS["h100-sxm"]
    assert (h.memory_bytes, h.hbm_bandwidth, h.bf16_flops, h.interconnect_bandwidth) == \
        (80e9, 3.35e12, 989e12, 450e9)
    assert HARDWARE_PRESETS["h200"].memory_bytes == 141e9
    assert HARDWARE_PRESETS["a100-80gb"].bf16_flops == 312e12
    assert HARDWARE_PRESETS["l40s"].interconnect_bandwidth == 32e9
    assert all(h.name == n for n, h in HARDWARE_PRESETS.items())
    # a price where one can be cited; the newest GPUs have none ("unknown": the planner asks for one)
    unpriced = {"b300", "gb200", "gb300", "mi325x", "mi355x", "rtx-pro-6000"}
    assert {n for n, h in HARDWARE_PRESETS.items() if h.usd_per_hour == 0} == unpriced
    assert all(h.usd_per_hour > 0 for n, h in HARDWARE_PRESETS.items() if n not in unpriced)
    # NVL72 racks: 72 GPUs on one NVLink domain; every other preset 8 (an HGX board)
    assert {n: h.nvlink_domain for n, h in HARDWARE_PRESETS.items() if h.nvlink_domain != 8} == {"gb200": 72, "gb300": 72}
    mi = HARDWARE_PRESETS["mi355x"]  # AMD, as reported: 5 PFLOP/s fp8, bf16 half; 7 x 153.6 GB/s links both ways
    assert (mi.memory_bytes, mi.hbm_bandwidth, mi.bf16_flops, mi.fp8_flops, mi.interconnect_bandwidth) == \
        (288e9, 8e12, 2.5e15, 5e15, 7 * 153.6e9 / 2)
    mi = HARDWARE_PRESETS["mi300x"]  # AMD, by datasheet
    assert (mi.memory_bytes, mi.hbm_bandwidth, mi.bf16_flops, mi.fp8_flops) == (192e9, 5.3e12, 1.3e15, 2.6e15)


def test_hardware_from_fields():
    h = hardware_from_fields({"name": "g", "memory_bytes": "24e9", "hbm_bandwidth": 1e12,
                              "bf16_flops": 1e14}, "s.yaml: hardware")
    assert (h.memory_bytes, h.interconnect_bandwidth, h.usd_per_hour) == (24e9, 0.0, 0.0)
    with pytest.raises(ScenarioError, match="s.yaml: hardware.memory: unknown key"):
        hardware_from_fields({"memory": 1}, "s.yaml: hardware")
    with pytest.raises(ScenarioError, match="hardware.bf16_flops: missing; required"):
        hardware_from_fields({"memory_bytes": 1, "hbm_bandwidth": 1}, "s.yaml: hardware")
    with pytest.raises(ScenarioError, match="w.hbm_bandwidth: 0 is not a number > 0"):
        hardware_from_fields({"memory_bytes": 1, "hbm_bandwidth": 0, "bf16_flops": 1}, "w")
    with pytest.raises(ScenarioError, match="w.memory_bytes: 'lots' is not a number > 0"):
        hardware_from_fields({"memory_bytes": "lots", "hbm_bandwidth": 1, "bf16_flops": 1}, "w")


def _budget(model="llama-3-8b", hw="h100-sxm", **kw):
    args = dict(tensor_parallel_size=1, gpu_memory_utilization=0.9, block_size=16)
    return kv_budget(MODEL_PRESETS[model], HARDWARE_PRESETS[hw], **{**args, **kw})


def test_kv_budget_llama3_8b_h100_by_hand():
    b = _budget(max_num_batched_tokens=8192)
    usable = 0.9 * 80e9
    weights = 2 * 8_030_261_248
    # 1 GiB fixed + 8192 tokens x (4 x 4096 + 3 x 14336) elements x 2 bytes
    reserve = 2**30 + 8192 * (4 * 4096 + 3 * 14336) * 2
    block = 16 * 131_072
    assert (b.usable_bytes, b.weight_bytes_per_gpu, b.activation_reserve_bytes) == \
        (usable, weights, reserve)
    assert b.block_bytes == block == 2_097_152
    assert b.num_gpu_blocks == int((usable - weights - reserve) // block) == 25_698
    assert b.kv_cache_bytes == 25_698 * block
    assert b.max_concurrent_seqs(4096) == 25_698 // 256
    assert b.max_concurrent_seqs(4097) == 25_698 // 257


def test_kv_budget_tensor_parallel_and_override():
    b = _budget("llama-3-70b", tensor_parallel_size=4, max_num_batched_tokens=2048)
    assert b.weight_bytes_per_gpu == 2 * 70_553_706_496 / 4
    assert b.kv_bytes_per_token == 327_680 // 4  # 2 of 8 kv heads per rank
    reserve = 2**30 + 2048 * (4 * 8192 + 3 * 28672 // 4) * 2
    assert b.num_gpu_blocks == int((72e9 - 2 * 70_553_706_496 / 4 - reserve) // (16 * 81_920))
    # tp beyond kv heads replicates them: 16 ranks still hold one kv head each
    assert _budget("llama-3-70b", tensor_parallel_size=16).kv_bytes_per_token == 2 * 80 * 128 * 2
    assert _budget(num_gpu_blocks=100).num_gpu_blocks == 100
    assert _budget(num_gpu_blocks=100).kv_cache_bytes == 100 * 2_097_152


def test_kv_budget_does_not_fit():
    with pytest.raises(ScenarioError) as err:
        _budget("llama-3-70b", where="chat.yaml: model")
    assert str(err.value) == (
        "chat.yaml: model: llama-3-70b needs 141.1 GB of weights per GPU at tensor_parallel_size=1"
        " but h100-sxm has 72.0 GB usable (gpu_memory_utilization 0.9); raise "
        "tensor_parallel_size or use a bigger GPU")
    # 70.6 GB of weights fit in 72.0 GB, but the 2.3 GB activation reserve leaves no KV room.
    with pytest.raises(ScenarioError, match=r"^s.yaml: model: llama-3-70b at tensor_parallel_size"
                                            r"=2 leaves no room for the KV cache on h100-sxm"):
        _budget("llama-3-70b", tensor_parallel_size=2, where="s.yaml: model")
    assert _budget("llama-3-70b", tensor_parallel_size=2, max_num_batched_tokens=512,
                   gpu_memory_utilization=0.95).num_gpu_blocks > 0


@pytest.mark.parametrize("kw, message", [
    ({"tensor_parallel_size": 3}, "tensor_parallel_size must divide num_attention_heads \\(32\\)"),
    ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization must be in \\(0, 1\\], got 1.5"),
    ({"block_size": 0}, "block_size must be a positive integer, got 0"),
    ({"num_gpu_blocks": 0}, "num_gpu_blocks must be a positive integer, got 0"),
])
def test_kv_budget_bad_arguments(kw, message):
    with pytest.raises(ScenarioError, match="^s.yaml: engine: " + message):
        _budget(where="s.yaml: engine", **kw)


def test_a_gpu_without_kernel_tables_is_estimated_and_says_so():
    """mi300x has no measured tables: the default cost model falls back to the roofline, with a notice."""
    from sim.scenario import scenario_from_dict

    raw = {"name": "amd", "model": "llama-3-70b", "hardware": "mi300x", "engine": {"tensor_parallel_size": 2},
           "workload": {"arrival": {"process": "poisson", "rate": 1.0}, "num_requests": 10,
                        "prompt_tokens": {"dist": "fixed", "value": 100}, "output_tokens": {"dist": "fixed", "value": 10}}}
    sc = scenario_from_dict(raw)
    assert sc.cost_model.name == "roofline"
    assert "estimated" in sc.cost_model.notice and "no kernel tables for mi300x" in sc.cost_model.notice
