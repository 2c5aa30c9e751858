"""The step contract (sim/schedulers/step.py) and the plug-in registries: a scheduler added as one file plus
one dict line runs through `servesim run`; schedules are frozen and name every request computed."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from cli import app
from sim.schedulers import SCHEDULERS
from sim.schedulers.step import Schedule
from sim.simulate import simulate
from simhelpers import make_scenario, make_workload
from toy_scheduler import OneAtATime


def test_a_scheduler_is_one_file_plus_one_dict_line(tmp_path, monkeypatch):
    """Requests A (prompt 4, output 3) and B (prompt 2, output 2) arrive at 0 and 0.5; unit cost.
    One at a time: A prefills [0,1] (first token 1), decodes [1,3] (finish 3); B prefills [3,4]
    (first token 4) and decodes [4,5] (finish 5)."""
    monkeypatch.setitem(SCHEDULERS, "one_at_a_time", OneAtATime)  # the one dict line
    trace = tmp_path / "two.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,4,3\n0.5,2,2\n")
    scenario = tmp_path / "toy.yaml"
    scenario.write_text(yaml.safe_dump({
        "model": "llama-3-8b", "hardware": "h100-sxm", "cost_model": "unit",
        "engine": {"scheduler": "one_at_a_time"}, "workload": {"trace": str(trace)}}))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["run", str(scenario), "--out", str(out), "-q"])
    assert result.exit_code == 0, result.output
    rq = pd.read_csv(out / "requests.csv")
    assert rq["first_token_s"].tolist() == [1.0, 4.0]
    assert rq["finish_s"].tolist() == [3.0, 5.0]
    steps = pd.read_csv(out / "steps.csv")
    assert steps[["start_s", "count", "prefill_tokens", "decode_tokens"]].values.tolist() == [
        [0, 1, 4, 0], [1, 2, 0, 1], [3, 1, 2, 0], [4, 1, 0, 1]]
    assert "one_at_a_time" in CliRunner().invoke(app, ["--help"]).output


def test_an_unregistered_scheduler_is_refused_with_the_registry_names(tmp_path):
    sc = tmp_path / "bad.yaml"
    sc.write_text(yaml.safe_dump({"model": "llama-3-8b", "hardware": "h100-sxm",
                                  "engine": {"scheduler": "one_at_a_time"},
                                  "workload": {"trace": "x.csv"}}))
    result = CliRunner().invoke(app, ["run", str(sc)])
    assert result.exit_code == 2
    assert "engine.scheduler: 'one_at_a_time' is not one of static, continuous, chunked" in result.output


class Spy:
    """Wraps a scheduler; keeps every schedule handed out, and a deep copy taken at hand-over."""

    def __init__(self, inner):
        self.inner, self.seen = inner, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def schedule(self, now):
        s = self.inner.schedule(now)
        if s is not None:
            self.seen.append((s, s.decode_ids.copy(), s.prefill_ids.copy(), dict(s.num_scheduled_tokens)))
        return s


@pytest.mark.parametrize("scheduler", ["static", "continuous", "chunked"])
def test_schedules_are_frozen_and_name_every_request_computed(scheduler, monkeypatch):
    """A schedule never changes after the hand-over (its arrays are read-only and keep their
    contents), and over a run the tokens it names add up to every request's prompt + output - 1
    (no preemption here) computed by each request, and decodes to output - 1 per request."""
    spies = []
    import sim.build as build_mod
    real_build = build_mod.build_scheduler

    def build(*args, **kwargs):
        spies.append(Spy(real_build(*args, **kwargs)))
        return spies[-1]
    monkeypatch.setattr(build_mod, "build_scheduler", build)
    rng = np.random.default_rng(1)
    n = 40
    w = make_workload(np.sort(rng.uniform(0, 20, n)), rng.integers(1, 300, n), rng.integers(1, 60, n))
    sc = make_scenario(scheduler=scheduler, max_num_seqs=8, max_num_batched_tokens=512)
    r = simulate(sc, workload=w)
    assert r.summary["completed"] == n and r.summary["preemptions"] == 0
    decoded, prefilled, padding = np.zeros(n, np.int64), np.zeros(n, np.int64), 0
    steps = r.steps["count"].to_numpy()
    assert len(spies[0].seen) == len(steps)  # one schedule per row of steps.csv
    for (s, decodes, prefills, scheduled), count in zip(spies[0].seen, steps):
        assert isinstance(s, Schedule)
        with pytest.raises(AttributeError):
            s.max_steps = 2  # type: ignore[misc]
        assert not s.decode_ids.flags.writeable and np.array_equal(s.decode_ids, decodes)
        assert np.array_equal(s.prefill_ids, prefills) and s.num_scheduled_tokens == scheduled
        assert len(decodes) == s.decode_tokens
        np.add.at(decoded, decodes, count)  # a run decodes each of them `count` times
        np.add.at(prefilled, prefills, [scheduled[r] for r in prefills.tolist()])
        if len(prefills):
            padding += s.stats.padded_tokens
    assert (decoded == w.output_tokens - 1).all()
    # static batching computes each prompt padded to its batch's longest; the others, exactly it
    assert (prefilled >= w.prompt_tokens).all()
    assert prefilled.sum() - w.prompt_tokens.sum() == padding
    assert (padding > 0) == (scheduler == "static")


def test_a_run_folder_reproduces_itself(tmp_path, monkeypatch):
    """scenario.yaml in a run folder (presets expanded, --set applied, trace path absolute)
    re-runs to byte-identical requests.csv and steps.csv from another working directory, and
    summary.json records the engine settings, seed, overrides, cost model and version."""
    import json
    from pathlib import Path

    from sim.version import __version__

    root = Path(__file__).resolve().parents[2]
    first = tmp_path / "first"
    args = ["run", str(root / "scenarios/azure-conv-replay.yaml"), "--out", str(first), "-q",
            "--seed", "5", "--set", "engine.max_num_seqs=24", "--set", "workload.num_requests=40"]
    assert CliRunner().invoke(app, args).exit_code == 0
    monkeypatch.chdir(tmp_path)  # relative paths in the original scenario would now break
    second = tmp_path / "second"
    result = CliRunner().invoke(app, ["run", str(first / "scenario.yaml"), "--out", str(second), "-q"])
    assert result.exit_code == 0, result.output
    for name in ("requests.csv", "steps.csv"):
        assert (first / name).read_bytes() == (second / name).read_bytes()
    run = json.loads((first / "summary.json").read_text())["run"]
    assert run["seed"] == 5 and run["engine"]["max_num_seqs"] == 24
    assert run["overrides"] == ["engine.max_num_seqs=24", "workload.num_requests=40"]
    assert run["cost_model"]["name"] == "measured" and run["cost_model"]["measured"] is True  # (the default)
    assert run["servesim_version"] == __version__


def test_a_run_folder_with_a_rate_profile_file_reproduces_itself_from_elsewhere(tmp_path, monkeypatch):
    """A rate profile given as a CSV relative to its scenario (`rates: rates.csv`) is written into
    the run's scenario.yaml as an absolute path: rerun from another folder, with a rates.csv of
    other rates beside the run's scenario.yaml and in the working folder (what a relative path
    would read), the run reads the original file and repeats byte for byte."""
    from pathlib import Path

    src = tmp_path / "src"
    src.mkdir()
    (src / "rates.csv").write_text("start_s,rate\n0,2\n10,4\n")
    (src / "s.yaml").write_text(
        "name: rp\nmodel: llama-3-8b\nhardware: h100-sxm\ncost_model: unit\nengine: {scheduler: chunked}\n"
        "workload:\n  arrival: {process: profile, rates: rates.csv}\n  num_requests: 30\n"
        "  prompt_tokens: {dist: fixed, value: 10}\n  output_tokens: {dist: fixed, value: 5}\n")
    first = tmp_path / "first"
    assert CliRunner().invoke(app, ["run", str(src / "s.yaml"), "--out", str(first), "-q"]).exit_code == 0
    import yaml
    written = yaml.safe_load((first / "scenario.yaml").read_text())["workload"]["arrival"]["rates"]
    assert Path(written) == (src / "rates.csv").resolve()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for decoy in (elsewhere, first):  # what a relative path would read
        (decoy / "rates.csv").write_text("start_s,rate\n0,50\n")
    monkeypatch.chdir(elsewhere)
    second = tmp_path / "second"
    result = CliRunner().invoke(app, ["run", str(first / "scenario.yaml"), "--out", str(second), "-q"])
    assert result.exit_code == 0, result.output
    assert (first / "requests.csv").read_bytes() == (second / "requests.csv").read_bytes()
