"""The error band every run carries (sim/cost/error_band.py) and the request-time spread it rests
on (sim/cost/overheads.py: frontend_cv, stalls): numbers computed by hand here."""
from __future__ import annotations

import math

import numpy as np
import pytest

from sim.cost import error_band as eb
from sim.cost.overheads import EngineOverheads, mean_one_lognormal, stall_delays


def test_lognormal_has_mean_one_and_the_cv_asked():
    x = mean_one_lognormal(np.random.default_rng(0), 0.5, 400_000)
    assert abs(x.mean() - 1) < 0.005 and abs(x.std() / x.mean() - 0.5) < 0.01


def test_stalls_delay_what_is_in_flight_across_them():
    """Two requests on one engine, one pause drawn by hand: the request in flight across it waits it
    out on its last token, not on its first (which came before the pause)."""
    class Rng:  # one pause at t = 5 s lasting 0.3 s
        def poisson(self, lam):
            return 1

        def uniform(self, lo, hi, k):
            return np.array([5.0])

        def exponential(self, mean, k):
            return np.array([0.3])

    arrival = np.array([0.0, 6.0, 5.1])
    first = np.array([1.0, 6.5, 5.5])
    finish = np.array([10.0, 9.0, 7.0])
    on_first, on_finish = stall_delays(Rng(), 1.0, 0.3, arrival, first, finish, np.array([0, 0, 0]))
    # the third arrived 0.1 s into the pause: it waits the other 0.2 s, on both tokens
    assert on_first.tolist() == pytest.approx([0.0, 0.0, 0.2]) and on_finish.tolist() == pytest.approx([0.3, 0.0, 0.2])


def test_shifts_without_spread_are_the_constant_frontend():
    o = EngineOverheads(frontend_s=0.007)
    a = np.zeros(3)
    f, e = o.shifts(a, np.array([10, 20, 30]), a + 1, a + 2, np.zeros(3, int), None)
    assert f.tolist() == [0.007] * 3 and e.tolist() == [0.007] * 3


def _errors(values):
    return {k: np.array(values) for k in ("ttft_mean_ms", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms",
                                          "tpot_mean_ms", "tpot_p50_ms", "e2e_mean_s", "e2e_p50_s",
                                          "e2e_p90_s", "e2e_p99_s")}


def test_measured_part_from_held_out_errors_by_hand():
    # errors e with log(real / sim) = -log(1 + e) of -0.1, 0, +0.1 (three stages): mean 0, sample sd
    # 0.1, a 95% prediction interval of +- t(0.975, 2) x 0.1 x sqrt(1 + 1/3), t(0.975, 2) = 4.3027
    from scipy.stats import t
    assert t.ppf(0.975, 2) == pytest.approx(4.3027, abs=1e-4)
    half = 4.302653 * 0.1 * math.sqrt(4 / 3)
    errors = _errors(np.expm1(-np.array([-0.1, 0.0, 0.1])))
    lo, hi = eb.measured_part("ttft_ms", "p50", errors)
    assert lo == pytest.approx(-half, rel=1e-5) and hi == pytest.approx(half, rel=1e-5)
    # ITL tails were never measured: twice as wide
    lo2, hi2 = eb.measured_part("itl_ms", "p99", errors)
    assert lo2 == pytest.approx(2 * lo) and hi2 == pytest.approx(2 * hi)


def test_a_band_that_only_errs_fast_still_holds_the_simulated_value():
    # the simulation always fast: log(real / sim) of 0.2, 0.3, 0.4: mean 0.3, sd 0.1
    errors = _errors(np.expm1(-np.array([0.2, 0.3, 0.4])))
    half = 4.302653 * 0.1 * math.sqrt(4 / 3)
    lo, hi = eb.measured_part("tpot_ms", "mean", errors)
    assert 0.3 - half < 0 and lo == pytest.approx(0.3 - half, rel=1e-5)  # (here the interval spans 0 anyway)
    errors = _errors(np.expm1(-np.array([0.50, 0.51, 0.52])))  # every end of the interval fast
    lo, hi = eb.measured_part("tpot_ms", "mean", errors)
    assert lo == 0.0 and hi == pytest.approx(0.51 + 4.302653 * 0.01 * math.sqrt(4 / 3), rel=1e-5)


def test_band_widens_by_path_and_says_why(monkeypatch):
    monkeypatch.setattr(eb, "held_out_errors", lambda: _errors(np.zeros(20)))
    summary = {"ttft_ms": {"mean": 50.0, "p50": 40.0, "p90": 60.0, "p99": 100.0},
               "tpot_ms": {"mean": 10.0, "p50": 10.0, "p90": 11.0, "p99": 12.0},
               "itl_ms": {"mean": 10.0, "p50": 10.0, "p90": 11.0, "p99": 30.0},
               "e2el_ms": {"mean": 2000.0, "p50": 1900.0, "p90": 2500.0, "p99": 3000.0}}
    ok = eb.band(eb.BandPath("validated", "h100-sxm"), summary)
    assert ok["tpot_ms"]["mean"] == [10.0, 10.0] and ok["basis"]["validated"]
    amd = eb.band(eb.BandPath("roofline_unmeasured", "mi300x"), summary)
    fast, slow = eb.WIDEN["roofline_unmeasured"]
    assert amd["tpot_ms"]["mean"] == pytest.approx([10 * math.exp(-fast), 10 * math.exp(slow)], abs=1e-6)
    assert amd["basis"]["estimated"] and "estimated, not validated" in amd["basis"]["widened_for"][0]
    spec = eb.band(eb.BandPath("tables_other_gpu", "a100-80gb", features=("speculative decoding",)), summary)
    f1, s1 = eb.WIDEN["tables_other_gpu"]
    f2, s2 = eb.WIDEN["feature"]
    assert spec["tpot_ms"]["p50"][1] == pytest.approx(10 * math.exp(s1 + s2), abs=1e-6)
    # overloaded: waiting times get the widest band, TPOT does not
    over = dict(summary, ttft_ms={"mean": 5e4, "p50": 4e4, "p90": 6e4, "p99": 7e4})
    b = eb.band(eb.BandPath("validated", "h100-sxm"), over)
    assert b["ttft_ms"]["p50"] == pytest.approx([4e4 * math.exp(-1.0), 4e4 * math.exp(1.0)], abs=1e-6)
    assert b["tpot_ms"]["mean"] == [10.0, 10.0]
    # a user's own bench fit: its step-time band, nothing widened for GPU or model
    mine = eb.band(eb.BandPath("user_bench", "l40s", user_band={"slower": 1.1, "faster": 0.95, "basis": "x"}),
                   summary)
    assert mine["tpot_ms"]["mean"] == pytest.approx([9.5, 11.0], abs=1e-6) and mine["basis"]["validated"]


def test_every_run_carries_the_band_and_run_prints_it(tmp_path):
    from typer.testing import CliRunner

    from cli import app
    out = tmp_path / "q"
    r = CliRunner().invoke(app, ["run", "scenarios/quickstart.yaml", "--out", str(out)])
    assert r.exit_code == 0, r.output
    import json
    s = json.loads((out / "summary.json").read_text())
    band = s["error_band"]
    for metric in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        for stat in ("mean", "p50", "p90", "p99"):
            lo, hi = band[metric][stat]
            assert lo <= s[metric][stat] <= hi
    assert "real vLLM expected within: TTFT p50" in r.output


def test_planner_band_is_per_path():
    from sim.scenario import scenario_from_dict
    w = {"num_requests": 5, "arrival": {"process": "poisson", "rate": 1.0},
         "prompt_tokens": {"dist": "fixed", "value": 10}, "output_tokens": {"dist": "fixed", "value": 10}}
    h100 = eb.step_factors(scenario_from_dict({"name": "a", "model": "llama-3-8b", "hardware": "h100-sxm",
                                               "workload": w}))
    amd = eb.step_factors(scenario_from_dict({"name": "a", "model": "llama-3-8b", "hardware": "mi300x",
                                              "workload": w}))
    assert amd["slower"] > h100["slower"] >= 1 >= h100["faster"] > amd["faster"]
    assert "estimated, not validated" in amd["basis"]


def test_unit_slips_are_warned_and_a_replaced_run_is_said(tmp_path):
    from typer.testing import CliRunner

    from cli import app
    out = tmp_path / "q"
    args = ["run", "scenarios/quickstart.yaml", "--out", str(out), "--set", "slo.ttft_ms=0.5", "--set",
            "workload.num_requests=20"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "warning: slo.ttft_ms: 0.5 ms is under a millisecond; if seconds were meant, write 500" in r.output
    assert "replaced the earlier run" not in r.output
    assert "SLO: p99 TTFT <= 0.5 ms" in r.output  # the target as written, not rounded to 0
    r = CliRunner().invoke(app, args)
    assert f"note: replaced the earlier run in {out}" in r.output


def test_the_printed_band_never_uses_exponent_form():
    """A wide tail band (a 135 ms p99 that real vLLM may serve at 1,120 ms) printed as 1.12e+03;
    the line writes figures as a person reads them: 3 significant figures, thousands grouped."""
    b = {"ttft_ms": {"p50": [37.61, 46.5], "p99": [35.5, 1123.4]}, "tpot_ms": {"mean": [7.6, 9.32]},
         "e2el_ms": {"p50": [1630.0, 19870.0]},
         "basis": {"estimated": False, "validated": True, "widened_for": []}}
    assert eb.one_line(b) == ("real vLLM expected within: TTFT p50 37.6-46.5 ms, p99 35.5-1,123 ms, TPOT 7.6-9.32 ms, "
                              "E2E p50 1.63-19.9 s (validated path)")
