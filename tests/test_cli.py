"""cli.py: `servesim run` end to end, its help, and its one-line errors (exit code 2)."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import typer
import yaml
from typer.testing import CliRunner

import cli
from cli import app
from sim.config import options
from sim.config.errors import ScenarioError
from sim.reporting.progress import Progress, clock
from simhelpers import assert_one_line_error

REPO = Path(__file__).parents[1]
SCENARIOS = REPO / "scenarios"
OUTPUTS = ("requests.csv", "scenario.yaml", "steps.csv", "summary.json")
REQUEST_COLUMNS = ["request_id", "arrival_s", "prompt_tokens", "output_tokens", "first_token_s",
                   "finish_s", "ttft_s", "tpot_s", "e2el_s", "e2e_s", "queue_s", "preemptions", "replica"]
STEP_COLUMNS = ["replica", "start_s", "duration_s", "count", "num_seqs", "prefill_tokens",
                "decode_tokens", "padded_tokens", "kv_blocks_used", "kv_blocks_total", "waiting"]
runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def small_scenario(tmp_path: Path, **changes) -> Path:
    raw = yaml.safe_load((SCENARIOS / "quickstart.yaml").read_text())
    raw["workload"]["num_requests"] = 20
    raw.update(changes)
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


# ---------------------------------------------------------------- help

def test_help():
    result = invoke("--help")
    assert result.exit_code == 0
    assert "run" in result.output and "simulator" in result.output


@pytest.mark.parametrize("command", ["run", "sweep", "plan", "capacity", "plot", "calibrate", "validate"])
def test_help_gives_each_command_a_one_line_summary(command):
    lines = invoke("--help").output.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(f"│ {command} "))
    assert lines[at].rstrip(" │").endswith(".")  # the whole summary fits on the command's line
    assert not lines[at + 1].startswith("│   ")  # no continuation line
    assert invoke(command, "--help").exit_code == 0


COMMANDS = ["run", "sweep", "compare", "report", "export", "plan", "capacity", "plot", "calibrate", "validate"]


@pytest.mark.parametrize("command", [[], *([c] for c in COMMANDS)], ids=["servesim", *COMMANDS])
def test_help_reads_at_80_columns_without_type_labels(command):
    """No line past 80 columns; a flag shows no `<bool>`, a value option its metavar or click's
    word for its type (typer 0.29 prints `<bool>`, `<str>`, `<int>` otherwise)."""
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert not any(label in result.output for label in ("<bool>", "<str>", "<int>", "<float>"))
    quiet = next((line for line in lines if "--quiet" in line), None)
    if quiet is not None:
        assert quiet.split("--quiet")[1].split()[:2] in (["-q", "Print"], ["Print", "only"])


def test_shell_completion_completes_commands_and_options():
    env = {**os.environ, "_SERVESIM_COMPLETE": "complete_bash", "COMP_WORDS": "servesim ru", "COMP_CWORD": "1"}
    code = "import sys; from cli import main_entry; sys.argv = ['servesim']; main_entry()"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.split() == ["run"], done.stderr
    env |= {"COMP_WORDS": "servesim plan --target-r", "COMP_CWORD": "2"}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.stdout.split() == ["--target-rate"], done.stderr


def test_run_help():
    result = invoke("run", "--help")
    assert result.exit_code == 0
    for option in ("--out", "--seed", "--set", "--quiet", "runs/<scenario name>"):
        assert option in result.output


def test_importing_the_cli_is_light():
    # `servesim --help` must stay fast: sim/, numpy and pandas load only inside commands.
    code = "import cli, sys; print(sorted(m for m in ('sim', 'numpy', 'pandas', 'simpy', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_console_script_is_declared():
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["servesim"] == "cli:main_entry"  # the app, with signals and usage errors in one line


# ---------------------------------------------------------------- successful runs

def test_run_quickstart_writes_the_three_files(tmp_path):
    out = tmp_path / "out"
    result = invoke("run", SCENARIOS / "quickstart.yaml", "--out", out)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUTS)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["completed"] == 300
    # (+ each request's own frontend time and engine pauses: the default overheads spread them,
    # sim/cost/overheads.py)
    assert list(pd.read_csv(out / "requests.csv").columns) == REQUEST_COLUMNS + ["engine_finish_s", "frontend_s", "stall_s"]
    assert list(pd.read_csv(out / "steps.csv").columns) == STEP_COLUMNS
    assert len(pd.read_csv(out / "requests.csv")) == 300
    for text in ("completed requests", "TTFT", "TPOT", "ITL", "E2E", "slot utilisation",
                 "goodput", str(out)):
        assert text in result.output


def test_toy_static_matches_the_textbook(tmp_path):
    result = invoke("run", SCENARIOS / "toy-static-8.yaml", "--out", tmp_path, "--quiet")
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["iterations"] == 573
    assert summary["slot_utilization"] == pytest.approx(3274 / (8 * 573))  # 71.4%


def test_quiet_prints_only_the_output_dir(tmp_path):
    result = invoke("run", small_scenario(tmp_path), "--out", tmp_path / "o", "-q")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(tmp_path / "o")


def test_default_out_is_runs_slash_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = invoke("run", SCENARIOS / "toy-continuous-8.yaml", "-q")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "runs" / "toy-continuous-8" / "summary.json").is_file()


def test_seed_and_set_reach_the_simulation(tmp_path):
    path = small_scenario(tmp_path)
    runs = {}
    for label, extra in (("a", ()), ("b", ("--seed", "1")), ("c", ("--set", "workload.num_requests=7"))):
        assert invoke("run", path, "--out", tmp_path / label, "-q", *extra).exit_code == 0
        runs[label] = pd.read_csv(tmp_path / label / "requests.csv")
    assert len(runs["a"]) == 20 and len(runs["c"]) == 7
    assert not runs["a"]["prompt_tokens"].equals(runs["b"]["prompt_tokens"])


def test_progress_bar_waits_for_its_delay_then_counts():
    late = Progress("simulating", "requests", after_s=3600.0, terminal=True)
    with late:
        late(3, 10)
        assert late.bar is None  # a short job prints nothing
    with Progress("simulating", "requests", terminal=True) as progress:
        progress(3, 10)
        assert progress.bar is not None
        assert progress.bar.tasks[0].completed == 3 and progress.bar.tasks[0].total == 10
    quiet = Progress("simulating", "requests", enabled=False)
    quiet(3, 10)
    assert quiet.bar is None


def test_progress_without_a_total_counts_and_times():
    with Progress("planning", "simulations", terminal=True) as progress:
        progress(5)
        task = progress.bar.tasks[0]
        assert task.completed == 5 and task.total is None


def test_progress_without_a_terminal_is_lines_with_done_total_and_eta(capsys):
    """In a log or a pipe: nothing for the first 2 s, then a line at each new phase and at most every
    30 s within one, with done/total, the elapsed time and the ETA at the pace so far."""
    p = Progress("planning", "simulations", terminal=False)
    with p:
        p(1, 10, "load search")
        assert capsys.readouterr().err == ""  # (a short command says nothing)
        p.start -= 40.0  # 40 s in
        p(4, 10, "load search")
        p(5, 10, "load search")  # the same phase within 30 s: no line
        p(6, 12, "engine settings")
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "planning: load search: 4/10 simulations, 40 s elapsed, ETA 1 min 00 s"
    assert lines[1].startswith("planning: engine settings: 6/12 simulations, 40 s elapsed, ETA 40 s")
    assert len(lines) == 2
    assert clock(3725) == "1 h 02 min" and clock(59.6) == "1 min 00 s"


# ---------------------------------------------------------------- errors: one line, exit 2, no output

def test_missing_scenario(tmp_path):
    assert_one_line_error(invoke("run", tmp_path / "nope.yaml", "--out", tmp_path / "o"),
                          "nope.yaml: no such file")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("text,expected", [
    ("", "empty file"),
    ("model: [llama\n", "line 2: invalid YAML"),
    ("- 1\n", "top level is a list"),
])
def test_bad_yaml(tmp_path, text, expected):
    (tmp_path / "bad.yaml").write_text(text)
    assert_one_line_error(invoke("run", tmp_path / "bad.yaml", "--out", tmp_path / "o"),
                          "bad.yaml", expected)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("args,expected", [
    (("--set", "engine.scheduler=fifo"), ("--set engine.scheduler: 'fifo' is not one of static, "
                                         "continuous, chunked")),
    (("--set", "engine.nope=1"), "--set engine.nope: unknown key; allowed: scheduler"),
    (("--set", "engine.max_num_seqs"), "--set engine.max_num_seqs: expected KEY=VALUE"),
    (("--set", "model=llama-3-70b"), "--set model: llama-3-70b needs 141.1 GB"),
    (("--seed", "-1"), "--seed: -1 is not an integer >= 0"),
])
def test_bad_options(tmp_path, args, expected):
    out = tmp_path / "o"
    assert_one_line_error(invoke("run", small_scenario(tmp_path), "--out", out, *args), expected)
    assert not out.exists()


def test_bad_key_in_the_file(tmp_path):
    path = small_scenario(tmp_path, engine={"scheduler": "fifo"})
    assert_one_line_error(invoke("run", path, "--out", tmp_path / "o"),
                          "small.yaml: engine.scheduler: 'fifo' is not one of static, continuous, chunked")


def test_out_is_a_file(tmp_path):
    (tmp_path / "file").write_text("x")
    assert_one_line_error(invoke("run", small_scenario(tmp_path), "--out", tmp_path / "file"),
                          "is not a directory")


def test_out_under_a_file_is_refused_before_simulating(tmp_path, monkeypatch):
    # It used to simulate first and then fail with exit code 1, "Not a directory".
    (tmp_path / "file").write_text("x")
    monkeypatch.setattr("sim.simulate.simulate", lambda *a, **k: pytest.fail("simulated"))
    out = tmp_path / "file" / "run"
    assert_one_line_error(invoke("run", small_scenario(tmp_path), "--out", out),
                          f"--out {out}: {tmp_path / 'file'} exists and is not a directory")


def test_malformed_trace_row(tmp_path):
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,16,4\n1,lots,4\n")
    path = small_scenario(tmp_path, workload={"trace": "t.csv"})
    out = tmp_path / "o"
    assert_one_line_error(invoke("run", path, "--out", out), "t.csv:3:", "prompt_tokens")
    assert not out.exists()


def test_failed_run_leaves_nothing_that_looks_finished(tmp_path):
    # Fails inside the simulation (a request larger than the KV cache), after loading succeeded.
    path = small_scenario(tmp_path, engine={"scheduler": "chunked", "num_gpu_blocks": 2})
    out = tmp_path / "o"
    assert_one_line_error(invoke("run", path, "--out", out), "KV")
    assert not any((out / name).exists() for name in OUTPUTS)


def test_version_and_output_file_modes(tmp_path):
    """--version prints the package version and how the simulator runs; run files get open()'s mode
    (umask), not mkstemp's 0600."""
    import os

    import sim
    from sim.version import __version__

    r = runner.invoke(app, ["--version"])
    mode = "compiled" if sim.compiled() else "pure Python"
    assert r.exit_code == 0 and r.stdout.strip() == f"servesim {__version__} ({mode})"
    out = tmp_path / "out"
    assert runner.invoke(app, ["run", str(SCENARIOS / "toy-continuous-8.yaml"), "--out", str(out), "-q"]).exit_code == 0
    umask = os.umask(0)
    os.umask(umask)
    for f in out.iterdir():
        assert f.stat().st_mode & 0o777 == 0o666 & ~umask, f


# ---------------------------------------------------------------- options declared by requests

@dataclasses.dataclass(frozen=True)
class _Toy:
    """A request as a command's module writes one (sim/config/options.py)."""
    path: Path = dataclasses.field(metadata=options.argument("A file."))
    rate: float = dataclasses.field(default=2.5, metadata=options.option("Requests/s.", metavar="R"))
    overrides: tuple[str, ...] = dataclasses.field(default=(), metadata=options.option("A key.", "--set"))
    loud: bool = dataclasses.field(default=False, metadata=options.option("Say more.", "--loud", "-l"))
    hidden: int = 7  # no metadata: not on the command line


_TOLD: list = []


def _toy_job(request: _Toy) -> None:
    _TOLD.append(request)
    if request.rate < 0:
        raise ScenarioError("--rate: below 0")


def test_a_command_is_declared_by_its_requests_fields():
    """cli.py turns a request's fields into typer's options: the field's name, type and default, the
    spelling from its metadata; a call fills the request (a repeated option as a tuple) and a
    ScenarioError from the job is one line, exit 2."""
    toy = typer.Typer()
    toy.command("toy")(cli._Declared(f"{__name__}:_Toy", f"{__name__}:_toy_job", "toy", "A toy command."))
    _TOLD.clear()
    ok = CliRunner().invoke(toy, ["f.txt", "--set", "a=1", "--set", "b=2", "-l"])
    assert ok.exit_code == 0, ok.output
    assert _TOLD == [_Toy(Path("f.txt"), 2.5, ("a=1", "b=2"), True)]
    CliRunner().invoke(toy, ["g", "--rate", "4"])
    assert _TOLD[-1] == _Toy(Path("g"), 4.0, (), False)  # (no --set: the field's empty tuple)
    bad = CliRunner().invoke(toy, ["g", "--rate", "-1"])
    assert bad.exit_code == 2 and bad.output.strip() == "error: --rate: below 0"
    assert "--hidden" not in CliRunner().invoke(toy, ["--help"]).output
    assert CliRunner().invoke(toy, ["g", "--rate", "x"]).exit_code == 2  # (click's own type check)


def test_every_command_option_is_a_field_of_its_request():
    """The real commands: plan's options are PlanRequest's fields, with their help and defaults (a
    default written once, in the request)."""
    import typer.main

    from sim.planning.plan_options import PlanRequest

    params = {p.name: p for p in typer.main.get_command(app).commands["plan"].params}
    fields = options.declared(PlanRequest)
    assert sorted(params) == sorted(f.name for f, _ in fields)
    for f, o in fields:
        assert params[f.name].help == o.help
        if f.default is not dataclasses.MISSING and not isinstance(f.default, tuple):
            assert params[f.name].default == f.default, f.name
