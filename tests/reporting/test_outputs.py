"""sim/outputs.py: a run folder servesim wrote, then damaged (a line cut short, a hand edit,
a strict-JSON rule broken), is one error naming the file, the line or key; the commands that read a
folder back (report, plot, export, compare) say it in one line with exit 2. Each case below was a
traceback, or a silent wrong answer, before the reader."""
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app
from sim.config.errors import ScenarioError
from sim.reporting.analysis import load_run

ROOT = Path(__file__).resolve().parents[2]


def _written_run(tmp_path_factory, name: str, scenario: str, requests: int) -> Path:
    """A run folder as `servesim run` writes it, of a bundled scenario cut to `requests`."""
    out = tmp_path_factory.mktemp("outputs") / name
    result = CliRunner().invoke(app, ["run", str(ROOT / "scenarios" / scenario), "-o", str(out), "-q",
                                      "--set", f"workload.num_requests={requests}"])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return _written_run(tmp_path_factory, "run", "quickstart.yaml", 30)


def _copy(run_dir: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "damaged"
    shutil.copytree(run_dir, folder)
    return folder


def _cell(folder: Path, file: str, column: str, value: str, line: int = 2) -> None:
    """Set one cell (line 1 is the header)."""
    lines = (folder / file).read_text().split("\n")
    header = lines[0].split(",")
    row = lines[line - 1].split(",")
    row[header.index(column)] = value
    lines[line - 1] = ",".join(row)
    (folder / file).write_text("\n".join(lines))


CELLS = [  # file, column, value written, what the error says
    ("requests.csv", "arrival_s", "abc", "line 2, column arrival_s: 'abc' is not a number"),
    ("requests.csv", "arrival_s", "inf", "line 2, column arrival_s: 'inf' is not a finite number"),
    ("requests.csv", "prompt_tokens", "", "line 2, column prompt_tokens: is empty (a line cut short?)"),
    ("requests.csv", "prompt_tokens", "-5", "line 2, column prompt_tokens: '-5' is below 0"),
    ("requests.csv", "prompt_tokens", "3.5", "line 2, column prompt_tokens: '3.5' is not a whole number"),
    ("requests.csv", "prompt_tokens", "1e300", "line 2, column prompt_tokens: '1e+300' is too large"),
    ("requests.csv", "finish_s", "-100", "line 2, column finish_s: '-100.0' is below 0"),
    ("requests.csv", "replica", "-2", "line 2, column replica: '-2' is below -1"),
    ("steps.csv", "duration_s", "-1", "line 2, column duration_s: '-1.0' is below 0"),
    ("steps.csv", "count", "0", "line 2, column count: '0' is below 1"),
    ("steps.csv", "start_s", "-inf", "line 2, column start_s: '-inf' is not a finite number"),
]


@pytest.mark.parametrize("file, column, value, said", CELLS)
def test_a_bad_cell_names_its_file_line_and_column(run_dir, tmp_path, file, column, value, said):
    folder = _copy(run_dir, tmp_path)
    _cell(folder, file, column, value)
    with pytest.raises(ScenarioError) as e:
        load_run(folder)
    assert str(e.value).startswith(f"{folder / file}: {said}")


def test_an_empty_time_is_a_time_that_never_came_and_is_read(run_dir, tmp_path):
    folder = _copy(run_dir, tmp_path)
    _cell(folder, "requests.csv", "finish_s", "")  # (a request not finished: servesim writes it so)
    run = load_run(folder)
    assert run.requests["finish_s"].isna().sum() == 1 and run.requests["finish_s"].dtype.kind == "f"


def test_a_line_cut_short_and_a_repeated_request(run_dir, tmp_path):
    folder = _copy(run_dir, tmp_path)
    lines = (folder / "steps.csv").read_text().split("\n")
    (folder / "steps.csv").write_text("\n".join(lines[:5] + [lines[5][:8]]))  # "0,0.12..." cut: the rest empty
    with pytest.raises(ScenarioError, match=r"steps.csv: line 6, column duration_s: is empty \(a line cut short\?\)"):
        load_run(folder)
    folder = _copy(run_dir, tmp_path / "b")
    lines = (folder / "requests.csv").read_text().split("\n")
    (folder / "requests.csv").write_text("\n".join(lines[:3] + [lines[1]] + lines[3:]))
    with pytest.raises(ScenarioError, match="requests.csv: line 4: request_id 0 appears twice"):
        load_run(folder)


SUMMARIES = [  # an edit of summary.json, what the error says
    (lambda s: s.update(duration_s=None), "no duration_s"),
    (lambda s: s.pop("completed"), "no completed"),
    (lambda s: s.update(run="x"), 'run: "x" is not an object or null'),
    (lambda s: s["run"].update(cost_model=3), "run.cost_model: 3 is not an object or null"),
    (lambda s: s.update(ttft_ms="fast"), 'ttft_ms: "fast" is not an object or null'),
    (lambda s: s["ttft_ms"].update(p99="x"), 'ttft_ms.p99: "x" is not a number or null'),
    (lambda s: s.update(completed=-1), "completed: -1 is not a whole number >= 0"),
    (lambda s: s.update(scenario=5), "scenario: 5 is not text"),
    (lambda s: s.update(energy=[1]), "energy: [1] is not an object or null"),
    (lambda s: s.update(goodput="x"), 'goodput: "x" is not an object or a number'),
    (lambda s: s.update(slot_utilization=True), "slot_utilization: true is not a number or null"),
]


@pytest.mark.parametrize("edit, said", SUMMARIES)
def test_a_damaged_summary_names_the_key(run_dir, tmp_path, edit, said):
    folder = _copy(run_dir, tmp_path)
    summary = json.loads((folder / "summary.json").read_text())
    edit(summary)
    (folder / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ScenarioError) as e:
        load_run(folder)
    assert str(e.value).startswith(f"{folder / 'summary.json'}: {said}")


def test_nan_in_a_summary_is_not_json_servesim_writes(run_dir, tmp_path):
    folder = _copy(run_dir, tmp_path)
    text = (folder / "summary.json").read_text()
    (folder / "summary.json").write_text(text.replace('"duration_s":', '"duration_s":NaN,"was":', 1))
    with pytest.raises(ScenarioError, match=r"summary.json: NaN is not JSON servesim writes \(a missing value is null\)"):
        load_run(folder)


@pytest.mark.parametrize("command", [["report"], ["plot"], ["export", "--to", "chrome-trace"],
                                     ["export", "--to", "vllm-bench"]])
def test_every_command_that_reads_a_run_back_says_it_in_one_line(run_dir, tmp_path, command):
    """Before the reader: export of a cut requests.csv raised `cannot convert float NaN to integer`,
    report of a null duration_s a TypeError, plot of a string `run` an AttributeError."""
    for case, damage in (("cut", lambda f: _cell(f, "requests.csv", "output_tokens", "")),
                         ("run", lambda f: (f / "summary.json").write_text(
                             json.dumps({**json.loads((f / "summary.json").read_text()), "run": "x"})))):
        folder = _copy(run_dir, tmp_path / case)
        damage(folder)
        args = [command[0], str(folder), *command[1:]] + (["-o", str(tmp_path / case / "out")]
                                                          if command[0] != "report" else [])
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {folder}"), lines
        assert not (tmp_path / case / "out").exists() and not (folder / "report.html").exists()


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("outputs") / "sweep"
    result = CliRunner().invoke(app, ["sweep", str(ROOT / "scenarios/quickstart.yaml"), "--grid",
                                      "engine.max_num_seqs=16,32", "--set", "workload.num_requests=20", "-o", str(out),
                                      "-q", "--workers", "1"])
    assert result.exit_code == 0, result.output
    return out


def _results(folder: Path, edit) -> None:
    lines = (folder / "results.csv").read_text().split("\n")
    (folder / "results.csv").write_text("\n".join(edit(lines)))


def _drop_column(name: str):
    def edit(lines):
        i = lines[0].split(",").index(name)
        return [",".join(x for j, x in enumerate(line.split(",")) if j != i) if line else line for line in lines]
    return edit


def _set_p99(value: str):
    def edit(lines):
        i = lines[0].split(",").index("ttft_ms.p99")
        row = lines[1].split(",")
        row[i] = value
        return [lines[0], ",".join(row), *lines[2:]]
    return edit


SWEEPS = [  # an edit of results.csv, what report, plot and the sweep's resume say
    (_drop_column("scenario_sha256"), "no scenario_sha256 column"),  # was KeyError: 'scenario_sha256'
    (_set_p99("inf"), "line 2, column ttft_ms.p99: 'inf' is not a finite number"),  # was drawn as inf
    (lambda lines: [lines[0], lines[1], lines[1], *lines[2:]], "line 3: run_id "),  # was counted twice
]


@pytest.mark.parametrize("edit, said", SWEEPS)
def test_a_damaged_sweep_is_one_line_for_report_plot_and_resume(sweep_dir, tmp_path, edit, said):
    folder = tmp_path / "sweep"
    shutil.copytree(sweep_dir, folder)
    _results(folder, edit)
    for args in (["report", str(folder)], ["plot", str(folder), "-o", str(tmp_path / "plots")],
                 ["sweep", str(ROOT / "scenarios/quickstart.yaml"), "--grid", "engine.max_num_seqs=16,32", "--set",
                  "workload.num_requests=20", "-o", str(folder), "-q", "--workers", "1"]):
        result = CliRunner().invoke(app, args)
        lines = result.output.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1 and said in lines[0], (args[0], lines)
    assert not (folder / ".servesim.lock").exists()


def test_a_plan_json_with_nan_is_not_json_servesim_writes(tmp_path):
    folder = tmp_path / "plan"
    folder.mkdir()
    (folder / "plan.json").write_text('{"scenario": "x", "sustained": NaN}')
    for args in (["report", str(folder)], ["plot", str(folder), "-o", str(tmp_path / "p")]):
        result = CliRunner().invoke(app, args)  # (report was: Out of range float values are not JSON compliant)
        assert result.exit_code == 2
        assert result.output.strip() == f"error: {folder / 'plan.json'}: NaN is not JSON servesim writes (a missing value is null)"


@pytest.fixture(scope="module")
def faults_dir(tmp_path_factory):
    """A faults run (two replicas, exponential failures), with its energy section and figures."""
    return _written_run(tmp_path_factory, "faults", "chat-2x-faults.yaml", 120)


@pytest.mark.parametrize("command", ["plot", "report"])
@pytest.mark.parametrize("key, edit", [
    ("faults", lambda s: s["faults"].update(timeline=[{"t_s": "a"}])),     # an event without its state
    ("faults", lambda s: s["faults"].pop("capacity")),
    ("energy", lambda s: s["energy"].update(power_over_time={"gpu_w": "x"})),
])
def test_a_features_section_edited_out_of_shape_is_one_line_naming_it(faults_dir, tmp_path, command, key, edit):
    """The one reader holds a summary section to be an object; what is inside it is its feature's.
    A hand edit inside one was a KeyError traceback from the feature's figure (plot, report): now one
    line naming summary.json and the section."""
    folder = _copy(faults_dir, tmp_path)
    summary = json.loads((folder / "summary.json").read_text())
    edit(summary)
    (folder / "summary.json").write_text(json.dumps(summary))
    r = CliRunner().invoke(app, [command, str(folder)])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {folder / 'summary.json'}: {key}: not as servesim writes it")


def test_a_summary_section_the_page_cannot_show_is_one_line(run_dir, tmp_path):
    """report of a run whose agents section holds text where a count is: one line naming summary.json
    (was a ValueError traceback from the page's summary table)."""
    folder = _copy(run_dir, tmp_path)
    summary = json.loads((folder / "summary.json").read_text())
    summary["agents"] = {"sessions": "x"}
    (folder / "summary.json").write_text(json.dumps(summary))
    r = CliRunner().invoke(app, ["report", str(folder)])
    assert r.exit_code == 2 and r.stderr.startswith(f"error: {folder / 'summary.json'}: not as servesim writes it")
    assert len(r.stderr.strip().splitlines()) == 1 and not (folder / "report.html").exists()
