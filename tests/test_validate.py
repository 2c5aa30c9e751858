"""The CPU loop of issue 6: calibrate(tiny) -> fit -> simulate -> real engine -> compare, and the
`servesim validate` command's outputs and error paths."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from calibrate.harness import calibrate
from calibrate.validate import validate, write
from cli import app
from sim.config import load_scenario

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "validate-tiny-cpu.yaml"
runner = CliRunner()

# Thresholds for a shared, noisy 2-core CPU (load average 5-9 while these were chosen). Two
# effects move the real side away from the simulated one:
# - the profile's step times: the harness times shapes in a shuffled order, and the engine's
#   warm, similar consecutive steps ran at ~0.65-0.9x the profile's prediction on quiet stretches;
# - other processes stretch stretches of steps 1.5-3x even in CPU seconds (hyperthread and cache
#   sharing), and every request queued behind them waits longer: means and tails follow such
#   bursts, medians and throughput much less.
# Hence: throughput within 10% (at ~60% load the engine keeps up with the arrivals, so both sides
# finish at the arrival rate unless one falls behind or loses requests; measured 0-5%), and p50
# TPOT and p50 E2E within 50% (measured -49% .. +38% over 6 runs, most within 30%). If missed,
# the test calibrates again under the load as it is now and validates once more.
LIMITS = {("request_throughput", "per_s"): 10, ("output_throughput", "per_s"): 10,
          ("tpot_ms", "p50"): 50, ("e2e_ms", "p50"): 50}


@pytest.fixture(scope="module")
def profile(tmp_path_factory) -> Path:
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("profile") / "cpu-tiny.yaml"
    calibrate("tiny", "cpu", out, grid="small", repeats=5, warmup=2, log=lambda line: None)
    return out


def _misses(comparison: pd.DataFrame) -> list[str]:
    c = comparison.set_index(["metric", "stat"])
    return [f"{m} {s}: {c.loc[(m, s), 'error_pct']:+.1f}% (limit {lim}%)"
            for (m, s), lim in LIMITS.items() if not abs(c.loc[(m, s), "error_pct"]) <= lim]


def test_cpu_loop_real_engine_agrees_with_simulator(profile, tmp_path):
    """The bundled scenario end to end on the CPU. A burst of load from other processes can
    stretch the real run; if the limits are missed, calibrate and validate once more (both
    attempts are reported)."""
    torch.set_num_threads(1)
    sc = load_scenario(SCENARIO)
    v = validate(sc, profile, device="cpu")
    attempts = [_misses(v.comparison)]
    if attempts[0]:
        retry = tmp_path / "retry.yaml"
        calibrate("tiny", "cpu", retry, grid="small", repeats=5, warmup=2, log=lambda line: None)
        v = validate(sc, retry, device="cpu")
        attempts.append(_misses(v.comparison))
    write(v, tmp_path / "out")
    assert not attempts[-1], f"limits missed, per attempt: {attempts}"
    real, sim = v.real.requests, v.sim.requests
    assert list(real.columns) == list(sim.columns)
    assert real["finish_s"].notna().all() and len(real) == len(sim) == 48
    assert (real["arrival_s"] == sim["arrival_s"]).all()  # the same Workload on both sides
    assert (real["output_tokens"] == sim["output_tokens"]).all()
    for name in ("real/requests.csv", "real/steps.csv", "sim/requests.csv", "sim/steps.csv",
                 "sim/summary.json", "comparison.csv", "comparison.md", "comparison.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0, name
    table = pd.read_csv(tmp_path / "out" / "comparison.csv")
    assert list(table.columns) == ["metric", "stat", "real", "sim", "error_pct"]
    assert {"ttft_ms", "tpot_ms", "e2e_ms", "output_throughput"} <= set(table["metric"])


def test_cli_validate_writes_the_comparison(profile, tmp_path):
    out = tmp_path / "v"
    r = runner.invoke(app, ["validate", str(SCENARIO), "--profile", str(profile), "--device", "cpu",
                            "--out", str(out), "--set", "workload.num_requests=6"])
    assert r.exit_code == 0, r.output
    assert "ttft_ms" in r.output and "error" in r.output
    md = (out / "comparison.md").read_text()
    assert "| e2e_ms | mean |" in md and "clock cpu" in md
    assert len(pd.read_csv(out / "real" / "requests.csv")) == 6


@pytest.mark.parametrize("args, message", [
    (["--profile", "missing.yaml"], "missing.yaml"),
    (["--profile", "PROFILE", "--set", "engine.scheduler=static"], "not static"),
    (["--profile", "PROFILE", "--set", "engine.replicas=2"], "one replica"),
    (["--profile", "PROFILE", "--device", "tpu"], "allowed: cpu, cuda"),
    (["--profile", "PROFILE", "--clock", "sundial"], "allowed: wall, cpu"),
    (["--profile", "PROFILE", "--set", "engine.schedular=chunked"], "unknown key"),
    (["--profile", "PROFILE", "--set",
      "workload.arrival={process: closed_loop, users: 4, think_time: 0.1}"], "not a closed loop"),
])
def test_cli_errors_are_one_line_and_exit_2(profile, args, message):
    args = [str(profile) if a == "PROFILE" else a for a in args]
    r = runner.invoke(app, ["validate", str(SCENARIO), *args])
    assert r.exit_code == 2, r.output
    assert message in r.output and r.output.startswith("error: ") and r.output.count("\n") == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cli_cuda_without_cuda_is_an_error(profile):
    r = runner.invoke(app, ["validate", str(SCENARIO), "--profile", str(profile), "--device", "cuda"])
    assert r.exit_code == 2 and "CUDA is not available" in r.output


def test_cli_bad_scenario_and_help():
    r = runner.invoke(app, ["validate", "nope.yaml", "--profile", "p.yaml"])
    assert r.exit_code == 2 and r.output.startswith("error: ")
    r = runner.invoke(app, ["validate", "--help"])
    assert r.exit_code == 0 and "--profile" in r.output and "--device" in r.output
