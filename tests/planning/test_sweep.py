"""sim/planning/sweep.py and `servesim sweep`: grid parsing and its errors, rows equal to simulate(), resume
after a kill, --repeats seeds, and the Dask backend of sim/planning/parallel.py."""
from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from cli import app
from sim.config.errors import ScenarioError
from sim.planning.parallel import run_parallel
from sim.planning.sweep import ResultsTable, flatten, parse_grid, read_results, run_sweep
from sim.reporting.console import sweep_table
from sim.scenario import load_scenario
from sim.simulate import simulate

REPO = Path(__file__).parents[2]
runner = CliRunner()

TINY = """\
name: tiny-sweep
seed: 0
model: llama-3-8b
hardware: h100-sxm
cost_model: roofline
engine: {scheduler: chunked, max_num_seqs: 16, max_num_batched_tokens: 2048}
workload:
  arrival: {process: poisson, rate: 4.0}
  prompt_tokens: {dist: lognormal, mean: 300, std: 100, max: 1024}
  output_tokens: {dist: lognormal, mean: 60, std: 30, max: 256}
  num_requests: 40
slo: {ttft_ms: 200, tpot_ms: 20, percentile: 99}
"""


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path


def invoke(*args):
    return runner.invoke(app, ["sweep", *map(str, args)])


def csv_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def expected_row(scenario: Path, overrides: list[str], seed: int) -> dict[str, str]:
    """What simulate() gives for the same overrides and seed, as results.csv writes it."""
    summary = simulate(load_scenario(scenario, overrides=overrides, seed=seed)).summary
    summary.pop("scenario")
    return {k: "" if v is None else str(v) for k, v in flatten(summary).items()}


# ---------------------------------------------------------------- grids

def test_parse_grid_reads_yaml_values_in_order():
    assert parse_grid(["engine.max_num_seqs=16,32, 64", "workload.arrival.rate=2,4.5",
                       "engine.scheduler='chunked',continuous",
                       "cost_model={roofline: {overhead_s: 0.001, compute_efficiency: 0.5}},unit",
                       "engine.num_gpu_blocks=null,1000"]) == {
        "engine.max_num_seqs": [16, 32, 64], "workload.arrival.rate": [2, 4.5],
        "engine.scheduler": ["chunked", "continuous"],
        "cost_model": [{"roofline": {"overhead_s": 0.001, "compute_efficiency": 0.5}}, "unit"],
        "engine.num_gpu_blocks": [None, 1000]}


@pytest.mark.parametrize("grids, words", [
    (["engine.max_num_sqs=16,32"], ["--grid engine.max_num_sqs", "unknown key"]),
    (["engine.max_num_seqs=16,-5"], ["--grid engine.max_num_seqs", "-5", "integer >= 1"]),
    (["engine.scheduler=chunked,fifo"], ["--grid engine.scheduler", "'fifo'"]),
    (["workload.arrival.rate=2,abc"], ["--grid workload.arrival.rate=abc"]),
    (["engine.max_num_seqs="], ["--grid engine.max_num_seqs", "empty list"]),
    (["engine.max_num_seqs=16,,32"], ["--grid engine.max_num_seqs", "'16,,32'"]),
    (["engine.max_num_seqs=16,"], ["--grid engine.max_num_seqs", "'16,'"]),
    (["engine.max_num_seqs=[16,32"], ["--grid engine.max_num_seqs", "'[16,32'"]),
    (["engine.max_num_seqs=16,16"], ["--grid engine.max_num_seqs", "value 16 is listed twice"]),
    (["engine.max_num_seqs=16", "engine.max_num_seqs=32"], ["--grid engine.max_num_seqs", "given twice"]),
    (["engine.max_num_seqs"], ["--grid engine.max_num_seqs", "KEY=V1,V2"]),
    (["=16,32"], ["--grid =16,32", "KEY=V1,V2"]),
    (["engine..max_num_seqs=16"], ["--grid engine..max_num_seqs=16", "dotted key"]),
    (["engine=16,32"], ["--grid engine", "not a mapping"]),
    (["engine={max_num_seqs: 8}", "engine.max_num_seqs=16"], ["--grid engine.max_num_seqs", "overlaps"]),
    (["seed=1,2"], ["--grid seed", "--repeats"]),
    (["engine.max_num_seqs=16,4096"], ["--grid engine.max_num_seqs", "4096"]),  # > max_num_batched_tokens
    ([], ["--grid", "at least one"]),
])
def test_bad_grid_is_one_line_exit_2_and_writes_nothing(tiny, tmp_path, grids, words):
    out = tmp_path / "out"
    result = invoke(tiny, *(a for g in grids for a in ("--grid", g)), "--out", out, "--workers", 1)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--grid" in lines[0], lines
    for w in words:
        assert w in lines[0], lines[0]
    assert not out.exists()


@pytest.mark.parametrize("args, words", [
    (["--repeats", 0], ["--repeats", "0"]),
    (["--workers", 0], ["--workers", "0"]),
    (["--workers", 2, "--cluster", "tcp://127.0.0.1:1"], ["--workers", "--cluster"]),
    (["--set", "engine.max_num_seqs=-1"], ["--set engine.max_num_seqs", "-1"]),
])
def test_bad_options_are_one_line_exit_2(tiny, tmp_path, args, words):
    result = invoke(tiny, "--grid", "engine.max_num_seqs=8", "--out", tmp_path / "out", *args)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), lines
    assert not (tmp_path / "out" / "results.csv").exists()


def test_out_under_a_file_is_one_line_exit_2(tiny, tmp_path):
    (tmp_path / "file").write_text("x")  # used to be exit code 1, "Not a directory"
    result = invoke(tiny, "--grid", "engine.max_num_seqs=8", "--out", tmp_path / "file" / "out")
    assert result.exit_code == 2 and result.stderr.strip() == \
        f"error: --out {tmp_path / 'file' / 'out'}: {tmp_path / 'file'} exists and is not a directory"


# ---------------------------------------------------------------- rows

def test_rows_equal_simulate_for_the_same_overrides_and_seed(tiny, tmp_path):
    out = tmp_path / "out"
    # Default --workers: all local cores (a process pool whenever the machine has more than one).
    result = invoke(tiny, "--grid", "engine.max_num_seqs=4,16", "--grid", "workload.arrival.rate=2,8",
                    "--set", "workload.num_requests=30", "--seed", 3, "--out", out)
    assert result.exit_code == 0, result.output
    assert f"results: {out / 'results.csv'} (4 runs simulated, 0 already done)" in result.stdout
    assert "TTFT" in result.stdout and "goodput" in result.stdout  # the table
    rows = csv_rows(out / "results.csv")
    assert sorted((r["engine.max_num_seqs"], r["workload.arrival.rate"]) for r in rows) == [
        ("16", "2"), ("16", "8"), ("4", "2"), ("4", "8")]
    for r in rows:
        sets = ["workload.num_requests=30", f"engine.max_num_seqs={r['engine.max_num_seqs']}",
                f"workload.arrival.rate={r['workload.arrival.rate']}"]
        want = expected_row(tiny, sets, seed=3)
        assert {k: r[k] for k in want} == want
        assert (r["scenario"], r["repeat"], r["seed"], r["error"]) == ("tiny-sweep", "0", "3", "")
        summary = json.loads((out / "runs" / r["run_id"] / "summary.json").read_text())
        assert str(summary["ttft_ms"]["p99"]) == r["ttft_ms.p99"]
    assert {"ttft_ms.p99", "tpot_ms.p99", "goodput.requests_per_s", "goodput.ttft_ms.met"} <= set(rows[0])
    # read_results gives back the exact floats
    frame = read_results(out / "results.csv")
    assert [float(r["ttft_ms.p99"]) for r in rows] == frame["ttft_ms.p99"].tolist()


def test_repeats_use_consecutive_seeds(tiny, tmp_path):
    res = run_sweep(tiny, {"engine.max_num_seqs": [8]}, tmp_path / "out", sets=["workload.num_requests=20"],
                    seed=5, repeats=3, workers=1)
    assert (res.ran, res.skipped) == (3, 0)
    assert res.rows["seed"].tolist() == [5, 6, 7] and res.rows["repeat"].tolist() == [0, 1, 2]
    assert res.rows["run_id"].nunique() == 3
    for seed, row in zip((5, 6, 7), csv_rows(res.path)):
        want = expected_row(tiny, ["workload.num_requests=20", "engine.max_num_seqs=8"], seed)
        assert {k: row[k] for k in want} == want
    assert len(set(res.rows["ttft_ms.p99"])) == 3  # the seeds really differ


def test_scenario_column_is_the_files_name_when_the_grid_varies_name(tiny, tmp_path):
    res = run_sweep(tiny, {"name": ["a", "b"]}, tmp_path / "out", sets=["workload.num_requests=5"], workers=1)
    rows = csv_rows(res.path)
    assert [(r["scenario"], r["name"]) for r in rows] == [("tiny-sweep", "a"), ("tiny-sweep", "b")]


def test_a_refused_point_is_an_error_row_and_the_table_widens(tiny, tmp_path):
    # 2 blocks of 16 tokens cannot hold a 300-token prompt: the simulator refuses that point.
    res = run_sweep(tiny, {"engine.num_gpu_blocks": [2, None]}, tmp_path / "out",
                    sets=["workload.num_requests=10"], workers=1)
    first, second = csv_rows(res.path)
    assert "needs" in first["error"] and "KV token slots" in first["error"] and first["ttft_ms.p99"] == ""
    assert second["error"] == "" and float(second["ttft_ms.p99"]) > 0
    assert not (tmp_path / "out" / "runs" / first["run_id"]).exists()
    assert res.rows["engine.num_gpu_blocks"].tolist() == ["2", "null"]
    assert res.rows["error"].tolist() == [first["error"], ""]
    console = Console(file=io.StringIO(), width=1000)
    console.print(sweep_table(res.rows, ["engine.num_gpu_blocks"]))
    assert f"refused: engine.num_gpu_blocks=2: {first['error']}" in console.file.getvalue()


def test_results_table_repairs_a_truncated_last_line(tmp_path):
    path = tmp_path / "results.csv"
    path.write_text("run_id,a\nx1,1\nx2,2\nx3,3,extra\nx4,")
    table = ResultsTable(path)
    assert [r["run_id"] for r in table.rows] == ["x1", "x2"]
    assert path.read_text() == "run_id,a\nx1,1\nx2,2\n"
    table.append({"run_id": "x5", "a": 5, "b": 0.1})
    assert path.read_text() == "run_id,a,b\nx1,1,\nx2,2,\nx5,5,0.1\n"


# ---------------------------------------------------------------- resume

def test_killed_sweep_resumes_without_rerunning_or_duplicating(tmp_path):
    out = tmp_path / "out"
    args = ["scenarios/quickstart.yaml", "--grid", "engine.max_num_seqs=16,32,64,128",
            "--grid", "workload.arrival.rate=4,8", "--set", "workload.num_requests=500", "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "cli.py", "sweep", *args, "--workers", "1", "-q"], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    table = out / "results.csv"
    try:
        deadline = time.monotonic() + 60
        while not (table.exists() and table.read_text().count("\n") >= 2):  # header + one row
            assert proc.poll() is None and time.monotonic() < deadline, "sweep ended before a row appeared"
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    before = table.read_text()
    done = before[:before.rfind("\n") + 1].count("\n") - 1
    assert 1 <= done < 8, "killed too late to test resuming"
    with open(table, "a") as f:
        f.write("deadbeef0000,quickstart,abc,16")  # half a row, as a kill mid-write leaves it

    result = runner.invoke(app, ["sweep", *args, "--workers", "1"])
    assert result.exit_code == 0, result.output
    assert f"({8 - done} runs simulated, {done} already done)" in result.stdout
    after = table.read_text()
    assert after.startswith(before[:before.rfind("\n") + 1]) and "deadbeef" not in after
    rows = csv_rows(table)
    points = [(r["engine.max_num_seqs"], r["workload.arrival.rate"]) for r in rows]
    assert sorted(points) == sorted((s, r) for s in ("16", "32", "64", "128") for r in ("4", "8"))
    assert len({r["run_id"] for r in rows}) == 8
    again = runner.invoke(app, ["sweep", *args, "-q"])
    assert again.exit_code == 0 and table.read_text() == after


def test_resume_refuses_a_changed_scenario_file(tiny, tmp_path):
    run_sweep(tiny, {"engine.max_num_seqs": [8]}, tmp_path / "out", sets=["workload.num_requests=10"],
              workers=1)
    tiny.write_text(TINY.replace("rate: 4.0", "rate: 5.0"))
    result = invoke(tiny, "--grid", "engine.max_num_seqs=8", "--set", "workload.num_requests=10",
                    "--out", tmp_path / "out")
    assert result.exit_code == 2 and "another version of scenario 'tiny-sweep'" in result.stderr


# ---------------------------------------------------------------- Dask

def test_dask_cluster_gives_the_same_rows(tiny, tmp_path):
    distributed = pytest.importorskip("distributed")
    grid = {"engine.max_num_seqs": [4, 16]}
    sets = ["workload.num_requests=20"]
    local = run_sweep(tiny, grid, tmp_path / "local", sets=sets, workers=1)
    with distributed.LocalCluster(processes=False, n_workers=1, threads_per_worker=2,
                                  dashboard_address=None) as cluster:
        remote = run_sweep(tiny, grid, tmp_path / "dask", sets=sets, cluster=cluster.scheduler_address)
    assert remote.ran == 2
    assert remote.rows.equals(local.rows)


def test_dask_errors_are_scenario_errors(monkeypatch):
    monkeypatch.setattr("sim.planning.parallel.CONNECT_TIMEOUT_S", 0.5)
    with pytest.raises(ScenarioError, match=r"--cluster tcp://127.0.0.1:1: cannot connect"):
        list(run_parallel(abs, [(1,)], cluster="tcp://127.0.0.1:1"))
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if not installed
    with pytest.raises(ScenarioError, match=r"servesim\[cluster\]"):
        list(run_parallel(abs, [(1,)], cluster="tcp://127.0.0.1:8786"))


@pytest.mark.parametrize("reply, says", [
    (None, r"no Dask scheduler answered within 1 s \(something accepts connections there but does not speak"),
    (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", "cannot connect|not as a Dask scheduler"),
])
def test_a_cluster_address_that_accepts_but_is_not_dask_is_one_line_and_leaves_no_lock(tiny, tmp_path, monkeypatch,
                                                                                       reply, says):
    """A port that accepts and stays silent (it hung the plan and the sweep, and left the sweep's
    lock) or answers HTTP 400 (a MemoryError traceback: its bytes read as a message length): one
    line within the deadline (twice the connect timeout), and nothing left in --out."""
    import socket
    import threading

    pytest.importorskip("distributed")
    monkeypatch.setattr("sim.planning.parallel.CONNECT_TIMEOUT_S", 0.5)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    port, stop, held = server.getsockname()[1], threading.Event(), []

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            held.append(conn)
            if reply is not None:
                conn.sendall(reply)
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with pytest.raises(ScenarioError, match=says):
            list(run_parallel(abs, [(1,)], cluster=f"tcp://127.0.0.1:{port}"))
        out = tmp_path / "sweep"
        with pytest.raises(ScenarioError, match=says):
            run_sweep(tiny, {"engine.max_num_seqs": [4, 16]}, out, cluster=f"tcp://127.0.0.1:{port}")
        assert not (out / ".servesim.lock").exists()
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


def test_run_parallel_local_keeps_its_contract():
    assert sorted(run_parallel(pow, [(2, 3), (3, 2), (5, 1)], workers=2)) == [(0, 8), (1, 9), (2, 5)]
    assert list(run_parallel(pow, [(2, 3), (3, 2)], workers=1)) == [(0, 8), (1, 9)]


def test_help_lists_the_options():
    result = runner.invoke(app, ["sweep", "--help"])
    assert result.exit_code == 0
    for opt in ("--grid", "--repeats", "--workers", "--cluster", "--set", "--seed", "--out", "--quiet"):
        assert opt in result.stdout
