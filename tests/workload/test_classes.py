"""workload.classes (a mix of request classes) and slo.classes (a class's own SLO): the draw, the
per-class judgement by hand, what a run reports, and the mistakes refused."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
import yaml

import servesim
from sim.config.errors import ScenarioError
from sim.runtime.metrics import judge
from sim.scenario import SLOConfig
from sim.workload.generators import build_workload
from simhelpers import make_scenario

FIXED = lambda v: {"dist": "fixed", "value": v}  # noqa: E731
MIX = {"arrival": {"process": "poisson", "rate": 10.0}, "num_requests": 3000,
       "prompt_tokens": FIXED(100), "output_tokens": FIXED(20),
       "classes": [{"name": "chat", "share": 0.6},
                   {"name": "rag", "share": 0.3, "prompt_tokens": FIXED(2000)},
                   {"name": "batch", "share": 0.1, "output_tokens": FIXED(500), "priority": 3}]}


def test_each_request_gets_a_class_by_share_and_its_class_lengths():
    sc = make_scenario(workload=MIX)
    w = build_workload(sc.workload, np.random.default_rng(0))
    assert w.class_names == ("chat", "rag", "batch")
    counts = np.bincount(w.classes, minlength=3)
    assert counts.sum() == 3000
    # shares 0.6 / 0.3 / 0.1 of 3000, within 4 binomial standard deviations
    for count, share in zip(counts, (0.6, 0.3, 0.1)):
        assert abs(count - 3000 * share) < 4 * np.sqrt(3000 * share * (1 - share))
    by = lambda k: w.classes == k  # noqa: E731
    assert set(w.prompt_tokens[by(0)]) == {100} and set(w.output_tokens[by(0)]) == {20}    # the workload's
    assert set(w.prompt_tokens[by(1)]) == {2000} and set(w.output_tokens[by(1)]) == {20}   # its own prompt
    assert set(w.prompt_tokens[by(2)]) == {100} and set(w.output_tokens[by(2)]) == {500}   # its own output
    assert set(w.priority[by(2)]) == {3} and set(w.priority[~by(2)]) == {0}
    again = build_workload(sc.workload, np.random.default_rng(0))  # one seed, one draw
    assert (again.classes == w.classes).all() and (again.arrival_s == w.arrival_s).all()


def test_a_class_mix_does_not_change_the_arrivals_of_the_same_seed():
    """Arrivals are drawn first: the same seed gives the same arrival times with or without classes."""
    plain = {k: v for k, v in MIX.items() if k != "classes"}
    a = build_workload(make_scenario(workload=plain).workload, np.random.default_rng(5))
    b = build_workload(make_scenario(workload=MIX).workload, np.random.default_rng(5))
    assert (a.arrival_s == b.arrival_s).all() and b.classes is not None and a.classes is None


def _done(cls, ttft_ms, e2el_s):
    n = len(cls)
    return pd.DataFrame({"class": cls, "ttft_s": np.asarray(ttft_ms) / 1e3, "tpot_s": np.full(n, 0.01),
                         "e2el_s": np.asarray(e2el_s, dtype=float)})


def test_each_class_is_held_to_its_own_targets_by_hand():
    """p50 TTFT <= 100 ms for everyone without an SLO of its own; batch: p50 E2E <= 60 s.
    chat TTFTs 50, 80, 300 -> p50 80: met, 2 of 3 requests within; batch TTFTs 900, 1000 (missing
    chat's target, not its own) and E2E 30 s, 90 s -> p50 60 s: met (60 <= 60), 1 of 2 within.
    The SLO is met (both classes); 3 of 5 requests meet their class's targets."""
    slo = SLOConfig(ttft_ms=100.0, percentile=50.0, classes=(("batch", SLOConfig(e2el_ms=60_000.0, percentile=50.0)),))
    done = _done(["chat", "chat", "chat", "batch", "batch"], [50, 80, 300, 900, 1000], [1, 1, 1, 30, 90])
    g = judge(done, slo, 10.0, None, ("chat", "batch"))
    assert g["met"] and g["by_class"]
    assert g["classes"]["chat"]["ttft_ms"]["observed"] == 80.0 and g["classes"]["chat"]["fraction"] == 2 / 3
    assert g["classes"]["batch"]["e2el_ms"]["observed"] == 60_000.0 and g["classes"]["batch"]["fraction"] == 1 / 2
    assert "ttft_ms" not in g["classes"]["batch"]
    assert g["fraction"] == 3 / 5 and g["requests_per_s"] == 3 / 10
    # over all requests alone the p50 TTFT (300 ms) would miss: the classes' verdicts decide
    assert not judge(done, slo, 10.0)["met"]
    slow = _done(["chat", "batch"], [50, 10], [1, 200])
    assert not judge(slow, slo, 10.0, None, ("chat", "batch"))["met"]  # batch's E2E misses its own


def test_a_run_reports_each_class(tmp_path):
    raw = {"name": "mix", "model": "llama-3-8b", "hardware": "h100-sxm", "cost_model": "roofline",
           "engine": {"scheduler": "chunked", "policy": "priority"}, "workload": {**MIX, "num_requests": 600},
           "slo": {"ttft_ms": 1000, "tpot_ms": 100, "classes": {"batch": {"e2el_ms": 600000}}}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    r = servesim.run(str(tmp_path / "s.yaml"))
    rq, s = r.requests, r.summary
    assert list(s["classes"]) == ["chat", "rag", "batch"]
    for name, c in s["classes"].items():
        mine = rq[rq["class"] == name]
        assert c["requests"] == len(mine) == c["completed"]
        assert c["ttft_ms"]["p99"] == pytest.approx(np.percentile(mine["ttft_s"] * 1e3, 99))
    assert set(s["classes"]["batch"]["goodput"]) >= {"e2el_ms", "met", "fraction"}
    assert s["goodput"]["by_class"] and s["goodput"]["met"] == all(c["goodput"]["met"] for c in s["classes"].values())
    assert r.scenario.slo.as_yaml()["classes"] == {"batch": {"e2el_ms": 600000.0, "percentile": 99.0}}
    r.write(tmp_path / "out")  # scenario.yaml of the run simulates the same run
    page = servesim.report(tmp_path / "out").read_text()
    assert all(f"<td>class {name}</td>" in page for name in ("chat", "rag", "batch"))
    again = servesim.run(str(tmp_path / "out" / "scenario.yaml"))
    assert again.requests["class"].tolist() == rq["class"].tolist()
    assert again.summary["goodput"] == s["goodput"]


@pytest.mark.parametrize("workload, slo, message", [
    ({"classes": [{"name": "a", "share": 0.5}, {"name": "b", "share": 0.4}]}, None, "the shares sum to 0.9"),
    ({"classes": [{"name": "a", "share": 0.5}, {"name": "a", "share": 0.5}]}, None, "'a' names two classes"),
    ({"classes": [{"name": "a,b", "share": 1}]}, None, "classes[0].name: 'a,b' is not a class name"),
    ({"classes": [{"name": "[/]x", "share": 1}]}, None, "classes[0].name: '[/]x' is not a class name"),
    ({"classes": [{"name": "$x$", "share": 1}]}, None, "classes[0].name: '$x$' is not a class name"),
    ({"classes": [{"name": "  ", "share": 1}]}, None, "classes[0].name: '  ' is not a class name"),
    ({"classes": [{"name": "a", "share": 0}]}, None, "classes[0].share"),
    ({"classes": [{"name": "a", "share": 1, "slo": {}}]}, None, "classes[0].slo: unknown key"),
    ({"classes": []}, None, "workload.classes: an empty list; e.g."),
    ({"classes": [{"name": "a", "share": 1}], "priority": FIXED(1)}, None, "workload.priority: not with workload.classes"),
    ({"classes": [{"name": "a", "share": 1}]}, {"ttft_ms": 100, "classes": {"b": {"e2el_ms": 1}}},
     "slo.classes.b: no workload class 'b' (workload.classes: a)"),
    ({}, {"ttft_ms": 100, "classes": {"b": {"e2el_ms": 1}}}, "slo.classes.b: no workload class 'b' (the workload has no"),
    ({"classes": [{"name": "a", "share": 1}]}, {"ttft_ms": 100, "classes": {"a": {"itl_ms": 10}}},
     "slo.classes.a.itl_ms: not per class"),
    ({"classes": [{"name": "a", "share": 1}]}, {"ttft_ms": 100, "classes": {"a": None}}, "slo.classes.a: empty"),
])
def test_class_mistakes_are_refused(workload, slo, message):
    w = {**{k: v for k, v in MIX.items() if k != "classes"}, **workload}
    with pytest.raises(ScenarioError, match=re.escape(message)):
        make_scenario(workload=w, slo=slo)


def test_classes_with_a_trace_are_refused(tmp_path):
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,10,10\n")
    with pytest.raises(ScenarioError, match="workload.classes: not allowed with workload.trace"):
        make_scenario(workload={"trace": str(tmp_path / "t.csv"), "classes": [{"name": "a", "share": 1}]})


def test_the_planner_judges_every_class_against_its_own_slo():
    """At a light load every request meets the default targets (TTFT 1 s, TPOT 100 ms), but a batch
    request of 2000 output tokens takes ~20 s: held to its own E2E target of 5 s, the point fails."""
    from sim.planning.slo import simulate_point

    w = {"arrival": {"process": "poisson", "rate": 2.0}, "num_requests": 200,
         "prompt_tokens": FIXED(200), "output_tokens": FIXED(50),
         "classes": [{"name": "chat", "share": 0.9}, {"name": "batch", "share": 0.1, "output_tokens": FIXED(2000)}]}
    base = {"ttft_ms": 1000, "tpot_ms": 100}
    loose = make_scenario(workload=w, slo=base, cost_model="roofline")
    tight = make_scenario(workload=w, slo={**base, "classes": {"batch": {"e2el_ms": 5000}}}, cost_model="roofline")
    assert simulate_point(loose, loose.slo, 0.0)["met"]
    assert not simulate_point(tight, tight.slo, 0.0)["met"]


def test_a_fleet_window_is_judged_class_by_class():
    """Windows of 10 s, p50 TTFT <= 100 ms by default, batch p50 E2E <= 60 s: window 0 meets both,
    window 1's batch requests take 90 s (its own target missed) though their TTFT is fine."""
    from types import SimpleNamespace

    from sim.planning.fleet_plan import judge_day

    rq = pd.DataFrame({"arrival_s": [1.0, 2.0, 11.0, 12.0], "finish_s": [2.0, 40.0, 12.0, 102.0],
                       "ttft_s": [0.05, 0.05, 0.05, 0.05], "tpot_s": [0.01] * 4, "e2el_s": [1.0, 38.0, 1.0, 90.0],
                       "class": ["chat", "batch", "chat", "batch"]})
    slo = SLOConfig(ttft_ms=100.0, percentile=50.0, classes=(("batch", SLOConfig(e2el_ms=60_000.0, percentile=50.0)),))
    r = judge_day(SimpleNamespace(requests=rq, itl=(np.zeros(0), np.zeros(0), np.zeros(0))), slo, 10.0,
                  ("chat", "batch"))
    assert [w["met"] for w in r["windows"]] == [True, False]
    assert r["windows"][1]["classes"] == {"chat": {"fraction": 1.0, "met": True}, "batch": {"fraction": 0.0, "met": False}}
    assert r["windows"][1]["worst_ratio"] == pytest.approx(1.5)   # 90 s / 60 s
    assert r["windows"][0]["worst_ratio"] == pytest.approx(38 / 60)  # the larger of chat 50/100 ms, batch 38/60 s
