"""The CPU loop of issue 6: calibrate(tiny) -> fit -> simulate -> real engine -> compare, and the
`servesim validate` command's outputs and error paths."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from typer.testing import CliRunner

from calibrate.comparison import saturation_warning
from calibrate.harness import calibrate
from calibrate.validate import REAL_FILES, validate, write
from cli import app
from sim.config.errors import ScenarioError
from sim.reporting.analysis import load_run
from sim.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]
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
          ("tpot_ms", "p50"): 50, ("e2el_ms", "p50"): 50}
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
    drifted = 0
    while not STEADY_STEP_RATIO[0] <= v.step_ratio <= STEADY_STEP_RATIO[1] and drifted < 2:
        # the shared machine's speed changed since calibrating: measure both again (twice at most)
        drifted += 1
        v = validate(sc, _calibrate(tmp_path / f"again{drifted}.yaml"), device="cpu")
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
    assert list(table.columns) == ["metric", "stat", "real", "sim", "error_pct", "tolerance_pct", "within"]
    assert {"ttft_ms", "tpot_ms", "e2el_ms", "output_throughput"} <= set(table["metric"])


def verdict_code(folder: Path) -> int:
    """The exit code validate owes for the comparison it wrote: 1 when a judged row missed."""
    return int((pd.read_csv(folder / "comparison.csv")["within"] == False).any())  # noqa: E712


def test_cli_validate_writes_the_comparison(profile, tmp_path):
    out = tmp_path / "v"
    r = runner.invoke(app, ["validate", str(SCENARIO), "--profile", str(profile), "--device", "cpu",
                            "--out", str(out), "--set", "workload.num_requests=6"])
    # exit 1 exactly when a judged row misses its tolerance (6 requests on a shared CPU: either may
    # happen), said on the last line; the files are written either way
    table = pd.read_csv(out / "comparison.csv")
    missed = table[table["within"] == False]  # noqa: E712  (empty: not judged)
    assert r.exit_code == (1 if len(missed) else 0), r.output
    if len(missed):
        last = r.stderr.strip().splitlines()[-1]
        assert last.startswith(f"error: verdict: {len(missed)} of {int(table['tolerance_pct'].notna().sum())} "
                               "judged rows outside tolerance: ")
        assert all(f"{m} {st} " in last for m, st in zip(missed["metric"], missed["stat"]))
    assert "ttft_ms" in r.output and "error" in r.output
    md = (out / "comparison.md").read_text()
    assert "| e2el_ms | mean |" in md and "clock cpu" in md
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


def _profile_for(profile: Path, tmp_path: Path, **meta) -> Path:
    doc = yaml.safe_load(profile.read_text())
    doc["metadata"].update(meta)
    out = tmp_path / "edited.yaml"
    out.write_text(yaml.safe_dump(doc))
    return out


def _one_error_line(r, *fragments: str) -> None:
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error: ") and r.output.count("\n") == 1, r.output
    for fragment in fragments:
        assert fragment in r.output, r.output


def test_cli_refuses_a_profile_of_another_model(profile, tmp_path):
    """A profile fitted for another model prices every step wrong: an error, not a footnote."""
    other = _profile_for(profile, tmp_path, model="llama-3-8b")
    r = runner.invoke(app, ["validate", str(SCENARIO), "--profile", str(other), "--out",
                            str(tmp_path / "v")])
    _one_error_line(r, "--profile", "metadata.model is 'llama-3-8b'", "'tiny'")
    assert not (tmp_path / "v").exists()


def test_cli_checks_out_and_memory_before_running(profile, tmp_path):
    """An unwritable --out, or a model whose float32 weights a CPU cannot hold, is refused in
    a second, before the real engine allocates or runs anything (it used to fail after the whole
    run, exit 1, or be killed for memory)."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = runner.invoke(app, ["validate", str(SCENARIO), "--profile", str(profile),
                            "--out", str(blocker / "v")])
    _one_error_line(r, "--out", "cannot write there")
    big = _profile_for(profile, tmp_path, model="llama-3-8b")
    r = runner.invoke(app, ["validate", str(SCENARIO), "--profile", str(big), "--set",
                            "model=llama-3-8b", "--out", str(tmp_path / "v")])
    _one_error_line(r, "model: llama-3-8b has 32.1 GB of weights in float32")
    assert not (tmp_path / "v" / "real").exists()


def test_cli_closed_loop_error_names_the_file(profile):
    r = runner.invoke(app, ["validate", str(SCENARIO), "--profile", str(profile), "--set",
                            "workload.arrival={process: closed_loop, users: 4, think_time: 0.1}"])
    _one_error_line(r, f"{SCENARIO}: workload.arrival:", "not a closed loop")


BLOCK_SIMPY = "import sys; sys.modules['simpy'] = None; "  # as on the GPU machine: no simpy


def _cli_without_simpy(*args: str) -> subprocess.CompletedProcess:
    code = BLOCK_SIMPY + f"sys.argv = ['servesim', *{list(args)!r}]; import cli; cli.app()"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          check=False, timeout=300)


def test_real_only_without_simpy_then_compare_only(profile, tmp_path):
    """The GPU split: --real-only runs where simpy is missing and writes real/ (plottable, with
    the requests it replayed); --compare-only later simulates those very requests and compares.
    A full validate without simpy says to split, in one line, before running anything."""
    out, few = tmp_path / "gpu", ["--set", "workload.num_requests=6"]
    r = _cli_without_simpy("validate", str(SCENARIO), "--real-only", "--out", str(out), *few)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (out / "real").iterdir()) == sorted(REAL_FILES)
    assert not (out / "sim").exists() and "--compare-only" in r.stdout
    meta = json.loads((out / "real" / "run.json").read_text())
    assert meta["complete"] and meta["device"] == "cpu" and meta["profile"] is None
    assert meta["iterations"] == len(pd.read_csv(out / "real" / "steps.csv"))
    run = load_run(out / "real")  # what `servesim plot` reads
    assert run.summary["completed"] == 6 and run.summary["mfu"] is None

    r = _cli_without_simpy("validate", str(SCENARIO), "--profile", str(profile), "--out",
                           str(tmp_path / "full"), *few)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "needs simpy" in r.stderr and "--real-only" in r.stderr
    assert not (tmp_path / "full" / "real").exists()

    here = tmp_path / "laptop"
    r = runner.invoke(app, ["validate", str(SCENARIO), "--profile", str(profile),
                            "--compare-only", str(out), "--out", str(here), *few])
    assert r.exit_code == verdict_code(here), r.output
    for name in ("comparison.md", "comparison.csv", "comparison.png", "sim/summary.json",
                 *(f"real/{f}" for f in REAL_FILES)):
        assert (here / name).stat().st_size > 0, name
    real, sim = pd.read_csv(here / "real" / "requests.csv"), pd.read_csv(here / "sim" / "requests.csv")
    pd.testing.assert_frame_equal(real, pd.read_csv(out / "real" / "requests.csv"))
    assert (real["arrival_s"] == sim["arrival_s"]).all()
    assert (real["prompt_tokens"] == sim["prompt_tokens"]).all()
    table = pd.read_csv(here / "comparison.csv").set_index(["metric", "stat"])
    assert table.loc[("e2el_ms", "p50"), "real"] == pytest.approx(real["e2el_s"].median() * 1e3, rel=1e-5)
    md = (here / "comparison.md").read_text()
    assert f"read from {out / 'real'}" in md and "step time / profile prediction" in md

    # the scenario must be the one the real run used
    r = runner.invoke(app, ["validate", str(SCENARIO), "--profile", str(profile), "--compare-only",
                            str(out), "--out", str(tmp_path / "x"), *few,
                            "--set", "engine.max_num_seqs=8"])
    _one_error_line(r, "engine.max_num_seqs 16", "gives 8")
    (out / "real" / "run.json").unlink()  # an interrupted real run is not compared
    r = runner.invoke(app, ["validate", str(SCENARIO), "--profile", str(profile), "--compare-only",
                            str(out), "--out", str(tmp_path / "y"), *few])
    _one_error_line(r, "run.json is missing")


@pytest.mark.parametrize("args, message", [
    (["--real-only", "--compare-only", "somewhere"], "give one of them"),
    (["--compare-only", "somewhere", "--device", "cpu", "--profile", "p.yaml"], "not used with"),
    ([], "--profile FILE is required"),
])
def test_cli_split_option_errors(args, message):
    r = runner.invoke(app, ["validate", str(SCENARIO), *args])
    _one_error_line(r, message)


def test_gpu_scenario_fits_an_h100_and_a_too_large_cache_is_refused(monkeypatch):
    """scenarios/validate-llama3-8b-h100.yaml on an 80 GB H100 (about 79 GB free at start): its
    16384 blocks (34.4 GB of bf16 KV) + 16.1 GB of weights + the 6 GiB reserve fit; on a 40 GB
    card the check names the largest num_gpu_blocks that would (free memory is mocked: no GPU)."""
    from calibrate.validate import check_memory

    sc = load_scenario(ROOT / "scenarios" / "validate-llama3-8b-h100.yaml")
    assert sc.model.name == "llama-3-8b" and sc.engine.num_gpu_blocks == 16384
    assert sc.engine.scheduler == "chunked" and sc.workload.num_requests >= 200
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (79e9, 85e9))
    check_memory(sc, "cuda", torch.bfloat16)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (40e9, 42e9))
    with pytest.raises(ScenarioError, match=r"engine.num_gpu_blocks: 16384 blocks .* set "
                                            r"engine.num_gpu_blocks <= 8343$"):
        check_memory(sc, "cuda", torch.bfloat16)


# ---------------------------------------------------------------- saturation

def _requests(arrival, finish, queue=None) -> pd.DataFrame:
    arrival, finish = np.asarray(arrival, float), np.asarray(finish, float)
    return pd.DataFrame({"arrival_s": arrival, "finish_s": finish,
                         "queue_s": np.zeros(len(arrival)) if queue is None else np.asarray(queue, float)})


def test_a_real_run_that_kept_up_is_not_called_saturated():
    arrival = np.arange(10.0)  # 1 req/s offered: (10 - 1) / 9 s
    assert saturation_warning(_requests(arrival, arrival + 0.1)) is None  # 10 / 9.1 s served
    assert saturation_warning(_requests(np.zeros(10), np.arange(1.0, 11.0))) is None  # a burst: queued by design


def test_a_real_run_whose_queue_grew_is_called_saturated_with_its_rates():
    arrival = np.arange(10.0)
    finish = 5.0 * np.arange(1.0, 11.0)  # one every 5 s: 10 / 50 s = 0.2 req/s served of 1 offered
    queue = finish - 5.0 - arrival
    said = saturation_warning(_requests(arrival, finish, queue))
    assert said == ("warning: the real engine ran saturated: it served 0.2 req/s of the 1 req/s offered, median "
                    f"queue {np.median(queue):.3g} s; its latencies measure a growing queue, not steady serving "
                    "(a lower workload.arrival.rate validates that)")
    # at the edge: 90% of the offered rate served is not saturated, just under it is
    assert saturation_warning(_requests(arrival, arrival * 0 + 10 / 0.9 * 1.0001)) is not None
    assert saturation_warning(_requests(arrival, arrival * 0 + 10 / 0.9 * 0.9999)) is None
