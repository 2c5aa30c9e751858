"""`servesim calibrate --from-bench`: the engine overheads fitted back from benchmarks of a server
whose overheads are known (servesim itself, exported as `vllm bench serve` results), and the
profile it writes priced, planned and reported as calibrated."""
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from calibrate.overheads import FIT_METRICS, fit_bench
from cli import app
from sim.config.scenario import scenario_from_dict
from sim.reporting.analysis import load_run
from sim.reporting.export import vllm_bench
from sim.simulate import simulate, write_outputs

KNOWN = {"host_per_iteration_s": 0.0, "per_iteration_s": 0.0005, "tp_sync_per_iteration_s": 0.0,
         "frontend_s": 0.008, "frontend_per_prompt_token_s": 0.0, "async_scheduling": True}
# a grid around the truth (every key of calibrate.overheads.GRID), small enough for a unit test
SMALL_GRID = {"async_scheduling": (False, True), "host_per_iteration_s": (0.0,),
              "per_iteration_s": (0.0, 0.0005, 0.001), "tp_sync_per_iteration_s": (0.0,)}


def bench(tmp_path: Path, rate: float, n: int = 150) -> Path:
    """A `vllm bench serve` result of servesim with KNOWN overheads: Llama-3-8B, one H100."""
    sc = scenario_from_dict({"name": f"bench-{rate:g}", "seed": 1, "model": "llama-3-8b", "hardware": "h100-sxm",
                             "cost_model": {"measured": KNOWN}, "engine": {"scheduler": "chunked"},
                             "workload": {"arrival": {"process": "poisson", "rate": rate}, "num_requests": n,
                                          "prompt_tokens": {"dist": "uniform", "low": 200, "high": 1200},
                                          "output_tokens": {"dist": "uniform", "low": 50, "high": 200}}})
    run = tmp_path / f"run-{rate:g}"
    write_outputs(simulate(sc), run)
    path = tmp_path / f"bench-{rate:g}.json"
    path.write_text(json.dumps(vllm_bench(load_run(run))))
    return path


def test_known_overheads_are_fitted_back(tmp_path):
    benches = [bench(tmp_path, 4.0), bench(tmp_path, 12.0)]
    result = fit_bench(benches, "llama-3-8b", "h100-sxm", 1, grid=SMALL_GRID)
    assert result["params"] == KNOWN
    for r in result["after"]:  # the same simulator with the same overheads: no error left
        assert all(abs(r.error[k]) < 1e-6 for k in FIT_METRICS), r.error
    # the shipped defaults (5 ms frontend, no per-iteration term) were further off
    assert max(abs(r.error["ttft_p50_ms"]) for r in result["before"]) > 0.01


def test_from_bench_writes_a_profile_that_carries_its_overheads_and_error(tmp_path):
    b = bench(tmp_path, 8.0, n=60)
    out = tmp_path / "mine.yaml"
    res = CliRunner().invoke(app, ["calibrate", "--from-bench", str(b), "--model", "llama-3-8b",
                                   "--gpu", "h100-sxm", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "fitted: " in res.output and "-> +0.0%" in res.output
    doc = yaml.safe_load(out.read_text())
    assert doc["model"]["engine_overheads"]["frontend_s"] == pytest.approx(0.008)
    assert doc["metadata"]["calibrated_on"] == [str(b)]
    band = doc["metadata"]["serving_error"]
    assert band["slower"] == band["faster"] == 1.0 and "in-sample" in band["basis"]
    # used as a profile: its own overheads, and its own error band
    sc = scenario_from_dict({"model": "llama-3-8b", "hardware": "h100-sxm", "cost_model": {"profile": str(out)},
                             "workload": {"trace": str(b), "format": "vllm_bench"}})
    assert sc.cost_model.overheads.frontend_s == pytest.approx(0.008)
    assert sc.cost_model.error_band() == band


def test_from_bench_refuses_what_it_cannot_use(tmp_path):
    runner = CliRunner()
    b = tmp_path / "b.json"
    b.write_text(json.dumps({"input_lens": [10], "output_lens": [5], "start_times": [0.0]}))
    res = runner.invoke(app, ["calibrate", "--from-bench", str(b), "--model", "llama-3-8b", "--gpu", "h100-sxm",
                              "--out", str(tmp_path / "p.yaml")])
    assert res.exit_code == 2 and "no measured" in res.output and not (tmp_path / "p.yaml").exists()
    res = runner.invoke(app, ["calibrate", "--from-bench", str(b), "--model", "llama-3-8b", "--gpu", "h100-sxm",
                              "--set", "workload.num_requests=3", "--out", str(tmp_path / "p.yaml")])
    assert res.exit_code == 2 and "only engine.KEY=VALUE" in res.output
