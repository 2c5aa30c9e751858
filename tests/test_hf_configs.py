"""Real published config.json files (tests/fixtures/hf_configs/, from the AIConfigurator wheel):
dense Llama-style ones are sized as computed by hand here; architectures servesim does not model
yet are refused naming the field (never a silent dense sizing)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app
from sim.errors import ScenarioError
from sim.memory import kv_bytes_per_token_per_rank
from sim.models import model_from_hf_config

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "hf_configs"


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


@pytest.mark.parametrize("name, field, what", [
    ("mistralai--Mixtral-8x7B-v0.1", "num_local_experts: 8", "mixture of experts"),
    ("Qwen--Qwen3-30B-A3B", "num_experts: 128", "mixture of experts"),
    ("deepseek-ai--DeepSeek-V3", "n_routed_experts: 256", "mixture of experts"),
    ("openai--gpt-oss-20b", "num_local_experts: 32", "mixture of experts"),
])
def test_unmodelled_architectures_are_refused_naming_the_field(name, field, what):
    with pytest.raises(ScenarioError, match=f"{name}.json: {field}: {what} is not modelled yet"):
        model_from_hf_config(FIXTURES / f"{name}.json")


@pytest.mark.parametrize("change, message", [
    ({"kv_lora_rank": 512}, "kv_lora_rank: 512: multi-head latent attention"),
    ({"quantization_config": {"quant_method": "fp8"}}, "quantization_config: 'fp8': quantised weights"),
    ({"sliding_window": 4096}, "sliding_window: 4096: sliding-window attention is not modelled"),
    ({"layer_types": ["sliding_attention", "full_attention"]}, "layer_types: 'sliding_attention'"),
    ({"model_type": "gemma2"}, "model_type: 'gemma2' is not modelled"),
])
def test_each_unmodelled_field_is_named(tmp_path, change, message):
    cfg = json.loads((FIXTURES / "meta-llama--Meta-Llama-3.1-8B.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(ScenarioError, match=message):
        model_from_hf_config(tmp_path)


def test_an_inactive_sliding_window_is_fine(tmp_path):
    """Qwen2 configs carry sliding_window with use_sliding_window: false: full attention."""
    cfg = json.loads((FIXTURES / "meta-llama--Meta-Llama-3.1-8B.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "sliding_window": 4096,
                                                      "use_sliding_window": False}))
    assert model_from_hf_config(tmp_path).num_layers == 32


def test_run_refuses_a_mixtral_config_in_one_line(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(f"model: {{hf_config: {FIXTURES / 'mistralai--Mixtral-8x7B-v0.1.json'}}}\n"
                        "hardware: h100-sxm\nworkload: {arrival: {process: poisson, rate: 1}, "
                        "num_requests: 5, prompt_tokens: {dist: fixed, value: 10}, "
                        "output_tokens: {dist: fixed, value: 5}}\n")
    r = CliRunner().invoke(app, ["run", str(scenario), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "num_local_experts: 8: mixture of experts" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "o").exists()
