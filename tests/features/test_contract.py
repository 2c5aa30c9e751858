"""The feature contract (sim/features/): the registry's features meet it, their conflicts are data
the docs print, and a feature that is off changes nothing."""
from pathlib import Path

import pytest

from sim.config.errors import ScenarioError
from sim.features import registry
from sim.features.contract import Feature, FeatureBase
from sim.scenario import resolved_yaml, scenario_from_dict
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


def test_a_feature_registered_by_one_line_reaches_every_output(monkeypatch):
    """A toy feature, registered with one entry and nothing else: its summary section, its
    requests.csv column, its line and its `vllm serve` flag all appear, and the run is otherwise
    the run without it."""
    import numpy as np

    from sim.planning.vllm_command import vllm_serve
    from sim.simulate import simulate
    from tests.simhelpers import make_workload

    class Toy(FeatureBase):
        key, title = "toy", "a feature for this test"

        def on(self, config):
            return True  # (no section needed)

        def columns(self, config, state):
            return {"toy": np.full(2, 7)}

        def summarize(self, config, state, view):
            return {"requests": len(view.requests)}

        def vllm_flags(self, config):
            return ["--toy-flag"]

    raw = {"name": "t", "model": "llama-3-8b", "hardware": "h100-sxm", "cost_model": "unit",
           "engine": {"scheduler": "chunked"}, "workload": _PLACEHOLDER_WORKLOAD}
    w = make_workload([0.0, 0.5], 4, 3)
    plain = simulate(scenario_from_dict(raw), workload=w)
    monkeypatch.setitem(registry.FEATURES, "toy", Toy())
    sc = scenario_from_dict(raw)
    run = simulate(sc, workload=w)
    assert run.summary["toy"] == {"requests": 2} and run.requests["toy"].tolist() == [7, 7]
    assert run.requests.drop(columns="toy").equals(plain.requests) and run.steps.equals(plain.steps)
    assert vllm_serve(sc).endswith("--toy-flag")
