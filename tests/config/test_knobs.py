"""The engine's knobs as data (sim/config/knobs.py): the table the scenario parser reads is the
whole of EngineConfig's scalar fields, every knob is documented in docs/reference.md's engine
table, and every knob that is a vLLM flag reaches the `vllm serve` line."""
from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

import pytest

from sim.config.knobs import ENGINE_KNOBS
from sim.planning.vllm_command import vllm_serve
from sim.scenario import EngineConfig, scenario_from_dict
from tests.simhelpers import _PLACEHOLDER_WORKLOAD

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = {"speculative", "disaggregation", "autoscaling", "admission", "lora", "routing"}  # their own modules


def test_every_scalar_engine_field_is_a_row_of_the_table():
    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    knobs = [k.name for k in ENGINE_KNOBS]
    assert len(knobs) == len(set(knobs))
    assert set(knobs) == fields - SECTIONS  # a new field without its row (or a row without its field) fails here
    for k in ENGINE_KNOBS:  # an optional knob's default is None (absent: vLLM's default, or off)
        assert (getattr(EngineConfig, k.name) is None) == k.optional, k.name


def test_every_knob_is_in_the_docs_engine_table():
    text = (ROOT / "docs" / "reference.md").read_text()
    documented = set()
    for line in text.splitlines():
        if line.startswith("| `"):
            documented |= set(re.findall(r"`([a-z0-9_]+)`", line.split(" | ")[0]))
    assert {k.name for k in ENGINE_KNOBS} - documented == set()


# a value other than the default for each knob that is a vLLM flag, and what else it needs
EXAMPLES = {
    "block_size": ({"block_size": 32}, "llama-3-8b"),
    "max_num_seqs": ({"max_num_seqs": 64}, "llama-3-8b"),
    "max_num_batched_tokens": ({"max_num_batched_tokens": 4096}, "llama-3-8b"),
    "gpu_memory_utilization": ({"gpu_memory_utilization": 0.8}, "llama-3-8b"),
    "num_gpu_blocks": ({"num_gpu_blocks": 2000}, "llama-3-8b"),
    "tensor_parallel_size": ({"tensor_parallel_size": 2}, "llama-3-8b"),
    "pipeline_parallel_size": ({"pipeline_parallel_size": 2}, "llama-3-8b"),
    "data_parallel_size": ({"data_parallel_size": 2, "enable_expert_parallel": True}, "mixtral-8x7b"),
    "all2all_backend": ({"data_parallel_size": 2, "enable_expert_parallel": True,
                         "all2all_backend": "deepep_low_latency"}, "mixtral-8x7b"),
    "kv_cache_dtype": ({"kv_cache_dtype": "fp8"}, "llama-3-8b"),
    "enable_expert_parallel": ({"enable_expert_parallel": True, "tensor_parallel_size": 2}, "mixtral-8x7b"),
    "enable_prefix_caching": ({"enable_prefix_caching": True}, "llama-3-8b"),
    "scheduler_reserve_full_isl": ({"scheduler_reserve_full_isl": False}, "llama-3-8b"),
    "enforce_eager": ({"enforce_eager": True}, "llama-3-8b"),
    "max_cudagraph_capture_size": ({"max_cudagraph_capture_size": 256}, "llama-3-8b"),
    "kv_offloading_size": ({"kv_offloading_size": 8}, "llama-3-8b"),
    "kv_offloading_backend": ({"kv_offloading_size": 8, "kv_offloading_backend": "native"}, "llama-3-8b"),
}


@pytest.mark.parametrize("knob", [k for k in ENGINE_KNOBS if k.flag], ids=lambda k: k.name)
def test_every_flag_knob_reaches_the_serve_line(knob):
    engine, model = EXAMPLES[knob.name]
    sc = scenario_from_dict({"name": "k", "model": model, "hardware": "h100-sxm", "cost_model": "unit",
                             "engine": {"scheduler": "chunked", **engine}, "workload": _PLACEHOLDER_WORKLOAD})
    words = shlex.split(vllm_serve(sc))
    assert knob.flag in words or "--no-" + knob.flag[2:] in words, (knob.flag, words)
