"""`servesim capacity`: the memory budget table, its JSON, presets, --scenario and one-line errors."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app
from sim.presets.hardware import HARDWARE_PRESETS
from sim.presets.memory import kv_budget
from sim.presets.models import MODEL_PRESETS
from simhelpers import assert_one_line_error

REPO = Path(__file__).parents[2]
runner = CliRunner()


def capacity(*args: str):
    return runner.invoke(app, ["capacity", *map(str, args)])


def capacity_json(*args: str) -> dict:
    result = capacity(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_llama3_8b_on_h100_matches_the_documented_budget():
    # docs/cost_models.md: 72.0e9 - 16.06e9 - 2.05e9 = 53.89e9 B / 2,097,152 B = 25,698 blocks.
    b = capacity_json("--model", "llama-3-8b", "--gpu", "h100-sxm", "--seq-len", "1250")
    assert b["num_gpu_blocks"] == 25_698 and b["block_bytes"] == 2_097_152
    assert b["kv_bytes_per_token"] == 131_072 and b["usable_bytes"] == pytest.approx(72e9)
    assert b["blocks_per_seq"] == 79 and b["max_concurrent_seqs"] == 25_698 // 79 == 325
    assert b["max_tokens"] == 25_698 * 16


def test_tensor_parallel_budget_equals_kv_budget():
    b = capacity_json("--model", "llama-3-70b", "--gpu", "h100-sxm", "--tp", "4", "--seq-len", "4096",
                      "--block-size", "32", "--gpu-memory-utilization", "0.85", "--max-num-batched-tokens", "4096")
    ref = kv_budget(MODEL_PRESETS["llama-3-70b"], HARDWARE_PRESETS["h100-sxm"], tensor_parallel_size=4,
                    gpu_memory_utilization=0.85, block_size=32, max_num_batched_tokens=4096)
    assert b["weight_bytes_per_gpu"] == pytest.approx(ref.weight_bytes_per_gpu)
    assert b["activation_reserve_bytes"] == ref.activation_reserve_bytes
    assert (b["num_gpu_blocks"], b["block_bytes"]) == (ref.num_gpu_blocks, ref.block_bytes)
    assert b["max_concurrent_seqs"] == ref.num_gpu_blocks // (4096 // 32)


def test_a_40_gb_model_on_an_80_gb_gpu():
    # Qwen2.5-32B at tp=2: ~32.8 GB of weights per H100, ~37 GB left for KV.
    b = capacity_json("--model", "qwen2.5-32b", "--gpu", "h100-sxm", "--tp", "2", "--seq-len", "8192")
    assert 32e9 < b["weight_bytes_per_gpu"] < 34e9
    assert b["kv_cache_bytes"] == b["num_gpu_blocks"] * b["block_bytes"]
    assert b["usable_bytes"] - b["weight_bytes_per_gpu"] - b["activation_reserve_bytes"] - b["kv_cache_bytes"] \
        < b["block_bytes"]
    assert b["max_concurrent_seqs"] == b["num_gpu_blocks"] // 512 > 0


def test_table_output():
    result = capacity("--model", "llama-3-70b", "--gpu", "h100-sxm", "--tp", "4", "--seq-len", "4096")
    assert result.exit_code == 0, result.output
    for label in ("weights per GPU", "KV bytes per token", "KV bytes per block", "KV blocks per GPU",
                  "concurrent sequences of 4,096 tokens"):
        assert label in result.stdout


def test_scenario_supplies_model_gpu_and_engine_and_options_override_it():
    scenario = REPO / "scenarios" / "quickstart.yaml"
    from_scenario = capacity_json("--scenario", scenario)
    assert from_scenario["model"] == "llama-3-8b" and from_scenario["num_gpu_blocks"] == 25_698
    other = capacity_json("--scenario", scenario, "--gpu", "h200", "--block-size", "32")
    assert other["gpu"] == "h200" and other["block_bytes"] == 2 * from_scenario["block_bytes"]


def test_hf_config_path(tmp_path):
    config = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 128, "vocab_size": 256}
    (tmp_path / "config.json").write_text(json.dumps(config))
    b = capacity_json("--model", tmp_path / "config.json", "--gpu", "l40s")
    assert b["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 2


@pytest.mark.parametrize("args, says", [
    (["--model", "llama-3-80b", "--gpu", "h100-sxm"], "--model: unknown preset 'llama-3-80b'; presets: deepseek-v3, gpt-oss-120b, gpt-oss-20b, llama-125m"),
    (["--model", "llama-3-8b", "--gpu", "h100"], "--gpu: unknown preset 'h100'; presets: a100-80gb, b200, b300, gb200, gb300, h100-sxm"),
    (["--gpu", "h100-sxm"], "--model: missing"),
    (["--model", "llama-3-8b"], "--gpu: missing"),
    (["--model", "llama-3-70b", "--gpu", "h100-sxm"], "141.1 GB of weights per GPU"),
    (["--model", "llama-3-8b", "--gpu", "h100-sxm", "--tp", "3"],
     "--tp: 3 does not divide the 32 attention heads of llama-3-8b; allowed: 1, 2, 4, 8, 16, 32"),
    (["--model", "llama-3-8b", "--gpu", "h100-sxm", "--tp", "0"], "--tp: 0 does not divide"),
    (["--model", "llama-3-8b", "--gpu", "h100-sxm", "--gpu-memory-utilization", "1.5"],
     "--gpu-memory-utilization: 1.5 is not a number in (0, 1]"),
    # vLLM's rule as for a scenario's engine.block_size: 7 used to be accepted.
    (["--model", "llama-3-8b", "--gpu", "h100-sxm", "--block-size", "7"],
     "--block-size: 7 is not a power of two in [1, 1024]"),
    (["--model", "llama-3-8b", "--gpu", "h100-sxm", "--max-num-batched-tokens", "0"],
     "--max-num-batched-tokens: 0 is not an integer >= 1"),
    (["--model", "llama-3-8b", "--gpu", "h100-sxm", "--seq-len", "0"], "--seq-len"),
    (["--scenario", "nope.yaml"], "nope.yaml: no such file"),
])
def test_errors_are_one_line(args, says):
    assert_one_line_error(capacity(*args), says)


def test_capacity_help():
    result = capacity("--help")
    assert result.exit_code == 0 and "--seq-len" in result.output and "--scenario" in result.output


def test_parallel_layouts_per_gpu_by_hand(tmp_path):
    """DeepSeek-V3 at DP8 with EP on H200s: every GPU keeps the 18,971,998,208 non-expert bytes whole
    and 32 of the 256 experts (2,554,331,136 bytes each over its 58 MoE layers); Llama-3-8B in two
    pipeline stages: the busiest holds 16 layers plus embedding, head and final norm. A scenario's
    layout is the default (tests/cost/test_expert_parallel.py and test_pipeline.py check the same
    bytes through the scenario)."""
    ds = capacity_json("--model", "deepseek-v3", "--gpu", "h200", "--dp", "8", "--ep")
    assert ds["weight_bytes_per_gpu"] == 19_082_135_904 + 32 * 2_554_954_752  # (tests/cost/test_expert_parallel.py)
    assert ds["routed_expert_bytes_per_gpu"] == 32 * 2_554_954_752 and ds["data_parallel_size"] == 8
    pp = capacity_json("--model", "llama-3-8b", "--gpu", "h100-sxm", "--pp", "2")
    assert pp["weight_bytes_per_gpu"] == 9_080_938_496 and pp["kv_bytes_per_token"] == 65_536
    (tmp_path / "s.yaml").write_text(
        "model: llama-3-8b\nhardware: h100-sxm\nengine: {pipeline_parallel_size: 2}\n"
        "workload: {arrival: {process: burst}, num_requests: 1, prompt_tokens: {dist: fixed, value: 1}, "
        "output_tokens: {dist: fixed, value: 1}}\n")
    assert capacity_json("--scenario", tmp_path / "s.yaml")["weight_bytes_per_gpu"] == 9_080_938_496
    assert_one_line_error(capacity("--model", "llama-3-8b", "--gpu", "h100-sxm", "--dp", "2"),
                          "--dp: data-parallel ranks are modelled for a mixture-of-experts model with --ep")
    assert_one_line_error(capacity("--model", "llama-3-8b", "--gpu", "h100-sxm", "--pp", "40"),
                          "--pp: 40 is not a number of pipeline stages in [1, 32]")
