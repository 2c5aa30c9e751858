"""servesim's one safe writer (sim/files.py): never through a planted link, exclusive temporaries,
the replaced file's mode kept, nothing left behind on failure; and the commands that write files
(report, export, compare, plot, sweep's results table, run) use it."""
import json
import os
import stat
from pathlib import Path

import matplotlib
import pytest
import yaml
from typer.testing import CliRunner

from cli import app
from sim.files import save_figure, write_file
from sim.planning.sweep import ResultsTable

matplotlib.use("Agg")
ROOT = Path(__file__).resolve().parents[1]
SCENARIO = {"name": "f", "model": "llama-3-8b", "hardware": "h100-sxm", "cost_model": "roofline",
            "workload": {"arrival": {"process": "poisson", "rate": 5}, "num_requests": 12,
                         "prompt_tokens": {"dist": "fixed", "value": 64},
                         "output_tokens": {"dist": "fixed", "value": 8}}}


def victim(tmp_path: Path) -> Path:
    """A file of the user's, outside the output folder, mode 600."""
    v = tmp_path / "elsewhere" / "mine.txt"
    v.parent.mkdir()
    v.write_text("my data\n")
    v.chmod(0o600)
    return v


def untouched(v: Path) -> bool:
    return v.read_text() == "my data\n" and stat.S_IMODE(v.stat().st_mode) == 0o600


def mode(p: Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


def test_a_planted_link_is_replaced_not_written_through(tmp_path):
    v = victim(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "plan.json").symlink_to(v)
    write_file(out / "plan.json", "{}\n")
    assert untouched(v)
    assert not (out / "plan.json").is_symlink() and (out / "plan.json").read_text() == "{}\n"
    umask = os.umask(0)
    os.umask(umask)
    assert mode(out / "plan.json") == 0o666 & ~umask  # a new file's mode, not the link target's


def test_the_replaced_files_mode_is_kept_and_a_failure_leaves_nothing(tmp_path, monkeypatch):
    target = tmp_path / "summary.json"
    target.write_text("old\n")
    target.chmod(0o600)
    write_file(target, b"new\n")
    assert target.read_text() == "new\n" and mode(target) == 0o600

    def broken(*a):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError):
        write_file(target, "newer\n")
    assert target.read_text() == "new\n" and sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_a_figure_goes_through_the_writer(tmp_path):
    import matplotlib.pyplot as plt
    v = victim(tmp_path)
    (tmp_path / "fig.png").symlink_to(v)
    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    save_figure(fig, tmp_path / "fig.png", dpi=50)
    plt.close(fig)
    assert untouched(v) and (tmp_path / "fig.png").read_bytes()[:4] == b"\x89PNG"


def test_a_sweep_results_table_never_appends_through_a_link(tmp_path):
    v = victim(tmp_path)
    table = ResultsTable(tmp_path / "results.csv")
    table.append({"run_id": "a", "x": "1"})
    (tmp_path / "results.csv").unlink()
    (tmp_path / "results.csv").symlink_to(v)  # planted between two appends
    table.append({"run_id": "b", "x": "2"})
    assert untouched(v)
    assert (tmp_path / "results.csv").read_text() == "run_id,x\na,1\nb,2\n"


def test_commands_write_through_no_planted_link(tmp_path):
    """A shared run folder with links planted at the names report, export, compare and plot write
    (and at the temporaries they used to write): the user's file is untouched."""
    runner = CliRunner()
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(SCENARIO))
    run = tmp_path / "run"
    r = runner.invoke(app, ["run", str(tmp_path / "s.yaml"), "--out", str(run), "-q"])
    assert r.exit_code == 0, r.output
    v = victim(tmp_path)
    (run / "plots").mkdir()
    for name in ("report.html", ".report.html.tmp", "trace.json", ".trace.json.tmp", "vllm_bench.json",
                 ".vllm_bench.json.tmp", "compare.json", ".compare.json.tmp", "compare.png",
                 "plots/latency_cdf.png"):
        (run / name).symlink_to(v)
    bench = tmp_path / "bench.json"
    r = runner.invoke(app, ["export", str(run), "--to", "vllm-bench", "--out", str(bench)])
    assert r.exit_code == 0, r.output
    for args in (["report", str(run)], ["export", str(run), "--to", "chrome-trace"],
                 ["export", str(run), "--to", "vllm-bench"], ["compare", str(bench), str(run)],
                 ["plot", str(run)]):
        r = runner.invoke(app, args)
        assert r.exit_code == 0, (args, r.output)
        assert untouched(v), args
    for name in ("report.html", "trace.json", "vllm_bench.json", "compare.json", "compare.png",
                 "plots/latency_cdf.png"):
        assert not (run / name).is_symlink(), name
    assert json.loads((run / "compare.json").read_text())["run"] == str(run)


def test_user_text_is_data_in_tables_figures_and_error_lines(tmp_path):
    """A model named with rich markup and matplotlib math text, in a folder named like an unexpanded
    shell variable: capacity, run, plot, report and compare show it as written."""
    runner = CliRunner()
    raw = {**SCENARIO, "model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                                 "intermediate_size": 128, "vocab_size": 256, "name": "[/]$\\foo$ [bold"},
           "hardware": {"name": "gpu[/]x", "memory_bytes": 8e10, "hbm_bandwidth": 3e12, "bf16_flops": 1e15}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    run = tmp_path / "runs_$MODEL_$RATE"
    r = runner.invoke(app, ["capacity", "--scenario", str(tmp_path / "s.yaml")])
    assert r.exit_code == 0 and "[/]$\\foo$ [bold on gpu[/]x" in r.output, r.output
    for args in (["run", str(tmp_path / "s.yaml"), "--out", str(run)], ["plot", str(run)], ["report", str(run)],
                 ["export", str(run), "--to", "vllm-bench", "--out", str(tmp_path / "b.json")],
                 ["compare", str(tmp_path / "b.json"), str(run)]):
        r = runner.invoke(app, args)
        assert r.exit_code == 0, (args, r.output)
    assert (run / "plots" / "latency_cdf.png").read_bytes()[:4] == b"\x89PNG"
    # an error line shows a file name's escape bytes escaped, on one line
    r = runner.invoke(app, ["run", str(tmp_path / "no\x1b[31mpe\nx.yaml")])
    assert r.exit_code == 2 and "\x1b" not in r.stderr and "\\x1b[31mpe\\nx.yaml" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_second_writer_of_a_sweep_folder_is_refused(tmp_path):
    """Two sweeps into one folder lost half the points or duplicated rows, exit 0: the folder now
    has one writer, and a second is refused with one line naming the holder."""
    from sim.files import folder_lock
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(SCENARIO))
    out = tmp_path / "sweep"
    out.mkdir()
    args = ["sweep", str(tmp_path / "s.yaml"), "--grid", "engine.max_num_seqs=4,8", "--out", str(out), "-q"]
    with folder_lock(out, "sweep"):  # another writer holds it (the lock is per open file, even here)
        r = CliRunner().invoke(app, args)
    assert r.exit_code == 2 and f"process {os.getpid()}" in r.stderr and "another sweep" in r.stderr
    assert not (out / "results.csv").exists()
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert len((out / "results.csv").read_text().splitlines()) == 3
    assert not (out / ".servesim.lock").exists()  # (the lock file does not outlive the sweep)
    (out / ".servesim.lock").symlink_to(victim(tmp_path))  # a planted lock link is not followed
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2 and "lock file" in r.stderr
    assert untouched(tmp_path / "elsewhere" / "mine.txt")


def test_a_folder_lock_is_one_holder_at_a_time_and_leaves_no_file(tmp_path, monkeypatch):
    """The lock file goes when its holder lets go (also on an error); one held is refused to a
    second holder; a lock file a killed holder left (no lock on it) is taken over; a holder that
    locked a file since removed from the folder (its holder let go between the open and the lock)
    does not count, so two holders never both think they hold the folder."""
    import fcntl

    from sim.config.errors import ScenarioError
    from sim.files import LOCK_NAME, folder_lock

    lock = tmp_path / LOCK_NAME
    with folder_lock(tmp_path, "sweep"):
        assert lock.read_text() == f"{os.getpid()}\n"
        with pytest.raises(ScenarioError, match="another sweep is writing to it"):
            with folder_lock(tmp_path, "sweep"):
                pass
    assert not lock.exists()
    with pytest.raises(RuntimeError):
        with folder_lock(tmp_path, "sweep"):
            raise RuntimeError("the sweep failed")
    assert not lock.exists()
    lock.write_text("12345\n")  # left by a killed process: no flock on it
    with folder_lock(tmp_path, "sweep"):
        assert lock.read_text() == f"{os.getpid()}\n"
    assert not lock.exists()
    # the race: between this holder's open and its lock, the one before it let go (removing the file)
    # and a third made a new one; the lock taken is on a removed file, so it is dropped and the new
    # file locked instead
    import sim.files as files

    real, calls = fcntl.flock, []

    def flock_then_swap(fd, op):
        real(fd, op)
        calls.append(os.fstat(fd).st_ino)
        if len(calls) == 1:
            lock.unlink()
            lock.write_text("")  # (the third's)
    monkeypatch.setattr(files.fcntl, "flock", flock_then_swap)
    with folder_lock(tmp_path, "sweep"):
        assert len(calls) == 2 and calls[0] != calls[1] == os.stat(lock).st_ino
        assert lock.read_text() == f"{os.getpid()}\n"
    assert not lock.exists()


def test_log_axes_are_labelled_in_plain_numbers():
    """Figures are drawn with math text off (user names as written), so the log axes' labels must
    not be math text: 100, 200, ... not $\\mathdefault{10^{2}}$ shown as written."""
    import matplotlib.pyplot as plt

    from sim.files import plain_text

    @plain_text
    def draw(path):
        fig, ax = plt.subplots()
        ax.plot([1, 2], [90, 450])
        ax.set_yscale("log")
        save_figure(fig, path, dpi=50)
        labels = [t.get_text() for t in ax.get_yticklabels(which="both") if t.get_text()]
        plt.close(fig)
        return labels
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        labels = draw(Path(d) / "f.png")
    assert labels and all("$" not in t and float(t) > 0 for t in labels), labels
    assert "100" in labels and "200" in labels


def test_a_log_axis_over_a_few_decades_labels_its_ticks_plainly_without_collisions():
    """0.15 to 60 s (2.6 decades): majors 1 and 10, minors 2 and 5 of each decade, as plain
    numbers; LogFormatter wrote 0.2 as "2e-01" and labelled 2, 3, 4 of the narrow first decade,
    which ran into each other."""
    import matplotlib.pyplot as plt

    from sim.files import plain_text

    @plain_text
    def draw(path):
        fig, ax = plt.subplots(figsize=(4, 3))
        ax.plot([0.15, 60], [0, 1])
        ax.set_xscale("log")
        ax.set_xlim(0.15, 60)
        save_figure(fig, path, dpi=50)
        labels = [t.get_text() for t in ax.get_xticklabels(which="both")  # (the ticks drawn: inside the view)
                  if t.get_text() and 0.15 <= t.get_position()[0] <= 60]
        plt.close(fig)
        return labels
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        labels = draw(Path(d) / "f.png")
    assert sorted(labels, key=float) == ["0.2", "0.5", "1", "2", "5", "10", "20", "50"]


def test_a_second_run_or_plan_writing_into_a_folder_waits_for_the_first_files_to_be_whole(tmp_path, monkeypatch):
    """Two commands writing one folder at once could leave one's requests.csv beside the other's
    summary.json (a plan: one's plan.json beside the other's plan.md). A run's renames wait while
    another command holds the folder's write turn, then put all of its own files there; nothing is
    left behind. The turn is an flock on the folder: held here by the test (another open file)."""
    import threading

    from sim.files import writing
    from sim.scenario import scenario_from_dict
    from sim.simulate import simulate, write_outputs

    out = tmp_path / "run"
    out.mkdir()
    result = simulate(scenario_from_dict(SCENARIO))
    done = threading.Event()
    writer = threading.Thread(target=lambda: (write_outputs(result, out), done.set()))
    with writing(out):
        writer.start()
        assert not done.wait(0.5)  # waiting for the turn: none of its files in place yet
        assert not (out / "summary.json").exists() and not (out / "requests.csv").exists()
    writer.join(10)
    assert done.is_set()
    assert sorted(p.name for p in out.iterdir()) == ["requests.csv", "scenario.yaml", "steps.csv", "summary.json"]
    # a plan's report likewise (PlanJob.write takes the same turn)
    from sim.planning.plan_request import PlanJob, PlanRequest, prepare

    (tmp_path / "s.yaml").write_text(yaml.safe_dump(SCENARIO))
    job = prepare(PlanRequest(tmp_path / "s.yaml", slo="ttft_ms=500", out=tmp_path / "plan"))
    calls: list[dict] = []
    monkeypatch.setattr(PlanJob, "_write", lambda self, result, out: calls.append(result) or ("t", [], "x"))
    finished = threading.Event()
    job.out_dir.mkdir()
    other = threading.Thread(target=lambda: (job.write({"r": 1}), finished.set()))
    with writing(job.out_dir):
        other.start()
        assert not finished.wait(0.5) and calls == []
    other.join(10)
    assert calls == [{"r": 1}] and list(job.out_dir.iterdir()) == []


def test_export_to_a_folder_or_a_new_folder_and_the_writers_errors_name_the_target(tmp_path):
    """`export --out` a folder ended in exit 1 naming a hidden temporary (".run.sux6otat: Is a
    directory"), and into a folder not yet there likewise; now the first is one usage line (exit 2)
    and the second makes the folder, as other commands' --out does. The writer's own errors name
    the file or folder asked for, never its temporary."""
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(SCENARIO))
    run = tmp_path / "run"
    assert CliRunner().invoke(app, ["run", str(tmp_path / "s.yaml"), "--out", str(run), "-q"]).exit_code == 0
    r = CliRunner().invoke(app, ["export", str(run), "--to", "vllm-bench", "--out", str(run)])
    assert r.exit_code == 2
    assert r.stderr.strip() == f"error: --out {run}: is a folder; give the file to write, e.g. {run / 'vllm_bench.json'}"
    deep = tmp_path / "new" / "deeper" / "b.json"
    r = CliRunner().invoke(app, ["export", str(run), "--to", "vllm-bench", "--out", str(deep)])
    assert r.exit_code == 0 and json.loads(deep.read_text())["completed"] == 12
    with pytest.raises(FileNotFoundError) as e:
        write_file(tmp_path / "absent" / "x.json", "{}")
    assert e.value.filename == str(tmp_path / "absent")
    with pytest.raises(IsADirectoryError) as e:
        write_file(run, "{}")
    assert e.value.filename == str(run) and not any(p.name.startswith(".") for p in tmp_path.iterdir())
