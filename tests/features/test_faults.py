"""Faults (sim/features/faults/, issue 51) on timelines computed by hand: `cost_model: unit`
makes every iteration last 1.0 s, a prompt of 4 tokens is prefilled in one iteration (which
samples the first token) and every later iteration samples one more."""
import re

import numpy as np
import pytest

from sim.config.errors import ScenarioError
from sim.scenario import scenario_from_dict
from sim.simulate import simulate
from tests.simhelpers import _PLACEHOLDER_WORKLOAD, _numbers, assert_same_run, make_workload


def scenario(faults, replicas=2, slo=None, **engine):
    raw = {"name": "t", "model": "llama-3-8b", "hardware": "h100-sxm", "cost_model": "unit",
           "engine": {"scheduler": "chunked", "replicas": replicas, **engine},
           "workload": _PLACEHOLDER_WORKLOAD, "faults": faults}
    if slo is not None:
        raw["slo"] = slo
    return scenario_from_dict(raw)


def both(sc, arrival, prompt, output):
    """The run fast-forwarded and stepped (they must agree); the fast-forwarded one."""
    w = make_workload(arrival, prompt, output)
    fast, stepped = simulate(sc, workload=w), simulate(sc, workload=w, fast_forward=False)
    assert_same_run(fast, stepped)
    assert dict(_numbers(fast.summary["faults"])) == pytest.approx(dict(_numbers(stepped.summary["faults"])),
                                                                   nan_ok=True)
    return fast


def test_a_failed_replicas_request_is_retried_on_the_other():
    # r0 (t=0) on replica 0: tokens at 1, 2, 3, 4; replica 0 fails at 4.2 (the iteration [4, 5] is
    # lost). r1 (t=0.5) on replica 1: tokens at 1.5, 2.5, 3.5, done. r0 is sent again at
    # 4.2 + 1.0 = 5.2 to replica 1 (idle): its prompt again at [5.2, 6.2], 9 more tokens: done at 15.2.
    sc = scenario({"outages": [{"replica": 0, "at_s": 4.2, "down_s": 100}], "retry_delay_s": 1.0})
    r = both(sc, [0.0, 0.5], 4, [10, 3])
    q = r.requests
    assert q["first_token_s"].tolist() == pytest.approx([6.2, 1.5])
    assert q["finish_s"].tolist() == pytest.approx([15.2, 3.5])
    assert q["ttft_s"][0] == pytest.approx(6.2) and q["e2el_s"][0] == pytest.approx(15.2)  # from the first arrival
    assert q["replica"].tolist() == [1, 1] and q["attempts"].tolist() == [2, 1] and not q["failed"].any()
    steps = r.steps
    assert steps.loc[steps["replica"] == 0, "count"].sum() == 4  # ended at 1, 2, 3, 4; not the lost one
    assert steps.loc[steps["replica"] == 1, "count"].sum() == 3 + 10
    f = r.summary["faults"]
    assert (f["outages"], f["requests_lost"], f["requests_retried"], f["requests_failed"]) == (1, 1, 1, 0)
    assert f["retried_lost_ms"]["mean"] == pytest.approx(5200.0)  # arrival 0 to the resend at 5.2
    assert f["capacity"]["replica_seconds_down"] == pytest.approx(15.2 - 4.2)  # (to the run's end)
    assert [(e["t_s"], e["replica"], e["state"]) for e in f["timeline"]] == [(4.2, 0, "down")]


def test_on_failure_fail_gives_the_client_an_error():
    sc = scenario({"outages": [{"replica": 0, "at_s": 4.2, "down_s": 100}], "on_failure": "fail"})
    r = both(sc, [0.0, 0.5], 4, [10, 3])
    assert r.requests["failed"].tolist() == [True, False]
    assert np.isnan(r.requests["finish_s"][0]) and r.summary["completed"] == 1
    assert r.summary["faults"]["requests_failed"] == 1 and r.summary["faults"]["failed_fraction"] == 0.5


def test_max_retries_bounds_the_attempts():
    # both replicas down at 2.5 for 10 s: r0's resend at 3.5 finds none up and waits for 12.5
    sc = scenario({"outages": [{"replica": 0, "at_s": 2.5, "down_s": 10}, {"replica": 1, "at_s": 2.5, "down_s": 10}],
                   "max_retries": 0})
    r = both(sc, [0.0, 0.5], 4, [10, 10])
    assert r.requests["failed"].all() and r.summary["completed"] == 0
    sc = scenario({"outages": [{"replica": 0, "at_s": 2.5, "down_s": 10}, {"replica": 1, "at_s": 2.5, "down_s": 10}]})
    r = both(sc, [0.0, 0.5], 4, [10, 10])
    # back at 12.5 (both): the held resends (3.5) are routed then, one to each: prompt [12.5, 13.5], done at 22.5
    assert r.requests["finish_s"].tolist() == pytest.approx([22.5, 22.5])
    assert r.requests["attempts"].tolist() == [2, 2]


def test_a_drain_finishes_its_requests_then_restarts():
    # replica 0 drained at 2: r0 finishes there at 10; r2 (t=3) goes to replica 1, busy with r1 until
    # 3.5: r2's prompt at [3.5, 4.5], done at 5.5. Replica 0 restarts at 10 for 3 s; then replica 1
    # is drained (idle) and restarts 13..16.
    sc = scenario({"drains": {"start_s": 2, "restart_s": 3, "timeout_s": 100}})
    r = both(sc, [0.0, 0.5, 3.0], 4, [10, 3, 2])
    q = r.requests
    assert q["finish_s"].tolist() == pytest.approx([10.0, 3.5, 5.5])
    assert q["replica"].tolist() == [0, 1, 1] and q["attempts"].tolist() == [1, 1, 1]
    log = [(e["t_s"], e["replica"], e["state"]) for e in r.summary["faults"]["timeline"]]
    assert log == [(2.0, 0, "draining"), (10.0, 0, "down")]  # (the run ends at 10)
    assert r.summary["faults"]["capacity"]["replica_seconds_draining"] == pytest.approx(8.0)


def test_a_drain_that_times_out_hands_its_requests_back():
    # drained at 2, timeout 4.5: at 6.5 r0 is taken off (tokens at 1..6 counted, [6, 7] lost); sent
    # again at 7.5 to replica 1 (idle since 3.5): prompt [7.5, 8.5], done at 17.5
    sc = scenario({"drains": {"start_s": 2, "restart_s": 3, "timeout_s": 4.5, "replicas": [0]}})
    r = both(sc, [0.0, 0.5], 4, [10, 3])
    assert r.requests["finish_s"].tolist() == pytest.approx([17.5, 3.5])
    assert r.requests["attempts"].tolist() == [2, 1]
    assert r.steps.loc[r.steps["replica"] == 0, "count"].sum() == 6


def test_a_spot_preemption_drains_during_its_notice():
    # replica 1 is spot; notice at 2.0, taken at 3.2. r1 (t=0.5, 5 tokens) on it: tokens at 1.5,
    # 2.5; [2.5, 3.5] lost. r2 (t=2.5, one token) goes to replica 0 during the notice: it joins at
    # the boundary 3, done at 4. r1 sent again at 4.2 to replica 0, joins at 5: tokens 6..10.
    sc = scenario({"spot": {"replicas": 1, "notices": [{"replica": 1, "at_s": 2.0}], "notice_s": 1.2,
                            "replace_s": 4, "usd_per_gpu_hour": 1.0}})
    r = both(sc, [0.0, 0.5, 2.5], 4, [10, 5, 1])
    q = r.requests
    assert q["replica"].tolist() == [0, 0, 0]
    assert q["finish_s"].tolist() == pytest.approx([10.0, 10.0, 4.0])
    assert q["first_token_s"][1] == pytest.approx(6.0) and q["attempts"].tolist() == [1, 2, 1]
    f = r.summary["faults"]
    log = [(e["t_s"], e["replica"], e["state"], e["why"]) for e in f["timeline"]]
    assert log == [(2.0, 1, "draining", "spot notice"), (3.2, 1, "down", "preempted"), (7.2, 1, "up", "back")]
    assert f["preemptions"] == 1
    # 10 s held: replica 0 on demand at the H100's price, replica 1 at 1.0 USD a GPU-hour
    price = sc.hardware.usd_per_hour
    assert f["cost"]["usd"] == pytest.approx(10 / 3600 * (price + 1.0))


def test_availability_counts_the_minutes_that_met_the_slo():
    # minute_s 10: requests at 0 (window 0) and 16 (window 1); r0 on replica 0 is lost and
    # retried on replica 1 (TTFT 6.2 s > 1 s, done at 15.2): window 0 misses, window 1 (r1 on
    # replica 1, idle again: TTFT 1 s) meets
    sc = scenario({"outages": [{"replica": 0, "at_s": 4.2, "down_s": 100}], "minute_s": 10},
                  slo={"ttft_ms": 1000, "percentile": 99})
    r = both(sc, [0.0, 16.0], 4, [10, 3])
    a = r.summary["faults"]["availability"]
    assert (a["minutes"], a["met"], a["fraction"], a["worst_minute_start_s"]) == (2, 1, 0.5, 0.0)
    assert a["missed_with_lost_requests"] == 1 and a["windows"] == [[0.0, False], [10.0, True]]


@pytest.mark.parametrize("faults, engine, message", [
    ({"outages": [{"replica": 2, "at_s": 1, "down_s": 1}]}, {}, "faults.outages[0].replica: 2 but engine.replicas is 2"),
    ({"spot": {"replicas": 3, "preemptions_per_h": 1}}, {}, "faults.spot.replicas: 3 but engine.replicas is 2"),
    ({"spot": {"replicas": 1}}, {}, "give preemptions_per_h"),
    ({"failures": {"mtbf_h": 0, "repair_s": 1}}, {}, "faults.failures.mtbf_h: 0 is not a number > 0"),
    ({"failures": {"mtbf_h": 1e-300, "repair_s": 1}}, {}, "faults.failures.mtbf_h: 1e-300 h is under one second"),
    ({"on_failure": "retry"}, {}, "faults: names no fault"),
    ({"outages": [{"replica": 0, "at_s": 1, "down_s": 1}], "minute_s": 1e-300}, {}, "faults.minute_s: 1e-300 s is under"),
    ({"outages": [{"replica": 0, "at_s": 1e300, "down_s": 1}]}, {}, "faults.outages[0].at_s: 1e+300 is more than"),
    ({"outages": [{"replica": 0, "at_s": 1, "down_s": 1}]}, {"scheduler": "static"},
     "faults: not modelled together with engine.scheduler: static"),
    ({"spot": {"replicas": 4, "preemptions_per_h": 1}},
     {"autoscaling": {"max_replicas": 3, "target_in_flight": 4}},
     "faults.spot.replicas: 4 but engine.autoscaling.max_replicas is 3 (spot replicas are some of the replicas "
     "the fleet may hold)"),
    ({"spot": {"replicas": 1, "notices": [{"replica": 3, "at_s": 1}]}},
     {"autoscaling": {"max_replicas": 3, "target_in_flight": 4}},
     "faults.spot.notices[0].replica: 3 but engine.autoscaling.max_replicas is 3 (replicas 0..2)"),
    ({"outages": [{"replica": 3, "at_s": 1, "down_s": 1}]},  # (autoscaled: any replica it may hold, 0..2)
     {"autoscaling": {"max_replicas": 3, "target_in_flight": 4}}, "outages[0].replica: 3 but engine.autoscaling.max_replicas is 3"),
])
def test_bad_faults_are_refused(faults, engine, message):
    with pytest.raises(ScenarioError, match=re.escape(message)):
        scenario(faults, **engine)


def test_exponential_failures_are_seeded_and_leave_the_run_stream_alone():
    """MTBF draws come from a generator spawned from the run's: the same seed, the same faults;
    and a run with faults that never strike (an MTBF of years) is the fault-free run."""
    w = make_workload(np.arange(40) * 0.25, 64, 32)
    sc = scenario({"failures": {"mtbf_h": 0.002, "repair_s": 2}})  # ~7 s between failures a replica
    a, b = simulate(sc, workload=w), simulate(sc, workload=w)
    assert a.summary["faults"] == b.summary["faults"] and a.summary["faults"]["failures"] > 0
    # speculative decoding draws its acceptances from the run's generator during the run: a fault
    # draw taken from it would shift them and change the requests' times
    spec = {"method": "ngram", "num_speculative_tokens": 2, "acceptance_rate": 0.6}
    quiet = simulate(scenario({"failures": {"mtbf_h": 1e6, "repair_s": 2}}, router="least_loaded",
                              speculative=spec), workload=w)
    plain = simulate(scenario_from_dict({"name": "t", "model": "llama-3-8b", "hardware": "h100-sxm",
                                         "cost_model": "unit", "workload": _PLACEHOLDER_WORKLOAD,
                                         "engine": {"scheduler": "chunked", "replicas": 2,
                                                    "router": "least_loaded", "speculative": spec}}), workload=w)
    cols = list(plain.requests.columns)
    assert quiet.requests[cols].equals(plain.requests) and quiet.steps.equals(plain.steps)


def test_spares_answer_n_plus_one_where_n_is_not_enough():
    """One replica serves a request every 2 s in 1 s (TTFT 1 s); it is out 21.5..51.5 s. Alone,
    the requests of those 30 s wait for it (the one at 50 s until 51.5: TTFT 2.5 s): windows 2, 3,
    4 and 5 of 10 s miss, 6 of 10 meet (the backlog goes in one iteration [51.5, 52.5]; the request
    at 52 s joins at 52.5: TTFT 1.5 s, just within). With a second replica it takes them all (TTFT 1 s): 10 of 10. So N = 1 is short of 99%
    and N + 1 meets it, at one more replica's price."""
    from sim.planning.spares import lines, plan_spares

    sc = scenario({"outages": [{"replica": 0, "at_s": 21.5, "down_s": 30}], "minute_s": 10}, replicas=1,
                  slo={"ttft_ms": 1500, "percentile": 99})
    w = make_workload(np.arange(50) * 2.0, 4, 1)
    plan = plan_spares(sc, 0.99, seeds=2, max_spares=2, workload=w)
    rows = plan["options"]["on_demand"]["rows"]
    assert [(r["replicas"], r["availability_min"], r["met"]) for r in rows] == [(1, 0.6, False), (2, 1.0, True)]
    assert plan["fault_free"]["availability"] == 1.0 and plan["answer"] == "on_demand"
    # the 4 windows N missed (each seed) held no lost request (the outage found the replica idle): capacity
    assert (rows[0]["windows_missed"], rows[0]["missed_with_lost_requests"]) == (8, 0)
    price = sc.hardware.usd_per_hour
    assert rows[1]["usd_per_hour"] == pytest.approx(2 * price)
    assert plan["extra_usd_per_hour"] == pytest.approx(price)
    assert lines(plan)[-1].startswith("answer: on-demand N+1 = 2 replicas")


@pytest.mark.parametrize("args, message", [
    (["scenarios/quickstart.yaml"], "faults: missing; the spares are sized against a fault model"),
    (["scenarios/chat-2x-faults.yaml", "--availability", "1.5"], "--availability: 1.5 is not a fraction in (0, 1]"),
    (["scenarios/chat-2x-faults.yaml", "--set", "faults.minute_s=0"], "faults.minute_s: 0 is not a number > 0"),
])
def test_spares_refuses_bad_input_in_one_line_and_writes_nothing(args, message, tmp_path):
    from pathlib import Path

    from typer.testing import CliRunner

    from cli import app
    from tests.simhelpers import assert_one_line_error

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "out"
    argv = ["spares", str(root / args[0]), *args[1:], "--out", str(out)]
    assert_one_line_error(CliRunner().invoke(app, argv), message)
    assert not out.exists()


def test_plan_sizes_the_fault_free_fleet_then_the_spares_its_faults_need():
    """`servesim plan --availability`: the load search and the replicas are the fault-free plan's
    (the faults set aside, said so), then the planned cluster's own run with the faults back, N+k:
    here a 40 s outage of replica 0 at 30 s. One replica alone holds the SLO in few 10-s windows,
    two hold it in most, so for 80% of windows N (1) is not enough and N+1 is, at one more
    replica's price; the spares' rows are plan_spares' on that same run."""
    import servesim
    from sim.planning.plan_report import headline

    args = dict(slo="ttft_ms=500,tpot_ms=50", target_rate=20, seeds=2, resolution=0.05)
    faults = "faults={outages: [{replica: 0, at_s: 30, down_s: 40}], minute_s: 10}"
    free = servesim.plan("scenarios/quickstart.yaml", **args)
    r = servesim.plan("scenarios/quickstart.yaml", overrides=[faults], availability=0.8, fault_seeds=2,
                      max_spares=2, **args)
    assert r["load_search"]["answer"] == free["load_search"]["answer"]
    assert r["recommendation"]["replicas"] == free["recommendation"]["replicas"] == 1
    assert any(w.startswith("faults: the load and the replicas are sized without") for w in r["warnings"])
    sp = r["spares"]
    assert sp["overrides"] == r["cluster"]["point"]["overrides"] and sp["replicas"] == 1
    rows = sp["options"]["on_demand"]["rows"]
    assert [(x["replicas"], x["met"]) for x in rows] == [(1, False), (2, True)]
    assert rows[0]["availability_min"] < 0.8 <= rows[1]["availability_min"]
    price = r["cost"]["usd_per_gpu_hour"]
    assert (sp["answer"], sp["extra_usd_per_hour"]) == ("on_demand", pytest.approx(price))
    said = dict(headline(r))["spares under the faults"]
    assert said.startswith("N+1 = 2 replicas (on-demand) for the SLO met in 80.000% of 10-s windows: worst of 2 "
                           f"fault seeds {rows[1]['availability_min']:.2%}, ${2 * price:.2f}/hour (+${price:.2f}/hour ")


@pytest.mark.parametrize("args, message", [
    (["--availability", "0.99"], "--availability: needs --target-rate (or --target-users)"),
    (["--availability", "0.99", "--target-rate", "20", "--set", "faults=null"],
     "has no faults: section; the spares are sized against a fault model"),
    (["--availability", "2", "--target-rate", "20"], "--availability: 2 is not a fraction in (0, 1]"),
    (["--availability", "0.99", "--target-rate", "20", "--gpus", "h100-sxm,h200"],
     "--availability: not with a configuration search"),
    (["--availability", "0.99", "--target-rate", "20", "--fault-seeds", "0"], "--fault-seeds: 0 is not an integer"),
])
def test_plan_availability_refuses_bad_input_in_one_line_and_writes_nothing(args, message, tmp_path):
    from pathlib import Path

    from typer.testing import CliRunner

    from cli import app
    from tests.simhelpers import assert_one_line_error

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "out"
    argv = ["plan", str(root / "scenarios/chat-2x-faults.yaml"), *args, "--out", str(out)]
    assert_one_line_error(CliRunner().invoke(app, argv), message)
    assert not out.exists()


def test_plan_availability_on_faults_that_do_not_fit_the_planned_cluster_keeps_the_plan():
    """chat-2x-faults gives a spot notice to replica 1: a planned cluster of one replica has none.
    The plan is kept (nothing lost) and the spares say why they were not sized, also as a warning."""
    from pathlib import Path

    from sim.planning.plan_report import _spares_rows
    from sim.planning.plan_request import PlanRequest, prepare

    root = Path(__file__).resolve().parents[2]
    job = prepare(PlanRequest(root / "scenarios/chat-2x-faults.yaml", target_rate=16, availability=0.9))
    result = {"cluster": {"replicas": 1, "point": {"overrides": ["engine.replicas=1"]}}, "simulations": 0,
              "warnings": []}
    sp = job._spares(result, None)
    assert sp == {"refused": "the planned cluster of 1 replica(s) does not fit the scenario's faults: "
                             f"{root / 'scenarios/chat-2x-faults.yaml'}: faults.spot.notices[0].replica: 1 is not a "
                             "spot replica (the spot ones: 0..0)"}
    assert result["warnings"] == [f"--availability: {sp['refused']}"]
    assert _spares_rows({"spares": sp}) == [("spares under the faults", f"not sized: {sp['refused']}")]


def test_an_autoscaled_fleet_sees_a_failed_replica_leave_and_starts_another():
    """min 1, max 2 replicas, one serving; checks every 1 s, a replica serves 0.5 s after it is
    started. r0 (t=0) on replica 0: its prompt [0, 1], a token at 2; replica 0 fails at 2.2 (the
    iteration [2, 3] is lost) for 100 s. r0 is sent again at 2.7: nothing is up, it waits. At the
    check at 3 no replica is up (the down one still held, restarting, serves nothing): the fleet
    wants its minimum, 1, and starts replica 1 (held: 1 of 2), serving at 3.5, when r0 is routed to
    it: its prompt again [3.5, 4.5] (first token 4.5), 9 more tokens: done at 13.5. Both modes agree."""
    sc = scenario({"outages": [{"replica": 0, "at_s": 2.2, "down_s": 100}], "retry_delay_s": 0.5}, replicas=1,
                  autoscaling={"min_replicas": 1, "max_replicas": 2, "target_in_flight": 1, "interval_s": 1,
                               "cold_start_s": 0.5, "scale_down_delay_s": 100})
    r = both(sc, [0.0], 4, [10])
    q = r.requests
    assert q["first_token_s"].tolist() == pytest.approx([4.5]) and q["finish_s"].tolist() == pytest.approx([13.5])
    assert q["replica"].tolist() == [1] and q["attempts"].tolist() == [2]
    a = r.summary["autoscaling"]
    assert [(e["t_s"], e["action"]) for e in a["events"]] == [(3.0, "started")]
    spans = sorted((s["replica"], s["start_s"]) for s in a["spans"])
    assert spans == [(0, 0.0), (1, 3.0)]  # (the down replica stays held: a pod restarting is paid for)
    f = r.summary["faults"]
    assert (f["outages"], f["requests_lost"], f["requests_retried"]) == (1, 1, 1)


def test_an_autoscaled_fleet_prefers_spot_and_falls_back_to_on_demand():
    """min 1, max 2, one spot replica at a time, checks every 1 s, cold start 0.5 s. Replica 0 starts on
    spot. r0 (t=0, 10 tokens) on it: prompt [0, 1], tokens at 1, 2, 3. A notice at 2.2: replica 0
    drains, taken at 3.4 (the iteration [3, 4] lost), and its spot capacity is back 4 s later, at 7.4.
    At the check at 3 nothing is up: the fleet starts replica 1, and the spot pool is full (replica 0
    still holds it): on demand, serving at 3.5. r0 is sent again at 3.9 to replica 1: prompt
    [3.9, 4.9], 9 more tokens, done at 13.9. r1 (t=8.2, 3 tokens) joins replica 1 at 8.9: tokens at 9.9,
    10.9, 11.9. At the check at 9 two are in flight on one replica: the fleet starts replica 0 again,
    on spot (back since 7.4). Spans: replica 0 on spot [0, 3.4] and [9, 13.9], replica 1 on demand
    [3, 13.9]. Both modes agree."""
    sc = scenario({"spot": {"replicas": 1, "notices": [{"replica": 0, "at_s": 2.2}], "notice_s": 1.2,
                            "replace_s": 4, "usd_per_gpu_hour": 1.0}, "retry_delay_s": 0.5}, replicas=1,
                  autoscaling={"min_replicas": 1, "max_replicas": 2, "target_in_flight": 1, "interval_s": 1,
                               "cold_start_s": 0.5, "scale_down_delay_s": 100})
    r = both(sc, [0.0, 8.2], 4, [10, 3])
    q = r.requests
    assert q["first_token_s"].tolist() == pytest.approx([4.9, 9.9])
    assert q["finish_s"].tolist() == pytest.approx([13.9, 11.9])
    assert q["replica"].tolist() == [1, 1] and q["attempts"].tolist() == [2, 1]
    a = r.summary["autoscaling"]
    assert [(e["t_s"], e["action"]) for e in a["events"]] == [(3.0, "started"), (9.0, "started")]
    spans = [(s["replica"], s["start_s"], s["end_s"], s.get("pool")) for s in a["spans"]]
    assert spans == [(0, 0.0, pytest.approx(3.4), "spot"), (1, 3.0, pytest.approx(13.9), None),
                     (0, 9.0, pytest.approx(13.9), "spot")]
    price = sc.hardware.usd_per_hour
    assert a["usd"] == pytest.approx((3.4 * 1.0 + 10.9 * price + 4.9 * 1.0) / 3600)
    assert a["gpu_hours_by_pool"] == pytest.approx({"on_demand": 10.9 / 3600, "spot": 8.3 / 3600})
    f = r.summary["faults"]
    log = [(e["t_s"], e["replica"], e["state"], e["why"]) for e in f["timeline"]]
    assert log == [(2.2, 0, "draining", "spot notice"), (pytest.approx(3.4), 0, "down", "preempted"),
                   (pytest.approx(3.4), 0, "up", "released")]
    assert (f["preemptions"], f["requests_lost"]) == (1, 1)
    assert f["cost"] == pytest.approx({"on_demand_gpu_hours": 10.9 / 3600, "spot_gpu_hours": 8.3 / 3600,
                                       "usd": a["usd"], "usd_all_on_demand": 19.2 / 3600 * price,
                                       "hours": 13.9 / 3600})


def test_an_idle_replica_of_an_autoscaled_fleet_does_not_fail():
    """An outage of a replica the fleet does not hold at that moment strikes nothing: the run is
    the fault-free one (replica 1 is idle at 2.2)."""
    auto = {"min_replicas": 1, "max_replicas": 2, "target_in_flight": 100, "interval_s": 1, "cold_start_s": 0.5}
    faulted = scenario({"outages": [{"replica": 1, "at_s": 2.2, "down_s": 5}]}, replicas=1, autoscaling=auto)
    r = both(faulted, [0.0, 0.5], 4, [10, 3])
    assert r.summary["faults"]["outages"] == 0 and r.summary["faults"]["requests_lost"] == 0
    # both on replica 0: r0's tokens at 1..10; r1 joins the iteration at 1 (first token at 2), done at 4
    assert r.requests["finish_s"].tolist() == pytest.approx([10.0, 4.0])
    free = simulate(scenario_from_dict({"name": "t", "model": "llama-3-8b", "hardware": "h100-sxm",
                                        "cost_model": "unit", "workload": _PLACEHOLDER_WORKLOAD,
                                        "engine": {"scheduler": "chunked", "replicas": 1, "autoscaling": auto}}),
                    workload=make_workload([0.0, 0.5], 4, [10, 3]))
    assert r.requests[list(free.requests.columns)].equals(free.requests) and r.steps.equals(free.steps)


def test_a_spot_rate_so_low_it_never_strikes_is_the_run_without_it():
    """1e-300 preemptions an hour: the first would come ~1e304 s in. Its timeout was put on the
    clock, which the run then carried there after its last request, and the run was refused as
    'the simulated clock reached 1.19e+304 s'. Now the run is the fault-free one, clock included."""
    w = make_workload(np.arange(20) * 0.5, 4, 6)
    never = simulate(scenario({"spot": {"replicas": 1, "preemptions_per_h": 1e-300}}), workload=w)
    plain = simulate(scenario(None), workload=w)
    assert never.requests["finish_s"].tolist() == plain.requests["finish_s"].tolist()
    assert never.summary["duration_s"] == plain.summary["duration_s"]
    assert never.summary["faults"]["preemptions"] == 0


def test_requests_the_faults_fail_for_good_are_the_runs_outcome_not_its_failure(tmp_path):
    """on_failure: fail loses r0 by design (the client gets an error): `servesim run` writes the
    run, says so in the faults line and exits 0 (it was 'only 1 of 2 admitted requests completed',
    exit 1, as if the simulation had broken)."""
    import yaml
    from typer.testing import CliRunner

    from cli import app
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,4,10\n0.5,4,3\n")
    raw = {"name": "t", "model": "llama-3-8b", "hardware": "h100-sxm", "cost_model": "unit",
           "engine": {"scheduler": "chunked", "replicas": 2}, "workload": {"trace": str(trace)},
           "faults": {"outages": [{"replica": 0, "at_s": 4.2, "down_s": 100}], "on_failure": "fail"}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    r = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    assert "1 failed" in r.output and "admitted requests completed" not in r.output
    raw["faults"] = None  # the same run without faults completes both
    path.write_text(yaml.safe_dump(raw))
    assert CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "o2")]).exit_code == 0
