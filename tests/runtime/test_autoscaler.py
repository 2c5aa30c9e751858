"""engine.autoscaling (sim/runtime/autoscaler.py) on timelines computed by hand: unit step costs
(every iteration 1 s), a continuous scheduler that runs every request at once, a trace of known
arrivals. And workload.arrival profile (a rate that changes over time)."""
from __future__ import annotations

import numpy as np
import pytest
import yaml

import servesim
from sim.workload.generators import Profile

ENGINE = {"scheduler": "continuous", "max_num_seqs": 64, "router": "least_loaded"}


def scenario(tmp_path, rows: list[str], autoscaling: dict, **engine) -> str:
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    raw = {"name": "fleet", "model": "llama-3-8b", "hardware": "h100-sxm", "cost_model": "unit",
           "engine": {**ENGINE, **engine, "autoscaling": autoscaling}, "workload": {"trace": "t.csv"}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    return str(tmp_path / "s.yaml")


def test_a_fleet_grows_after_its_cold_start_and_drains_what_it_no_longer_needs(tmp_path):
    """40 requests at 0 (95 tokens: they finish at 95) and 20 at 41 (10 tokens: done at 51);
    target 20 in flight per replica, decisions every 10 s, cold start 25 s, scale-down window 20 s.
      t=10: 40 in flight on 1 replica -> want 2: replica 1 starts, serves from 35
      t=41: the 20 go to the least loaded serving replica: replica 1 (0 < 40)
      t=50: 60 in flight, 2 held -> want 3: replica 2 starts (serves from 75)
      t=60: 40 in flight, 3 held -> want 2, but 3 was wanted within the window (at 50)
      t=70: 2 wanted over the whole window -> drain the lightest serving replica, 1 (empty since 51):
            released at 70 (told to drain then; its last request finished at 51)
      t=95: the last request finishes: replicas 0 and 2 released.
    Held: 0-95, 10-70, 50-95 = 200 replica-seconds."""
    rows = ["0,1,95"] * 40 + ["41,1,10"] * 20
    result = servesim.run(scenario(tmp_path, rows, {"min_replicas": 1, "max_replicas": 4, "target_in_flight": 20,
                                                    "interval_s": 10, "cold_start_s": 25, "scale_down_delay_s": 20}))
    a, rq = result.summary["autoscaling"], result.requests
    assert [(e["t_s"], e["action"], e["wanted"], e["in_flight"], e["serving"], e["starting"], e["draining"])
            for e in a["events"]] == [(10, "started", 2, 40, 1, 1, 0), (50, "started", 3, 60, 2, 1, 0),
                                      (70, "draining", 2, 40, 1, 1, 1), (70, "released", None, 40, 1, 1, 0)]
    assert [(s["replica"], s["start_s"], s["end_s"], s["drain_s"]) for s in a["spans"]] == [
        (0, 0, 95, None), (1, 10, 70, 70), (2, 50, 95, None)]
    assert (rq["replica"][rq["arrival_s"] == 0] == 0).all() and (rq["replica"][rq["arrival_s"] == 41] == 1).all()
    assert rq["finish_s"].max() == 95 and (rq["finish_s"][rq["arrival_s"] == 41] == 51).all()
    assert a["gpu_hours"] == pytest.approx(200 / 3600) and a["mean_replicas"] == pytest.approx(200 / 95)
    assert a["peak_replicas"] == 3
    assert a["static_max_gpu_hours"] == pytest.approx(4 * 95 / 3600)
    assert a["saving_vs_static_max"] == pytest.approx(1 - 200 / 380)
    assert a["usd"] == pytest.approx(200 / 3600 * a["usd_per_gpu_hour"])
    # the report's summary says it: 200/3600 GPU-hours, at the H100 preset's $3.00, 200/95 replicas
    page = servesim.report(result.write(tmp_path / "out")).read_text()
    assert "<td>GPU-hours (autoscaled)</td><td>0.06 ($0.17); 2.11 replicas on average, at most 3</td>" in page


def test_a_draining_replica_takes_no_new_requests_and_is_held_until_its_last_finishes(tmp_path):
    """Two replicas, 5 requests each at 0 (25 tokens: done at 25); one more at 12. Target 20: at
    t=10, 10 in flight on 2 -> want 1; no window: replica 1 (the lightest, ties to the later) drains
    now, still holding 5 requests. The one at 12 goes to replica 0. Replica 1 is held to 25."""
    rows = ["0,1,25"] * 10 + ["12,1,5"]
    result = servesim.run(scenario(tmp_path, rows, {"min_replicas": 1, "max_replicas": 2, "target_in_flight": 20,
                                                    "interval_s": 10, "cold_start_s": 0, "scale_down_delay_s": 0},
                                   replicas=2))
    a, rq = result.summary["autoscaling"], result.requests
    assert a["events"][0]["t_s"] == 10 and a["events"][0]["action"] == "draining"
    assert rq["replica"].tolist()[:10] == [0, 1] * 5 and rq["replica"].iloc[10] == 0
    assert {s["replica"]: s["end_s"] for s in a["spans"]} == {0: 25, 1: 25}
    assert (rq["finish_s"][:10] == 25).all()


def test_a_fleet_never_holds_more_than_its_max_and_never_serves_fewer_than_its_min(tmp_path):
    rows = [f"{t},1,30" for t in range(0, 60)] * 5  # 5 a second for a minute
    result = servesim.run(scenario(tmp_path, rows, {"min_replicas": 2, "max_replicas": 3, "target_in_flight": 4,
                                                    "interval_s": 5, "cold_start_s": 7, "scale_down_delay_s": 0}))
    a = result.summary["autoscaling"]
    assert a["peak_replicas"] == 3 and result.requests["replica"].max() <= 2
    for e in a["events"]:
        assert e["serving"] + e["starting"] + e["draining"] <= 3 and e["serving"] + e["starting"] >= 2


@pytest.mark.parametrize("autoscaling, engine, says", [
    ({"max_replicas": 4}, {}, "engine.autoscaling.target_in_flight: missing"),
    ({"max_replicas": 2, "target_in_flight": 8}, {"replicas": 3}, "engine.replicas: 3 replicas serve at the start, "
                                                                  "outside engine.autoscaling's [1, 2]"),
    ({"max_replicas": 2, "target_in_flight": 8, "min_replicas": 3}, {}, "engine.autoscaling.max_replicas: 2 is not an "
                                                                        "integer >= 3"),
    ({"max_replicas": 2, "target_in_flight": 8, "cooldown": 3}, {}, "cooldown"),
    ({"max_replicas": 2, "target_in_flight": 0}, {}, "engine.autoscaling.target_in_flight"),
    ({"max_replicas": 2, "target_in_flight": 8, "interval_s": 1e-6}, {}, "engine.autoscaling.interval_s: 1e-06 is not "
                                                                         "a number >= 0.1"),
])
def test_autoscaling_settings_are_checked(tmp_path, autoscaling, engine, says):
    with pytest.raises(servesim.ScenarioError, match=says.replace("[", r"\[").replace("]", r"\]")):
        servesim.run(scenario(tmp_path, ["0,1,5"], autoscaling, **engine))


def test_the_bundled_day_is_served_by_fewer_gpu_hours_than_a_static_fleet_of_its_max():
    """scenarios/day-autoscaling.yaml, its first 6 hours (the night, rising toward the day)."""
    result = servesim.run("scenarios/day-autoscaling.yaml", workload__num_requests=40_000)
    a = result.summary["autoscaling"]
    assert a["gpu_hours"] < a["static_max_gpu_hours"] and a["mean_replicas"] < 6
    assert result.summary["completed"] == 40_000


# ---------------------------------------------------------------- arrival profiles

def test_a_profile_maps_expected_arrivals_to_times_by_its_rates():
    # 1 req/s for 10 s, none for 10 s, then 3 req/s for ever
    p = Profile((0.0, 10.0, 20.0), (1.0, 0.0, 3.0))
    assert p.cumulative().tolist() == [0, 10, 10]
    assert p.at(np.array([0.5, 9.5, 10.0, 10.5, 13.0])).tolist() == pytest.approx([0.5, 9.5, 20, 20 + 0.5 / 3, 21])
    # repeated every 20 s: 1 req/s then 3 req/s, 40 expected a period
    q = Profile((0.0, 10.0), (1.0, 3.0), period_s=20.0)
    assert q.at(np.array([5, 10, 25, 40, 45])).tolist() == pytest.approx([5, 10, 15, 20, 25])


def test_profile_arrivals_follow_the_rate_of_the_moment(tmp_path):
    (tmp_path / "rates.csv").write_text("start_s,rate\n0,2\n100,10\n200,0\n300,4\n")
    raw = {"name": "p", "model": "llama-3-8b", "hardware": "h100-sxm", "cost_model": "roofline",
           "workload": {"arrival": {"process": "profile", "rates": "rates.csv", "period_s": 400},
                        "num_requests": 1600 * 20, "prompt_tokens": {"dist": "fixed", "value": 8},
                        "output_tokens": {"dist": "fixed", "value": 2}}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    from sim.workload.generators import build_workload

    sc = servesim.load_scenario(tmp_path / "s.yaml")
    t = build_workload(sc.workload, np.random.default_rng(0)).arrival_s
    phase = t % 400
    periods = t[-1] / 400
    per_segment = [np.count_nonzero((phase >= a) & (phase < b)) / periods for a, b in
                   ((0, 100), (100, 200), (200, 300), (300, 400))]
    assert per_segment[2] == 0  # no arrivals while the rate is 0
    assert per_segment[0] == pytest.approx(200, rel=0.05) and per_segment[1] == pytest.approx(1000, rel=0.05)
    assert per_segment[3] == pytest.approx(400, rel=0.05)


@pytest.mark.parametrize("arrival, says", [
    ({"rates": [[5, 2], [10, 3]]}, "start times must begin at 0 and increase"),
    ({"rates": [[0, 2], [0, 3]]}, "start times must begin at 0 and increase"),
    ({"rates": [[0, 2], [10, 0]]}, "without period_s the last rate holds for ever"),
    ({"rates": [[0, 2], [10, 3]], "period_s": 10}, "workload.arrival.period_s: 10 is not after the last start"),
    ({"rates": "2 req/s"}, "no such file"),
    ({"rates": [[0, -1]]}, "rate"),
    ({"rates": [0, 2]}, "a list of [start_s, rate] pairs"),
])
def test_profile_settings_are_checked(tmp_path, arrival, says):
    raw = {"name": "p", "model": "llama-3-8b", "hardware": "h100-sxm",
           "workload": {"arrival": {"process": "profile", **arrival}, "num_requests": 10,
                        "prompt_tokens": {"dist": "fixed", "value": 8}, "output_tokens": {"dist": "fixed", "value": 2}}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(servesim.ScenarioError, match=says.replace("[", r"\[").replace("]", r"\]")):
        servesim.load_scenario(tmp_path / "s.yaml")


def test_a_profile_csv_with_another_header_is_refused_naming_it(tmp_path):
    (tmp_path / "rates.csv").write_text("hour,rps\n0,2\n")
    raw = {"name": "p", "model": "llama-3-8b", "hardware": "h100-sxm",
           "workload": {"arrival": {"process": "profile", "rates": "rates.csv"}, "num_requests": 10,
                        "prompt_tokens": {"dist": "fixed", "value": 8}, "output_tokens": {"dist": "fixed", "value": 2}}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(servesim.ScenarioError, match=r"rates.csv: a rate profile CSV has the header start_s,rate"):
        servesim.load_scenario(tmp_path / "s.yaml")


def test_plan_refuses_a_profile_without_a_fleet_and_sizing_options_with_one():
    """An autoscaled scenario gets a fleet plan (tests/planning/test_fleet_plan.py), which takes the
    scenario's own load: a target rate is refused; a profile without autoscaling has no steady load."""
    with pytest.raises(servesim.ScenarioError, match=r"--target-rate: not with a fleet plan"):
        servesim.plan("scenarios/day-autoscaling.yaml", target_rate=5.0)
    with pytest.raises(servesim.ScenarioError, match="plan: workload.arrival profile varies its rate.*add "
                                                     "engine.autoscaling for a fleet plan"):
        servesim.plan("scenarios/day-autoscaling.yaml", overrides=["engine.autoscaling=null"])


def test_the_fleet_over_time_is_read_from_its_spans(tmp_path):
    """The first timeline above in 19 stretches of 5 s: replica 0 held and serving 0-95; replica 1
    held 10-70, serving 35 (after its 25 s cold start) to 70 (told to drain); replica 2 held 50-95,
    serving from 75. 40 arrivals in [0, 5), 20 in [40, 45)."""
    from sim.reporting.analysis import fleet_timeline
    from sim.reporting.interactive import run_figures
    from sim.reporting.plots import fleet_plot

    rows = ["0,1,95"] * 40 + ["41,1,10"] * 20
    result = servesim.run(scenario(tmp_path, rows, {"min_replicas": 1, "max_replicas": 4, "target_in_flight": 20,
                                                    "interval_s": 10, "cold_start_s": 25, "scale_down_delay_s": 20}))
    f = fleet_timeline(result.as_run(), bins=19)
    assert f["t_s"].tolist() == [5.0 * k for k in range(19)]
    assert f["held"].tolist() == [1, 1] + [2] * 8 + [3] * 4 + [2] * 5
    assert f["serving"].tolist() == [1] * 7 + [2] * 7 + [1] + [2] * 4
    assert f["arrival_rate"].tolist() == [8.0] + [0.0] * 7 + [4.0] + [0.0] * 10
    assert np.isnan(f["ttft_ms.p99"].iloc[1]) and f["ttft_ms.p99"].iloc[0] == pytest.approx(1000)
    assert "4 all the time" in fleet_plot(result.as_run()).axes[0].get_title()  # against max_replicas
    assert run_figures(result.as_run())[-1].layout.title.text.startswith("The fleet: ")
    with pytest.raises(servesim.ScenarioError, match="not an autoscaled run"):
        fleet_timeline(servesim.run("scenarios/quickstart.yaml", workload__num_requests=20).as_run())


def test_a_sweep_over_the_autoscalers_target_keeps_each_fleets_totals_in_its_row(tmp_path):
    from sim.planning.sweep import parse_grid, run_sweep

    rows = ["0,1,95"] * 40 + ["41,1,10"] * 20
    path = scenario(tmp_path, rows, {"min_replicas": 1, "max_replicas": 4, "target_in_flight": 20,
                                     "interval_s": 10, "cold_start_s": 25, "scale_down_delay_s": 20})
    done = run_sweep(path, parse_grid(["engine.autoscaling.target_in_flight=20,40"]), tmp_path / "sw", workers=1)
    r = done.rows.set_index(done.rows["engine.autoscaling.target_in_flight"].astype(float))
    assert r.loc[20, "autoscaling.gpu_hours"] == pytest.approx(200 / 3600)  # the timeline above
    assert r.loc[40, "autoscaling.gpu_hours"] < r.loc[20, "autoscaling.gpu_hours"]  # 40 in flight: 1 replica
    assert not [c for c in done.rows.columns if c.startswith("autoscaling.events") or c.startswith("autoscaling.spans")]


@pytest.mark.parametrize("path, settings", [
    ("scenarios/closed-loop-llama3-8b-h100.yaml", {"engine__enable_prefix_caching": False}),  # users, routed live
    ("scenarios/quickstart.yaml", {"engine__router": "prefix_aware"}),  # a rule that reads the serving caches
])
def test_closed_loops_and_every_router_run_on_an_autoscaled_fleet(path, settings):
    result = servesim.run(path, engine__autoscaling={"max_replicas": 3, "target_in_flight": 4, "interval_s": 2,
                                                     "cold_start_s": 3, "scale_down_delay_s": 10}, **settings)
    a, rq = result.summary["autoscaling"], result.requests
    assert result.summary["completed"] == len(rq) and a["peak_replicas"] == 3
    assert set(rq["replica"]) == {0, 1, 2}
    for span in a["spans"]:  # no request ran on a replica outside the times it served
        mine = rq[(rq["replica"] == span["replica"]) & (rq["arrival_s"] >= span["start_s"])]
        assert (mine["first_token_s"] >= span["start_s"] + (3 if span["start_s"] > 0 else 0) - 1e-9).all()


def test_a_restarted_replica_starts_with_an_empty_cache():
    """A prefix cache holding a request's blocks, all freed: restart drops every hash (nothing is
    found any more, every block free and hashless); the hit statistics stay."""
    from sim.kv.prefix_cache import PrefixKVCache, block_hashes

    chain = block_hashes(((("sys",),), 64), 0, 64, 16)
    cache = PrefixKVCache(10, 16, [chain, chain], [64, 64])
    assert cache.admit(0, cache.lookup(0, 64), 4, 64)
    cache.commit(0, 64)
    cache.free_request(0, 4)
    assert len(cache.lookup(1, 64)) == 3 and cache.cached_blocks == 4   # 3 of 4 looked up: hit
    queried, hits = cache.queried_tokens, cache.hit_tokens
    cache.restart()
    assert cache.lookup(1, 64) == [] and cache.cached_blocks == 0 and cache.free == 10
    assert (cache.queried_tokens, cache.hit_tokens) == (queried, hits)
    assert cache.admit(1, [], 4, 64) and cache.free == 6  # it serves as a fresh cache


def test_an_autoscaled_fleet_serves_agents_with_prefix_caching():
    """Agent sessions (their calls hit the previous call's blocks) on a fleet that grows and
    shrinks: every call served, the cache hit, no call on a replica outside the times it served."""
    w = {"arrival": {"process": "agents", "rate": 2.0, "sessions": 120, "steps": {"dist": "uniform", "low": 2, "high": 6},
                     "tool_time": 1.0},
         "prompt_tokens": {"dist": "uniform", "low": 100, "high": 600}, "output_tokens": {"dist": "uniform", "low": 20, "high": 200}}
    raw = {"name": "agent-fleet", "model": "llama-3-8b", "hardware": "h100-sxm", "cost_model": "roofline", "workload": w,
           "engine": {"scheduler": "chunked", "router": "prefix_aware",
                      "autoscaling": {"max_replicas": 3, "target_in_flight": 3, "interval_s": 2, "cold_start_s": 3,
                                      "scale_down_delay_s": 6}}}
    result = servesim.run(raw)
    a, rq = result.summary["autoscaling"], result.requests
    assert result.summary["completed"] == len(rq) and a["peak_replicas"] >= 2
    assert result.summary["prefix_cache_hit_rate"] > 0.3
    restarted = [s["replica"] for s in a["spans"]]
    assert len(restarted) > len(set(restarted))  # a replica released and started again (its cache: empty)
    for span in a["spans"]:
        end = span["end_s"] if span["end_s"] is not None else np.inf
        mine = rq[(rq["replica"] == span["replica"]) & (rq["first_token_s"] >= span["start_s"]) & (rq["first_token_s"] <= end)]
        assert (mine["first_token_s"] >= span["start_s"] + (3 if span["start_s"] > 0 else 0) - 1e-9).all()


def test_a_scheduled_floor_starts_replicas_ahead_of_the_load(tmp_path):
    """One request at 0 that runs to 60 (unit steps); target 10 in flight (never reached); the
    floor 1, then 3 from 20 s, then 1 from 40 s; decisions every 10 s, 5 s cold start, no
    scale-down window. t=20: the floor wants 3: replicas 1 and 2 start (serve from 25). t=40: the
    floor is 1 again: the two empty replicas drain and are released at once. Held: 0-60 and twice
    20-40: 100 replica-seconds."""
    path = scenario(tmp_path, ["0,1,60"], {"min_replicas": 1, "max_replicas": 4, "target_in_flight": 10,
                                           "interval_s": 10, "cold_start_s": 5, "scale_down_delay_s": 0,
                                           "min_replicas_schedule": [[0, 1], [20, 3], [40, 1]]})
    a = servesim.run(path).summary["autoscaling"]
    assert [(e["t_s"], e["action"], e["wanted"]) for e in a["events"]] == [
        (20, "started", 3), (40, "draining", 1), (40, "released", None), (40, "released", None)]
    assert sorted((s["replica"], s["start_s"], s["end_s"]) for s in a["spans"]) == [(0, 0, 60), (1, 20, 40), (2, 20, 40)]
    assert a["gpu_hours"] == pytest.approx(100 / 3600)


def test_a_schedule_repeats_with_its_period_and_bounds_are_checked():
    from sim.config.autoscaling import AutoscalingConfig

    c = AutoscalingConfig(min_replicas=2, max_replicas=6, target_in_flight=8,
                          min_replicas_schedule=((0.0, 1), (100.0, 5)), schedule_period_s=200.0)
    assert [c.floor(t) for t in (0, 99, 100, 199, 200, 350)] == [2, 2, 5, 5, 2, 5]  # never under min_replicas
    from simhelpers import make_scenario
    for sched, period, message in (([[5, 1]], None, "start times must begin at 0"),
                                   ([[0, 9]], None, r"min_replicas_schedule\[0\] replicas"),
                                   ([[0, 1], [50, 2]], 40, "schedule_period_s: 40 is not after the last start"),
                                   (None, 10, "schedule_period_s: only with min_replicas_schedule")):
        raw = {"max_replicas": 4, "target_in_flight": 8, "schedule_period_s": period}
        if sched is not None:
            raw["min_replicas_schedule"] = sched
        with pytest.raises(servesim.ScenarioError, match=message):
            make_scenario(autoscaling=raw)


def test_a_replica_started_again_finds_nothing_of_what_it_cached_before(tmp_path):
    """Prompts sharing two 16-token blocks, unit steps, at most 2 replicas of 3 in flight each,
    decisions every second, no cold start or scale-down window. 6 requests at 0 go to replica 0;
    replica 1 starts at 1 and takes the 3 at 5. Replica 0 empties first and is released (20);
    at 100, 6 arrivals find the prefix cached on replica 1 (32 tokens each). Replica 0 starts
    again at 100 and takes the 3 at 105: a new pod, its cache empty, so they find nothing, though
    replica 0 held those blocks before its release (32 each if its cache had been kept)."""
    rows = ["0,40,20,1 2"] * 6 + ["5,40,20,1 2"] * 3 + ["100,40,20,1 2"] * 6 + ["105,40,20,1 2"] * 3
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens,hash_ids\n" + "\n".join(rows) + "\n")
    raw = {"name": "restart", "model": "llama-3-8b", "hardware": "h100-sxm", "cost_model": "unit",
           "engine": {"scheduler": "chunked", "max_num_seqs": 64, "block_size": 16, "router": "least_loaded",
                      "autoscaling": {"min_replicas": 1, "max_replicas": 2, "target_in_flight": 3, "interval_s": 1,
                                      "cold_start_s": 0, "scale_down_delay_s": 0}},
           "workload": {"trace": str(tmp_path / "t.csv"), "hash_block_tokens": 16}}
    result = servesim.run(raw)
    rq, a = result.requests, result.summary["autoscaling"]
    assert [(s["replica"], s["start_s"]) for s in a["spans"]] == [(0, 0.0), (1, 1.0), (0, 100.0)]
    assert rq["replica"].tolist() == [0] * 6 + [1] * 3 + [1] * 6 + [0] * 3
    assert rq["cached_tokens"].tolist() == [0] * 9 + [32] * 6 + [0] * 3
