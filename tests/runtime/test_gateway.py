"""engine.admission: the token bucket in front of the router (sim/runtime/gateway.py), on
arrivals and timelines computed by hand (unit step costs: every iteration 1 s)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

import servesim
from cli import app
from sim.config.admission import AdmissionConfig
from sim.runtime.gateway import admit

ARRIVALS = np.array([0, 0, 0, 0.5, 1.0, 3.0])


def test_a_bucket_that_sheds_admits_what_its_tokens_allow():
    """rate 1/s, burst 2 (full at 0): 0 and 0 take the two tokens, the third 0 finds none; at 0.5
    half a token; at 1.0 one (0.5 + 0.5); at 3.0 the bucket is full again (capped at 2)."""
    out = admit(AdmissionConfig(rate=1.0, burst=2.0), ARRIVALS)
    assert np.isnan(out).tolist() == [False, False, True, True, False, False]
    assert out[~np.isnan(out)].tolist() == [0, 0, 1.0, 3.0]


def test_a_bucket_that_queues_admits_in_arrival_order_up_to_the_longest_wait():
    """The same, queueing at most 1.5 s: the third 0 waits for the token of t=1; 0.5 queues behind
    it for t=2 (1.5 s: allowed); 1.0 would get t=3 (2 s): shed, and 3.0 takes that token at 3."""
    out = admit(AdmissionConfig(rate=1.0, burst=2.0, on_empty="queue", max_wait_s=1.5), ARRIVALS)
    assert np.isnan(out).tolist() == [False, False, False, False, True, False]
    assert out[~np.isnan(out)].tolist() == [0, 0, 1.0, 2.0, 3.0]
    unbounded = admit(AdmissionConfig(rate=1.0, burst=2.0, on_empty="queue"), ARRIVALS)
    assert unbounded.tolist() == [0, 0, 1, 2, 3, 4]  # every one, a token a second


def scenario(tmp_path, rows: list[str], admission: dict) -> str:
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    raw = {"name": "gate", "model": "llama-3-8b", "hardware": "h100-sxm", "cost_model": "unit",
           "engine": {"scheduler": "continuous", "max_num_seqs": 8, "admission": admission},
           "workload": {"trace": "t.csv"}, "slo": {"ttft_ms": 1500, "percentile": 50}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    return str(tmp_path / "s.yaml")


def test_a_queued_requests_wait_is_the_clients(tmp_path):
    """Three one-token requests at 0 through a bucket of 1 token refilled at 1/s, queueing: they
    reach the engine at 0, 1 and 2 and finish a second later each. TTFT counts from their own
    arrival, 0: 1, 2 and 3 s; the gateway's wait is in queue_s too."""
    result = servesim.run(scenario(tmp_path, ["0,1,1"] * 3, {"rate": 1, "burst": 1, "on_empty": "queue"}))
    rq = result.requests
    assert rq["ttft_s"].tolist() == [1, 2, 3] and rq["gateway_wait_s"].tolist() == [0, 1, 2]
    assert rq["queue_s"].tolist() == [0, 1, 2] and not rq["shed"].any()
    a = result.summary["admission"]
    assert (a["offered"], a["admitted"], a["shed"]) == (3, 3, 0) and a["gateway_wait_ms"]["mean"] == 1000


def test_shed_requests_are_counted_and_kept_not_dropped(tmp_path, monkeypatch):
    """Six requests (the arrivals above) through the shedding bucket: two shed. requests.csv keeps
    all six under their ids, the shed ones without times; the SLO (p50 TTFT 1.5 s) is met by the
    four served, which are 4/6 of those offered. The CLI exits 0 and says so."""
    rows = [f"{t},1,1" for t in ARRIVALS]
    path = scenario(tmp_path, rows, {"rate": 1, "burst": 2})
    result = servesim.run(path)
    rq, s = result.requests, result.summary
    assert rq["request_id"].tolist() == list(range(6)) and rq["shed"].tolist() == [False, False, True, True, False, False]
    assert rq["finish_s"][rq["shed"]].isna().all() and (rq["replica"][rq["shed"]] == -1).all()
    assert s["completed"] == 4 and s["admission"]["shed_fraction"] == pytest.approx(2 / 6)
    assert s["goodput"]["fraction"] == 1.0 and s["goodput"]["fraction_of_offered"] == pytest.approx(4 / 6)
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["run", path, "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "note: the gateway (engine.admission) turned 2 of 6 requests away (requests.csv: shed)" in r.stderr
    assert "shed by the gateway" in r.stdout
    r = CliRunner().invoke(app, ["export", str(out), "--to", "vllm-bench"])
    assert r.exit_code == 0
    doc = json.loads((out / "vllm_bench.json").read_text())
    assert doc["errors"] == ["", "", "shed by the gateway", "shed by the gateway", "", ""]
    assert servesim.load_run(out).summary["admission"]["shed"] == 2  # the folder reads back
    page = servesim.report(out).read_text()
    assert "<td>shed by the gateway</td><td>2 of 6</td>" in page


@pytest.mark.parametrize("admission, says", [
    ({"burst": 3}, "engine.admission.rate: missing"),
    ({"rate": 2, "max_wait_s": 1}, "engine.admission.max_wait_s: only with on_empty: queue"),
    ({"rate": 2, "on_empty": "drop"}, "engine.admission.on_empty"),
    ({"rate": 0}, "engine.admission.rate"),
    ({"rate": 2, "burst": 0.5}, "engine.admission.burst"),
])
def test_admission_settings_are_checked(tmp_path, admission, says):
    with pytest.raises(servesim.ScenarioError, match=says):
        servesim.run(scenario(tmp_path, ["0,1,1"], admission))


def test_a_gateway_before_closed_loop_users_or_a_plan_is_refused():
    with pytest.raises(servesim.ScenarioError, match="a gateway before closed-loop users is not modelled"):
        servesim.run("scenarios/closed-loop-llama3-8b-h100.yaml", engine__admission={"rate": 5})
    with pytest.raises(servesim.ScenarioError, match="plan: engine.admission is set"):
        servesim.plan("scenarios/quickstart.yaml", overrides=["engine.admission={rate: 5}"],
                      slo="ttft_ms=500", horizon_s=5)


def test_a_queue_that_would_run_the_clock_past_its_bound_is_refused(tmp_path):
    # 3 requests at 0, one token every 1e9 s: the third would pass the gateway at 2e9 s
    with pytest.raises(servesim.ScenarioError, match=r"engine.admission: its queue holds requests until 2e\+09 s, "
                                                     r"past servesim's 1e\+09 s bound"):
        servesim.run(scenario(tmp_path, ["0,1,1"] * 3, {"rate": 1e-9, "burst": 1, "on_empty": "queue"}))


def test_a_class_with_its_own_bucket_passes_through_it_alone():
    """Arrivals 0, 0, 0, 0.5, 1.0 of classes a, b, a, b, a. a's bucket: 1/s, burst 1: 0 passes, the
    second 0 sheds, 1.0 finds a fresh token. b through the shared bucket (1/s, burst 1): 0 passes,
    0.5 finds half a token: shed. Without a shared bucket b passes freely; with b's own bucket
    (10/s) 0.5 finds a token again."""
    from sim.config.admission import Bucket
    from sim.runtime.gateway import admit_all

    arrival, classes, names = np.array([0, 0, 0, 0.5, 1.0]), np.array([0, 1, 0, 1, 0]), ("a", "b")
    a = (("a", Bucket(rate=1.0, burst=1.0)),)
    shared = admit_all(AdmissionConfig(rate=1.0, burst=1.0, classes=a), arrival, classes, names)
    assert np.isnan(shared).tolist() == [False, False, True, True, False]
    free = admit_all(AdmissionConfig(rate=0.0, burst=0.0, classes=a), arrival, classes, names)
    assert np.isnan(free).tolist() == [False, False, True, False, False] and free[3] == 0.5
    both = a + (("b", Bucket(rate=10.0, burst=1.0)),)
    own = admit_all(AdmissionConfig(rate=0.0, burst=0.0, classes=both), arrival, classes, names)
    assert np.isnan(own).tolist() == [False, False, True, False, False]


def test_class_buckets_in_a_run_count_each_class_shed(tmp_path):
    fixed = lambda v: {"dist": "fixed", "value": v}  # noqa: E731
    raw = {"name": "tenants", "model": "llama-3-8b", "hardware": "h100-sxm", "cost_model": "roofline",
           "engine": {"admission": {"classes": {"free": {"rate": 1, "burst": 2}}}},
           "workload": {"arrival": {"process": "constant", "rate": 20}, "num_requests": 400,
                        "prompt_tokens": fixed(64), "output_tokens": fixed(8),
                        "classes": [{"name": "paid", "share": 0.5}, {"name": "free", "share": 0.5}]}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    r = servesim.run(str(tmp_path / "s.yaml"))
    rq, c = r.requests, r.summary["classes"]
    assert c["paid"]["shed"] == 0 and c["paid"]["completed"] == c["paid"]["requests"]
    # free: 1 token/s over the 20 s of arrivals (2 at the start) admits at most 2 + 20 of ~200
    assert c["free"]["completed"] <= 22 and c["free"]["shed"] == c["free"]["requests"] - c["free"]["completed"]
    assert r.summary["admission"]["shed"] == c["free"]["shed"]
    assert rq.loc[rq["shed"], "class"].eq("free").all()
    assert r.summary["run"]["engine"]["admission"]["classes"]


@pytest.mark.parametrize("admission, message", [
    ({"classes": {"nope": {"rate": 1}}}, "engine.admission.classes.nope: no workload class 'nope'"),
    ({"classes": {"a": {"burst": 3}}}, "engine.admission.classes.a.rate: missing"),
    ({"classes": {"a": {"rate": 1, "max_wait_s": 2}}}, "engine.admission.classes.a.max_wait_s: only with on_empty"),
    ({"burst": 3, "classes": {"a": {"rate": 1}}}, "engine.admission.rate: missing"),
    ({"classes": {}}, "engine.admission.classes: {} is not a mapping"),
])
def test_class_bucket_mistakes_are_refused(admission, message):
    from simhelpers import make_scenario

    w = {"arrival": {"process": "poisson", "rate": 5}, "num_requests": 10,
         "prompt_tokens": {"dist": "fixed", "value": 8}, "output_tokens": {"dist": "fixed", "value": 2},
         "classes": [{"name": "a", "share": 1}]}
    with pytest.raises(servesim.ScenarioError, match=message.replace("{", r"\{").replace("}", r"\}")):
        make_scenario(workload=w, admission=admission)


@pytest.mark.parametrize("ff", [True, False])
def test_a_concurrency_limit_holds_arrivals_until_a_request_finishes(ff):
    """max_in_flight 1, unit steps, 1-token prompts, 3-token answers, arrivals 0, 0.5, 1.0. Request 0
    passes at 0 and finishes at 3 (prefill [0, 1], two decodes). Request 1 passes then (waited 2.5
    s): first token at 4, done at 6; request 2 passes at 6 (waited 5 s): done at 9. With
    max_queue_wait_s 4, request 2's turn comes after 5 s: turned away."""
    from simhelpers import run

    engine = dict(scheduler="continuous", max_num_seqs=8, fast_forward=ff)
    r = run([0.0, 0.5, 1.0], 1, 3, admission={"max_in_flight": 1}, **engine)
    rq = r.requests
    assert rq["finish_s"].tolist() == [3.0, 6.0, 9.0]
    assert rq["gateway_wait_s"].tolist() == [0.0, 2.5, 5.0]
    assert rq["ttft_s"].tolist() == [1.0, 3.5, 6.0]   # from each request's own arrival
    assert not rq["shed"].any() and r.summary["admission"]["shed"] == 0
    cut = run([0.0, 0.5, 1.0], 1, 3, admission={"max_in_flight": 1, "max_queue_wait_s": 4}, **engine)
    assert cut.requests["shed"].tolist() == [False, False, True]
    assert cut.requests["finish_s"].tolist()[:2] == [3.0, 6.0] and np.isnan(cut.requests["finish_s"][2])
    assert cut.summary["admission"]["shed"] == 1 and cut.summary["completed"] == 2


def test_a_concurrency_limit_bounds_what_the_replicas_hold(tmp_path):
    """Behind a bucket, over 2 least_loaded replicas: never more than max_in_flight requests past
    the gateway and unfinished (checked from requests.csv's pass and finish times; unit steps, so no
    engine overheads shift the finish times after the run)."""
    fixed = lambda v: {"dist": "fixed", "value": v}  # noqa: E731
    raw = {"name": "gate", "model": "llama-3-8b", "hardware": "h100-sxm", "cost_model": "unit",
           "engine": {"replicas": 2, "router": "least_loaded",
                      "admission": {"rate": 2, "burst": 5, "max_in_flight": 12}},
           "workload": {"arrival": {"process": "poisson", "rate": 1}, "num_requests": 200,
                        "prompt_tokens": fixed(8), "output_tokens": fixed(20)}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    rq = servesim.run(str(tmp_path / "s.yaml")).requests
    served = rq[~rq["shed"]]
    passed = (served["arrival_s"] + served["gateway_wait_s"]).to_numpy()
    events = sorted([(t, 1) for t in passed] + [(t, -1) for t in served["finish_s"]], key=lambda e: (e[0], e[1]))
    held = np.cumsum([d for _, d in events])
    assert held.max() == 12 and (served["gateway_wait_s"] > 0).any()


@pytest.mark.parametrize("admission, message", [
    ({"max_queue_wait_s": 3}, "engine.admission.max_queue_wait_s: only with max_in_flight"),
    ({"max_in_flight": 0}, "engine.admission.max_in_flight"),
    ({"burst": 4, "max_in_flight": 3}, "engine.admission.rate: missing"),
])
def test_concurrency_limit_mistakes_are_refused(admission, message):
    from simhelpers import make_scenario

    with pytest.raises(servesim.ScenarioError, match=message):
        make_scenario(admission=admission)


def test_a_concurrency_gate_runs_the_same_fast_forwarded_or_stepped():
    """Releases at finishes cut decode runs like closed-loop arrivals: both ways give one run."""
    from sim.simulate import simulate
    from simhelpers import assert_same_run, make_scenario

    w = {"arrival": {"process": "poisson", "rate": 120}, "num_requests": 600,
         "prompt_tokens": {"dist": "lognormal", "mean": 300, "std": 200, "max": 2048},
         "output_tokens": {"dist": "lognormal", "mean": 80, "std": 60, "max": 512}}
    sc = make_scenario(workload=w, cost_model="roofline", scheduler="chunked", replicas=2, router="least_loaded",
                       admission={"max_in_flight": 8, "max_queue_wait_s": 0.5})
    fast, stepped = simulate(sc), simulate(sc, fast_forward=False)
    assert fast.summary["admission"]["shed"] > 0 and (fast.requests["gateway_wait_s"] > 0).any()
    assert_same_run(fast, stepped)


def test_a_priority_queue_at_the_gate_lets_the_most_urgent_pass_first():
    """The timeline above, priorities 0, 5, 1: when request 0 finishes at 3, request 2 (priority 1)
    passes before request 1 (priority 5), though it arrived later: done at 6, then 1 at 9."""
    from simhelpers import run

    engine = dict(scheduler="continuous", max_num_seqs=8)
    r = run([0.0, 0.5, 1.0], 1, 3, [0, 5, 1], admission={"max_in_flight": 1, "queue_order": "priority"}, **engine)
    assert r.requests["finish_s"].tolist() == [3.0, 9.0, 6.0]
    assert r.requests["gateway_wait_s"].tolist() == [0.0, 5.5, 2.0]
    fifo = run([0.0, 0.5, 1.0], 1, 3, [0, 5, 1], admission={"max_in_flight": 1}, **engine)
    assert fifo.requests["finish_s"].tolist() == [3.0, 6.0, 9.0]
    with pytest.raises(servesim.ScenarioError, match="engine.admission.queue_order: only with max_in_flight"):
        run([0.0], 1, 3, admission={"rate": 1, "queue_order": "priority"}, **engine)
