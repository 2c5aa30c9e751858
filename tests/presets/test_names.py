"""Names people type for presets (sim/presets/names.py)."""
from __future__ import annotations

import pytest

from sim.config.errors import ScenarioError
from sim.presets.hardware import HARDWARE_PRESETS
from sim.presets.models import MODEL_PRESETS
from sim.presets.names import hardware_preset, model_preset


@pytest.mark.parametrize("typed, preset", [("h100", "h100-sxm"), ("H100-SXM", "h100-sxm"),
                                           ("H100 80GB HBM3", "h100-sxm"), ("A100 SXM4 80GB", "a100-80gb"),
                                           ("h200", "h200")])
def test_hardware_aliases(typed, preset):
    assert hardware_preset(typed, HARDWARE_PRESETS, "x") == preset


@pytest.mark.parametrize("typed, preset", [("meta-llama/Meta-Llama-3-8B-Instruct", "llama-3-8b"),
                                           ("llama-3.1-8b", "llama-3-8b"), ("Llama-3.1-70B-Instruct", "llama-3-70b"),
                                           ("Qwen/Qwen3-30B-A3B", "qwen3-30b-a3b"), ("Mixtral-8x7B", "mixtral-8x7b")])
def test_model_aliases_and_repository_ids(typed, preset):
    assert model_preset(typed, MODEL_PRESETS, "x") == preset


def test_a_refused_name_gets_a_did_you_mean():
    with pytest.raises(ScenarioError, match=r"s.yaml: hardware: unknown preset 'h10' \(did you mean 'h100'"):
        hardware_preset("h10", HARDWARE_PRESETS, "s.yaml: hardware")
    with pytest.raises(ScenarioError, match=r"unknown preset 'lama-2-7b' \(did you mean 'llama-2-7b'"):
        model_preset("lama-2-7b", MODEL_PRESETS, "model")


def test_every_vllm_serve_repository_resolves_to_its_preset():
    from sim.planning.vllm_command import HF_REPOS
    for preset, repo in HF_REPOS.items():
        assert model_preset(repo, MODEL_PRESETS, "x") == preset
