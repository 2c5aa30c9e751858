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

# Thresholds for a shared, noisy 2-core CPU (numbers: docs/validation.md, "CPU results"). The
# profile times each shape in bursts and fits the steps after the first (calibrate/timing.py), so
# the real engine's steps run at 0.83-1.03x the profile's prediction (median over its own batches)
# when the machine's load holds between calibrating and validating; the old one-step-per-visit
# timing gave 0.64-0.86x. Over 30 runs, the 24 with that ratio within 0.75-1.2 had throughput
# within 0-5%, p50 TPOT -39% .. +11% and p50 E2E -42% .. +9% (the simulator leaves out the
# engine's own ~0.05 ms per iteration and its slow tail of steps; queueing amplifies both).
# Limits: throughput 10% (both sides keep up with the arrivals at ~60% load; a lost request or an
# engine falling behind misses by far more), p50 TPOT and E2E 50%.
# In the other 6 runs neighbours changed the machine's speed in between (steps at 1.21-1.91x or
# 0.66-0.68x the profile calibrated seconds before; p50 errors 31-64%): the comparison then
# measures the neighbours, not the code. Such a run is recognised by its step ratio, never by its
# latencies, and calibrated and validated once more; the judged run must meet both.
LIMITS = {("request_throughput", "per_s"): 10, ("output_throughput", "per_s"): 10,
          ("tpot_ms", "p50"): 50, ("e2e_ms", "p50"): 50}
STEADY_STEP_RATIO = (0.75, 1.2)


def _calibrate(out: Path) -> Path:
    calibrate("tiny", "cpu", out, grid="small", repeats=8, burst=3, warmup=2, log=lambda line: None)
    return out


@pytest.fixture(scope="module")
def profile(tmp_path_factory) -> Path:
    torch.set_num_threads(1)
    return _calibrate(tmp_path_factory.mktemp("profile") / "cpu-tiny.yaml")


def test_cpu_loop_real_engine_agrees_with_simulator(profile, tmp_path):
    """The bundled scenario end to end on the CPU, with a profile calibrated just before."""
    torch.set_num_threads(1)
    sc = load_scenario(SCENARIO)
    v = validate(sc, profile, device="cpu")
    drifted = not STEADY_STEP_RATIO[0] <= v.step_ratio <= STEADY_STEP_RATIO[1]
    if drifted:  # the machine's speed changed since calibrating: measure both again
        v = validate(sc, _calibrate(tmp_path / "again.yaml"), device="cpu")
    write(v, tmp_path / "out")
    c = v.comparison.set_index(["metric", "stat"])["error_pct"]
    misses = [f"{m} {s}: {c[(m, s)]:+.1f}% (limit {lim}%)" for (m, s), lim in LIMITS.items()
              if not abs(c[(m, s)]) <= lim]
    steady = STEADY_STEP_RATIO[0] <= v.step_ratio <= STEADY_STEP_RATIO[1]
    assert steady and not misses, (misses, v.step_ratio, f"recalibrated: {drifted}", v.notes)
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
