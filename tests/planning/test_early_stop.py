"""The planner's early stop (sim/planning/slo.EarlyStop): a run ends once its SLO verdict is a
certain miss, never before, and a run it does not stop is the run without it."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from sim.planning.fleet_plan import judge_day
from sim.planning.slo import EarlyStop, Stopped, simulate_point
from sim.scenario import SLOConfig, load_scenario
from sim.simulate import simulate

REPO = Path(__file__).parents[2]
QUICKSTART = REPO / "scenarios" / "quickstart.yaml"
SLO = SLOConfig(ttft_ms=500, tpot_ms=50, percentile=99)


def _table(arrival):
    n = len(arrival)
    return SimpleNamespace(arrival=np.asarray(arrival, dtype=np.float64), first_token=np.full(n, np.nan),
                           finish=np.full(n, np.nan))


def _ticks(hook, n=EarlyStop.CHECK_EVERY):
    for _ in range(n):
        hook()


def test_it_stops_exactly_when_the_percentile_is_certain_to_pass_the_limit():
    """100 judged requests, p99 TTFT <= 500 ms at factor 1: numpy's percentile reads order
    statistics 98 and 99 (0-based), so 2 requests past 500 ms put it past, 1 does not."""
    req = _table(np.arange(100) * 1.0)
    hook = EarlyStop(SLOConfig(ttft_ms=500, percentile=99), 0.0, 1.0).watch(req)
    req.first_token[:60] = req.arrival[:60] + 0.1  # the first 60 first tokens, 100 ms after their arrivals
    req.first_token[3] = req.arrival[3] + 0.7      # one past the limit: not yet certain
    _ticks(hook)  # (no stop)
    req.first_token[60:] = req.arrival[60:] + 0.1
    req.first_token[70] = req.arrival[70] + 0.9  # a second: the p99 is past 500 ms whatever the rest do
    with pytest.raises(Stopped) as stop:
        _ticks(hook)
    assert stop.value.metric == "ttft_ms" and stop.value.bound_ms == 500
    assert np.percentile((req.first_token - req.arrival) * 1e3, 99) > 500


def test_a_request_still_waiting_past_the_limit_counts():
    req = _table([0.0, 0.1, 0.2, 0.3])  # p50: 4 - floor(3 x 0.5) = 3 late stop it
    hook = EarlyStop(SLOConfig(ttft_ms=1000, percentile=50), 0.0, 1.0).watch(req)
    req.first_token[3] = 5.0  # the clock has reached 5 s; requests 0-2 have waited longer than 1 s
    with pytest.raises(Stopped):
        _ticks(hook)


def test_windows_are_judged_each_on_its_own():
    """Two windows of 10 s with 10 requests each, p90: 10 - floor(9 x 0.9) = 2 late stop one."""
    req = _table(np.r_[np.arange(10) * 1.0, 10 + np.arange(10) * 1.0])
    hook = EarlyStop(SLOConfig(ttft_ms=100, percentile=90), 0.0, 1.0, window_s=10.0).watch(req)
    req.first_token[:16] = req.arrival[:16] + 0.05
    req.first_token[[2, 15]] += 1.0  # one late in each window: neither is certain
    _ticks(hook)
    req.first_token[16:] = req.arrival[16:] + 0.05
    req.first_token[17] += 1.0  # a second in window 2
    with pytest.raises(Stopped) as stop:
        _ticks(hook)
    assert stop.value.window == 1


@pytest.mark.parametrize("rate", [16.0, 22.0, 24.0, 30.0, 45.0])
def test_a_stopped_run_misses_and_an_unstopped_run_is_unchanged(rate):
    sc = replace(load_scenario(QUICKSTART, [f"workload.arrival.rate={rate}", "workload.num_requests=2500"]), slo=SLO)
    stop = EarlyStop(SLO, 0.1, 1.5)
    full = simulate_point(sc, SLO, 0.1)
    watched = simulate_point(sc, SLO, 0.1, stop)
    if watched.get("stopped"):
        assert not full["met"] and full["ttft_ms"]["slo"] > 1.5 * SLO.ttft_ms  # the bound it stopped at
        assert watched["ttft_ms"]["slo"] == 1.5 * SLO.ttft_ms and watched["stopped"]["at_s"] < 2500 / rate
    else:
        assert {k: v for k, v in watched.items() if k != "wall_s"} == {k: v for k, v in full.items() if k != "wall_s"}
    if rate >= 30:
        assert watched.get("stopped")  # far past saturation it stops


def test_a_fleet_run_stops_at_a_window_it_misses():
    """A day of two rates: 5 req/s, then 40 req/s (past one H100's): the run stops in the second
    window, which the whole run's judgement also misses, and the first window meets."""
    sc = load_scenario(QUICKSTART, ["workload.arrival={process: profile, rates: [[0, 5.0], [60, 40.0]]}",
                                    "workload.num_requests=2700"])
    slo = SLOConfig(ttft_ms=500, percentile=99)
    with pytest.raises(Stopped) as stop:
        simulate(sc, watch=EarlyStop(slo, 0.0, 1.0, window_s=60.0).watch)
    assert stop.value.window == 1
    day = judge_day(simulate(sc), slo, 60.0)
    assert day["windows"][0]["met"] and not day["windows"][1]["met"]
