"""The fleet plan (sim/planning/fleet_plan.py): the SLO judged per window by hand, the searches on
stand-in judgements, and a whole plan on a short day checked against runs made here."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

import servesim
from cli import app
from sim.config.errors import ScenarioError
from sim.planning.fleet_plan import GRID, _fewest_static, _largest_meeting, floor_schedule, judge_day
from sim.scenario import SLOConfig, load_scenario
from sim.simulate import simulate
from simhelpers import assert_one_line_error


def _result(arrival, ttft_s, finish_s=None):
    n = len(arrival)
    finish = np.asarray(finish_s if finish_s is not None else np.asarray(arrival) + 1.0, dtype=float)
    rq = pd.DataFrame({"arrival_s": np.asarray(arrival, float), "finish_s": finish, "ttft_s": np.asarray(ttft_s, float),
                       "tpot_s": np.full(n, 0.01), "e2el_s": finish - np.asarray(arrival, float)})
    return SimpleNamespace(requests=rq, itl=(np.zeros(0), np.zeros(0), np.zeros(0)))


def test_the_slo_is_judged_in_every_window_by_hand():
    """Windows of 10 s; p50 TTFT <= 100 ms. Window 0 (arrivals 0-9): TTFTs 50, 60, 200 -> p50 60:
    met, worst 0.6. Window 1: 150, 160 -> p50 155: missed, worst 1.55. Window 2 (no arrivals):
    met. Over the run p50 is 150 -> the day misses too; the run fails on window 1 alone."""
    slo = SLOConfig(ttft_ms=100.0, percentile=50.0)
    r = judge_day(_result([1, 2, 3, 11, 12], [0.05, 0.06, 0.2, 0.15, 0.16]), slo, 10.0)
    assert [(w["start_s"], w["requests"], w["met"]) for w in r["windows"]] == [(0, 3, True), (10, 2, False)]
    assert r["windows"][0]["worst_ratio"] == pytest.approx(0.6)
    assert r["windows"][1]["worst_ratio"] == pytest.approx(1.55)
    assert r["windows_missed"] == 1 and not r["met"] and r["completed"] == 5
    fine = judge_day(_result([1, 2, 3, 25], [0.05, 0.06, 0.2, 0.09]), slo, 10.0)
    assert [w["requests"] for w in fine["windows"]] == [3, 0, 1]
    assert fine["met"] and fine["windows_missed"] == 0
    unfinished = judge_day(_result([1, 2], [0.05, 0.06], [2.0, np.nan]), slo, 10.0)
    assert not unfinished["met"] and unfinished["completed"] == 1  # a request never served fails the run


def test_the_largest_meeting_target_is_found_with_few_probes():
    """Policies meet up to k = 5 (monotone): bisection over the 33 grid points (width 1) takes at
    most ceil(log2(34)) = 6 probes; with width 2, at most 2 per third of the interval left."""
    calls: list[list[int]] = []

    def runs(threshold):
        def run(ks):
            calls.append(ks)
            return {k: {"met": k <= threshold} for k in ks}
        return run

    assert _largest_meeting(runs(5), 1) == 5
    assert all(len(c) == 1 for c in calls) and len(calls) <= 6
    calls.clear()
    assert _largest_meeting(runs(5), 2) == 5
    assert all(len(c) == 2 for c in calls[:-1]) and sum(map(len, calls)) <= 2 * 4
    confirmed: list[int] = []
    # an answer missed on another seed counts as missing: the search goes on below it
    assert _largest_meeting(runs(5), 1, lambda k: confirmed.append(k) or {"met": k <= 3}) == 3
    assert confirmed[0] == 5 and confirmed[-1] == 3
    assert _largest_meeting(runs(99), 2) == max(GRID)       # every target meets: the largest
    assert _largest_meeting(runs(-99), 1) is None           # none meets
    assert _largest_meeting(runs(-16), 1) == -16


@pytest.mark.parametrize("start", [1, 3, 6, 9])
def test_the_fewest_static_replicas_from_any_start(start):
    """3 replicas meet (and more), 2 do not: found from below, at, or above."""
    def runs(ns):
        return [{"met": n >= 3} for n in ns]

    assert _fewest_static(runs, start, SLOConfig(ttft_ms=1.0)) == 3


@pytest.mark.parametrize("fewest, probes", [(3, [[3]]), (2, [[2], [3, 4]]), (1, [[1], [2, 3]])])
def test_the_fewest_static_replicas_from_a_lower_bound(fewest, probes):
    """From a count below which none can meet (the peak over one replica's flat-out throughput):
    that count alone first (it meets: nothing else to run), then up two at a time."""
    calls: list[list[int]] = []

    def runs(ns):
        calls.append(ns)
        return [{"met": n >= 3} for n in ns]

    assert _fewest_static(runs, 9, SLOConfig(ttft_ms=1.0), fewest) == 3 and calls == probes


def test_an_slo_no_fleet_meets_is_refused_after_a_short_climb_not_256_fleets():
    """Every fleet misses (a target below one request's own time): from a lower bound of 2 the climb
    runs 2, then 3 and 4, ... and at 12 (4 x 3, the first count above the bound) tries the largest
    fleet (256) once; it misses too,
    so the plan stops there, naming the metric and when it was certain, instead of running every
    fleet up to 256 (about 6 minutes on a small day, hours on the bundled one)."""
    calls: list[list[int]] = []

    def runs(ns):
        calls.append(ns)
        return [{"met": False, "stopped": {"metric": "ttft_ms", "at_s": 0.25, "window": 0}} for _ in ns]

    with pytest.raises(ScenarioError, match=r"even 256 static replicas do not meet the SLO in every window "
                                            r"\(p99 TTFT <= 1 ms\): it is certain to miss ttft_ms already 0.25 s "
                                            r"into the day \(window 0, counted from 0\)"):
        _fewest_static(runs, 9, SLOConfig(ttft_ms=1.0), 2)
    assert calls == [[2], [3, 4], [5, 6], [7, 8], [9, 10], [11, 12], [256]]
    # a target the largest fleet meets: the climb goes on to the fewest that does (here 21)
    calls.clear()
    assert _fewest_static(lambda ns: calls.append(ns) or [{"met": n >= 21} for n in ns], 9,
                          SLOConfig(ttft_ms=1.0), 2) == 21
    assert [256] in calls and calls[-1] == [21, 22]


DAY = {"name": "mini-day", "seed": 0, "model": "llama-3-70b", "hardware": "h100-sxm", "cost_model": "roofline",
       "engine": {"scheduler": "chunked", "tensor_parallel_size": 4, "router": "least_loaded",
                  "autoscaling": {"min_replicas": 1, "max_replicas": 6, "target_in_flight": 24, "interval_s": 5,
                                  "cold_start_s": 20, "scale_down_delay_s": 30}},
       "workload": {"arrival": {"process": "profile", "rates": [[0, 3.0], [300, 30.0], [450, 3.0]], "period_s": 900},
                    "prompt_tokens": {"dist": "lognormal", "mean": 600, "std": 400, "max": 4096},
                    "output_tokens": {"dist": "lognormal", "mean": 120, "std": 80, "max": 1024},
                    "num_requests": 6750},
       "slo": {"ttft_ms": 500, "tpot_ms": 50, "percentile": 99}}


def test_a_fleet_plan_finds_a_cheaper_policy_and_the_runs_here_agree(tmp_path):
    """A 900 s 'day' at 3 req/s with a 150 s peak at 30 req/s, windows of 150 s. The plan's static
    fleet is the fewest replicas that meet the SLO in every window on both seeds: checked here by
    running it and one fewer. Its policy, run here with the overrides plan.md prints, meets the
    SLO in every window on both seeds and holds fewer GPU-hours than the static fleet."""
    (tmp_path / "day.yaml").write_text(yaml.safe_dump(DAY))
    out = tmp_path / "plan"
    result = CliRunner().invoke(app, ["plan", str(tmp_path / "day.yaml"), "--window-s", "150", "--out", str(out),
                                      "--workers", "1"])
    assert result.exit_code == 0, result.output
    plan = json.loads((out / "plan.json").read_text())
    slo = SLOConfig(ttft_ms=500.0, tpot_ms=50.0, percentile=99.0)
    n, policy = plan["static"]["replicas"], plan["policy"]
    assert plan["seeds"] == [0, 1]

    def judged(*overrides, seed):
        r = simulate(load_scenario(tmp_path / "day.yaml", list(overrides) + [f"seed={seed}"]))
        return judge_day(r, slo, 150.0), r

    assert all(judged("engine.autoscaling=null", f"engine.replicas={n}", seed=s)[0]["met"] for s in (0, 1))
    assert not all(judged("engine.autoscaling=null", f"engine.replicas={n - 1}", seed=s)[0]["met"] for s in (0, 1))
    mine = [judged(*policy["overrides"], seed=s) for s in (0, 1)]
    assert all(j["met"] for j, _ in mine)
    fleet = mine[0][1].summary["autoscaling"]
    assert fleet["gpu_hours"] == pytest.approx(policy["gpu_hours"])
    static_hours = n * 4 * mine[0][0]["end_s"] / 3600  # close to the static run's own span
    assert fleet["gpu_hours"] < 0.9 * static_hours
    assert plan["saving"]["fraction"] == pytest.approx(1 - policy["usd"] / plan["static"]["usd"])
    assert policy["max_replicas"] == n and policy["target_in_flight"] in {p["target_in_flight"] for p in plan["probes"]}
    # every larger target probed on the same min_replicas failed (the answer is the largest that met)
    assert all(not p["met"] for p in plan["probes"]
               if p["min_replicas"] == policy["min_replicas"] and p["target_in_flight"] > policy["target_in_flight"])
    # 3. the scheduled floor: ceil(n x 3 / 30) = 1 off the peak, n from 300 s less the 20 s cold start, 1
    # again at 450 s; the target above it reruns here meeting the SLO on both seeds
    sch = plan["scheduled"]
    assert sch["schedule"] == [[0.0, 1], [280.0, n], [450.0, 1]] and sch["period_s"] == 900
    assert all(judged(*sch["policy"]["overrides"], seed=s)[0]["met"] for s in (0, 1))
    assert sch["saving"]["fraction"] == pytest.approx(1 - sch["policy"]["usd"] / plan["static"]["usd"])
    text = (out / "plan.md").read_text()
    assert "## A scheduled floor" in text and "1 from 0 s, " in text
    assert "Saving:" in text and "fleet_plan.png" in text and (out / "fleet_plan.png").stat().st_size > 10_000
    table = text[text.index("## Every window"):text.index("## How it was found")]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "window" not in line and "---" not in line]
    assert len(rows) == len(plan["static"]["windows"]) == 6 and rows[2].startswith("| 300 s | ")
    # the folder reads back as a fleet plan: servesim report and servesim plot
    assert CliRunner().invoke(app, ["report", str(out)]).exit_code == 0
    embedded = servesim.read_report(out / "report.html")
    assert embedded["kind"] == "fleet plan" and embedded["result"]["static"]["replicas"] == n
    replot = CliRunner().invoke(app, ["plot", str(out), "--out", str(tmp_path / "again")])
    assert replot.exit_code == 0 and (tmp_path / "again" / "fleet_plan.png").is_file()


def test_a_fleet_plan_on_spot_capacity_prices_its_spot_hours_at_the_spot_price(tmp_path):
    """The mini day with spot capacity for every replica the fleet may hold and no preemption in
    the day (one per 10^6 hours): every replica runs on spot, so the policy's GPU-hours under the
    faults are all spot ones and its bill is those at $1.00, not the hardware's price. Beside it the
    same policy all on demand: the same day and GPU-hours (no preemption either way) at the plan's
    price, so spot lowers the bill and answers."""
    from sim.planning.fleet_report import fleet_headline

    day = dict(DAY, faults={"spot": {"replicas": 3, "preemptions_per_h": 1e-6, "usd_per_gpu_hour": 1.0},
                            "minute_s": 150})
    (tmp_path / "day.yaml").write_text(yaml.safe_dump(day))
    out = tmp_path / "plan"
    r = CliRunner().invoke(app, ["plan", str(tmp_path / "day.yaml"), "--window-s", "150", "--workers", "1", "-q",
                                 "--fault-seeds", "1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    plan = json.loads((out / "plan.json").read_text())
    row = plan["faults"]["answer"]
    assert row["spot_gpu_hours"] == pytest.approx(row["gpu_hours"]) and row["gpu_hours"] > 0
    assert row["usd"] == pytest.approx(row["gpu_hours"] * 1.0)
    assert plan["usd_per_gpu_hour"] != 1.0 and row["availability_min"] == 1.0
    f = plan["faults"]
    od = f["on_demand"]["answer"]
    assert od["spot_gpu_hours"] == 0.0 and od["gpu_hours"] == pytest.approx(row["gpu_hours"])
    assert od["usd"] == pytest.approx(od["gpu_hours"] * plan["usd_per_gpu_hour"])
    assert f["spot_lowers_bill"] and row["capacity"] == "spot first"
    said = dict(fleet_headline(plan))["spot or on demand"]
    assert said.startswith(f"spot first: min_replicas {row['min_replicas']}, ${row['usd']:,.2f}") and \
        said.endswith("spot capacity lowers the bill")
    assert "All on demand" in (out / "plan.md").read_text()


def test_a_fleet_plan_under_faults_buys_the_headroom_an_availability_target_needs(tmp_path):
    """The mini day with replica 0 out for 60 s from 100 s (the quiet hour: one replica held). The
    search is of the fault-free policy (its probes run with faults=null); then its day runs with
    the outage: with min_replicas 1 the window the outage falls in misses (5 of 6 windows meet,
    83.33%), with min_replicas 2 a warm spare carries it (6 of 6) at a few more GPU-hours. For
    --availability 0.99 the answer is min_replicas 2."""
    from sim.planning.fleet_report import fleet_headline

    day = dict(DAY, faults={"outages": [{"replica": 0, "at_s": 100, "down_s": 60}], "minute_s": 150,
                            "retry_delay_s": 0.5})
    (tmp_path / "day.yaml").write_text(yaml.safe_dump(day))
    out = tmp_path / "plan"
    r = CliRunner().invoke(app, ["plan", str(tmp_path / "day.yaml"), "--window-s", "150", "--workers", "1", "-q",
                                 "--availability", "0.99", "--fault-seeds", "1", "--out", str(out)])
    assert r.exit_code == 0, r.output
    plan = json.loads((out / "plan.json").read_text())
    assert "faults=null" in plan["policy"]["overrides"]  # (what the search judged: the fault-free day)
    f = plan["faults"]
    assert [(x["min_replicas"], round(x["availability_min"], 4), x["met"]) for x in f["rows"]] == [
        (1, round(5 / 6, 4), False), (2, 1.0, True)]
    assert f["answer"]["min_replicas"] == 2 and f["answer"]["gpu_hours"] > f["rows"][0]["gpu_hours"]
    said = dict(fleet_headline(plan))["under the faults"]
    assert said.startswith("the SLO met in 83.33% of 150-s windows (worst of 1 fault seeds") and \
        "for 99.000%: min_replicas 2 (100.00% on its worst seed)" in said


@pytest.mark.parametrize("args, message", [
    (["--target-rate", "5"], "--target-rate: not with a fleet plan"),
    (["--gpus", "h100-sxm,h200"], "--gpus: not with a fleet plan"),
    (["--window-s", "0"], "--window-s: 0.0 is not a finite number > 0"),
    (["--set", "engine.admission.rate=5"], "engine.admission is set"),
])
def test_fleet_plan_mistakes_are_refused(tmp_path, args, message):
    (tmp_path / "day.yaml").write_text(yaml.safe_dump(DAY))
    result = CliRunner().invoke(app, ["plan", str(tmp_path / "day.yaml"), "--out", str(tmp_path / "p")] + args)
    assert_one_line_error(result, message)
    assert not (tmp_path / "p").exists()


def test_window_s_needs_an_autoscaled_scenario(tmp_path):
    raw = {**DAY, "engine": {k: v for k, v in DAY["engine"].items() if k != "autoscaling"},
           "workload": {**DAY["workload"], "arrival": {"process": "poisson", "rate": 3.0}}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(app, ["plan", str(tmp_path / "s.yaml"), "--window-s", "60", "--out", str(tmp_path / "p")])
    assert_one_line_error(result, "--window-s: only for a fleet plan")


def test_a_window_too_short_for_the_run_is_refused():
    from sim.planning.fleet_plan import MOST_WINDOWS

    with pytest.raises(ScenarioError, match=r"--window-s: 0.001 s windows cut this run's 20 s of arrivals into more than"):
        judge_day(_result([0.0, 20.0], [0.05, 0.05]), SLOConfig(ttft_ms=100.0), 0.001)
    most = judge_day(_result([0.0, 20.0], [0.05, 0.05]), SLOConfig(ttft_ms=100.0), 20 / (MOST_WINDOWS - 0.5))
    assert len(most["windows"]) == MOST_WINDOWS


def test_a_floor_schedule_by_hand():
    """8 replicas serve the peak of 40 req/s: 10 req/s needs ceil(8 x 10 / 40) = 2, 25 needs 5, 40 all 8,
    at least min_replicas 2. A rise starts a 60 s cold start early (5 from 3600 - 60 = 3540, 8 from
    3630 - 60 = 3570), a fall on time (2 at 7200). A rise reaching back over the entry before it takes
    that entry's place: 4 from 50 - 60 -> 0 replaces the 2 at 0."""
    from sim.workload.generators import Profile

    day = Profile((0.0, 3600.0, 3630.0, 7200.0), (10.0, 25.0, 40.0, 1.0), 86400.0)
    assert floor_schedule(day, 8, 2, 60.0) == [[0.0, 2], [3540.0, 5], [3570.0, 8], [7200.0, 2]]
    tight = Profile((0.0, 50.0, 100.0), (10.0, 20.0, 40.0))
    assert floor_schedule(tight, 8, 1, 60.0) == [[0.0, 4], [40.0, 8]]


def test_a_fleet_plan_under_a_power_cap(tmp_path):
    """The mini day's peak needs 3 replicas of TP4 H100s: 12 GPUs x (700 W TDP + 150 W host) x PUE
    1.2 = 12.24 kW at most. A 12 kW cap: no fleet within it meets the SLO (exit 1, one line, the
    static search's runs only); a 13 kW cap: within it, the same answer as without a cap."""
    from sim.planning.fleet_report import fleet_headline

    (tmp_path / "day.yaml").write_text(yaml.safe_dump(DAY))
    base = ["plan", str(tmp_path / "day.yaml"), "--window-s", "150", "--workers", "1", "-q"]
    over = CliRunner().invoke(app, base + ["--out", str(tmp_path / "over"), "--power-cap-kw", "12"])
    assert over.exit_code == 1
    assert over.stderr.strip().splitlines()[-1] == (
        "error: no fleet within --power-cap-kw 12 meets the SLO: the peak needs 3 replicas, which may draw up to "
        "12.2 kW (12 GPUs x (700 W TDP (NVIDIA H100 SXM5 datasheet: up to 700 W) + 150 W host) x PUE 1.2: the most "
        "the fleet the peak needs can draw)")
    plan = json.loads((tmp_path / "over" / "plan.json").read_text())
    assert plan["policy"] is None and plan["power_cap"]["peak_kw_at_most"] == pytest.approx(12 * 850 * 1.2 / 1e3)
    assert plan["probes"] == []  # (no policy searched: none could fit)
    within = CliRunner().invoke(app, base + ["--out", str(tmp_path / "within"), "--power-cap-kw", "13"])
    assert within.exit_code == 0, within.output
    plan = json.loads((tmp_path / "within" / "plan.json").read_text())
    assert plan["power_cap"]["within"] and plan["static"]["replicas"] == 3 and plan["policy"] is not None
    assert dict(fleet_headline(plan))["power cap"].endswith("within it")
