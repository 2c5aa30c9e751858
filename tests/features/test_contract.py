"""The feature contract (sim/features/): the registry's features meet it, their conflicts are data
the docs print, and a feature that is off changes nothing."""
from pathlib import Path

import pytest

from sim.config.errors import ScenarioError
from sim.config.scenario import resolved_yaml, scenario_from_dict
from sim.features import registry
from sim.features.contract import Feature, FeatureBase
from tests.simhelpers import _PLACEHOLDER_WORKLOAD

ROOT = Path(__file__).resolve().parents[2]


def test_every_feature_meets_the_contract():
    for key, f in registry.FEATURES.items():
        assert isinstance(f, FeatureBase) and f.key == key and f.title
        for hook in Feature.__dict__:
            if not hook.startswith("_") and callable(getattr(Feature, hook, None)):
                assert callable(getattr(f, hook)), (key, hook)


def test_the_docs_print_the_rules():
    assert registry.compatibility_markdown() in (ROOT / "docs" / "simulator.md").read_text()


def test_a_top_level_key_per_feature_and_their_sections_round_trip():
    raw = {"name": "t", "model": "llama-3-8b", "hardware": "h100-sxm", "cost_model": "unit",
           "engine": {"replicas": 2}, "workload": _PLACEHOLDER_WORKLOAD,
           "energy": {"pue": 1.3}, "faults": {"outages": [{"replica": 1, "at_s": 5, "down_s": 2}]}}
    sc = scenario_from_dict(raw)
    again = scenario_from_dict(__import__("yaml").safe_load(resolved_yaml(sc)))
    assert again.features == sc.features
    with pytest.raises(ScenarioError, match=r"fault: unknown key \(did you mean .faults.\?\); allowed: .*energy, faults"):
        scenario_from_dict({**raw, "fault": {}})


def test_a_rule_is_refused_naming_both_sides():
    raw = {"name": "t", "model": "llama-3-8b", "hardware": "h100-sxm", "cost_model": "unit",
           "engine": {"disaggregation": {"prefill_replicas": 1, "decode_replicas": 1}},
           "workload": _PLACEHOLDER_WORKLOAD, "faults": {"outages": [{"replica": 0, "at_s": 5, "down_s": 2}]}}
    with pytest.raises(ScenarioError, match=r"faults: not modelled together with engine.disaggregation \(a failed"):
        scenario_from_dict(raw)
