"""sim/reporting/analysis.py slot assignment, sim/reporting/plots.py figures and `servesim plot`."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cli import app
from sim.config.errors import ScenarioError
from sim.reporting.analysis import (
    Run,
    iteration_of,
    load_run,
    replica_iterations,
    slot_assignment,
    slot_utilization_from_slots,
)
from sim.reporting.plots import batch_kv, compare_bars, latency_cdfs, save_plots, slot_timeline
from sim.scenario import load_scenario
from sim.simulate import simulate, write_outputs
from sim.workload.generators import Workload, build_workload

ROOT = Path(__file__).resolve().parents[2]
TOY_OUTPUTS = [444, 480, 91, 315, 573, 547, 464, 360]


def _run(name: str, *overrides: str) -> Run:
    sc = load_scenario(ROOT / "scenarios" / f"{name}.yaml", overrides=overrides)
    return Run.from_result(simulate(sc), name=name)


@pytest.fixture(scope="module")
def toy_static() -> Run:
    return _run("toy-static-8")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A small realistic run on disk (static batching: padding, several batches)."""
    d = tmp_path_factory.mktemp("runs") / "static"
    sc = load_scenario(ROOT / "scenarios/chat-static.yaml",
                       overrides=["workload.num_requests=120", "engine.max_num_seqs=16"])
    write_outputs(simulate(sc), d)
    return d


def _no_overlap(slots) -> None:
    for _, rows in slots.groupby("slot"):
        rows = rows.sort_values("start_it")
        assert (rows["start_it"].to_numpy()[1:] >= rows["hold_it"].to_numpy()[:-1]).all()


def test_toy_static_slots_exact(toy_static):
    slots = slot_assignment(toy_static).sort_values("request_id")
    # one batch of 8 from iteration 0; each request computes output_tokens iterations (its prefill
    # samples token 1) and its slot stays held until the longest (573) ends
    assert slots["slot"].tolist() == list(range(8))
    assert slots["start_it"].tolist() == [0] * 8
    assert slots["end_it"].tolist() == TOY_OUTPUTS
    assert slots["hold_it"].tolist() == [573] * 8
    assert toy_static.is_static and toy_static.max_num_seqs == 8
    iters = replica_iterations(toy_static)
    assert iters == 573
    util = slot_utilization_from_slots(slots, iters, 8)
    assert util == pytest.approx(sum(TOY_OUTPUTS) / (8 * 573), rel=1e-12)
    assert util == pytest.approx(toy_static.summary["slot_utilization"], rel=1e-12)


def test_continuous_backfills_freed_slots():
    # 24 toy-shaped requests at t = 0 and 8 slots: continuous batching hands a slot freed at the end
    # of an iteration to the next waiting request in the next one, so the 16 later requests start
    # exactly at the 16 earliest finishes, and no slot is held past its request's finish
    sc = load_scenario(ROOT / "scenarios/toy-continuous-8.yaml")
    toy = build_workload(sc.workload, np.random.default_rng(0))
    w = Workload(*(np.tile(a, 3) for a in (toy.arrival_s, toy.prompt_tokens, toy.output_tokens,
                                             toy.priority)))
    run = Run.from_result(simulate(sc, workload=w))
    slots = slot_assignment(run).sort_values("request_id")
    assert not run.is_static
    assert (slots["hold_it"] == slots["end_it"]).all()
    assert slots["slot"].max() == 7
    _no_overlap(slots)
    assert sorted(slots["start_it"].iloc[8:]) == sorted(slots["end_it"])[:16]
    util = slot_utilization_from_slots(slots, replica_iterations(run), 8)
    assert util == pytest.approx(run.summary["slot_utilization"], rel=1e-12)


@pytest.mark.parametrize("scenario, overrides", [
    ("chat-static", ["workload.num_requests=150", "engine.max_num_seqs=16"]),
    ("chat-continuous", ["workload.num_requests=150", "engine.max_num_seqs=24"]),
    ("chat-chunked", ["workload.num_requests=150", "engine.max_num_seqs=24", "workload.arrival.rate=20"]),
])
def test_slot_invariants_match_summary(scenario, overrides):
    run = _run(scenario, *overrides)
    assert run.summary["preemptions"] == 0
    slots = slot_assignment(run)
    _no_overlap(slots)
    cap = int(run.max_num_seqs)
    assert slots["slot"].max() + 1 <= cap
    assert (slots["end_it"] > slots["start_it"]).all()
    util = slot_utilization_from_slots(slots, replica_iterations(run), cap)
    assert util == pytest.approx(run.summary["slot_utilization"], rel=1e-9)


def test_compare_bars_puts_padding_waste_beside_slot_utilisation(toy_static):
    """The toy's static and continuous runs have equal slot utilisation (71.4%); only the padding
    panel tells them apart (static: 27.8% of computed tokens are padding; continuous: none), so
    both series must be drawn."""
    toy_continuous = _run("toy-continuous-8")
    ax = compare_bars([toy_static, toy_continuous]).axes[2]
    util, padding = (np.array([b.get_height() for b in c]) for c in ax.containers)
    expect_util = [toy_static.summary["slot_utilization"] * 100, toy_continuous.summary["slot_utilization"] * 100]
    assert util == pytest.approx(expect_util, rel=1e-12) and util[0] == pytest.approx(71.4, abs=0.05)
    assert padding == pytest.approx([toy_static.summary["padding_waste"] * 100, 0.0], rel=1e-12)
    assert padding[0] > 20
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["slot utilisation", "padding waste"]


def test_iteration_of_maps_row_boundaries():
    run = _run("toy-static-8")
    steps = run.steps
    # row starts map to the iterations before them; ends of the last row to the total
    first = steps["count"].cumsum() - steps["count"]
    assert iteration_of(steps, steps["start_s"].to_numpy()).tolist() == first.tolist()
    end = steps["start_s"].iloc[-1] + steps["duration_s"].iloc[-1]
    assert iteration_of(steps, [end]).tolist() == [573]


def test_timeline_caps_requests(run_dir):
    run = load_run(run_dir)
    fig = slot_timeline(run, max_requests=20)
    title = fig.axes[0].get_title()
    assert "the busiest stretch of 20 requests: iterations" in title and "of 120 requests" in title
    # the window: the 20 consecutive starts (by slot assignment) within the fewest iterations
    slots = slot_assignment(run)
    starts = slots["start_it"].to_numpy()
    spans = starts[20:] - starts[:-20]
    i = int(np.argmin(spans))
    assert fig.axes[0].get_xlim() == (starts[i], starts[i + 20])
    # a window asked for in seconds since the first arrival
    fig = slot_timeline(run, max_requests=20, window_s=(1.0, 2.0))
    lo, hi = fig.axes[0].get_xlim()
    assert "the window asked for" in fig.axes[0].get_title()
    assert (lo, hi) == tuple(iteration_of(run.steps, np.array([1.0, 2.0]) + run.requests["arrival_s"].min()))


def test_save_plots_writes_pngs(run_dir, tmp_path):
    other = tmp_path / "other"
    write_outputs(simulate(load_scenario(ROOT / "scenarios/toy-continuous-8.yaml")), other)
    written = save_plots(run_dir, compare=[other], out=tmp_path / "plots")
    names = sorted(p.name for p in written)
    assert names == ["batch_kv.png", "compare_bars.png", "compare_cdf.png", "latency_cdf.png",
                     "power.png", "slot_timeline.png", "slot_timeline_1.png"]  # every compared run's timeline
    for p in written:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000


def test_cli_plot_default_out(run_dir):
    result = CliRunner().invoke(app, ["plot", str(run_dir)])
    assert result.exit_code == 0, result.output
    lines = result.output.split()
    # (power.png: the energy feature's own figure, sim/features/energy/plot.py)
    assert [Path(x).name for x in lines] == ["slot_timeline.png", "batch_kv.png", "latency_cdf.png", "power.png"]
    assert all((run_dir / "plots" / Path(x).name).stat().st_size > 0 for x in lines)


def _cli_error(args):
    result = CliRunner().invoke(app, ["plot", *args])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    return lines[0]


def test_cli_errors(run_dir, tmp_path):
    missing = tmp_path / "nope"
    assert str(missing) in _cli_error([str(missing)])
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "not a run directory" in _cli_error([str(empty)])
    afile = tmp_path / "file.txt"
    afile.write_text("x")
    assert str(afile) in _cli_error([str(run_dir), "--compare", str(afile)])
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in ("requests.csv", "steps.csv", "summary.json"):
        (broken / f).write_bytes((run_dir / f).read_bytes())
    (broken / "steps.csv").write_text("replica,start_s\n0,0.0\n")
    assert "steps.csv: missing column(s)" in _cli_error([str(broken)])
    (broken / "steps.csv").write_bytes((run_dir / "steps.csv").read_bytes())
    (broken / "summary.json").write_text("[1, 2")
    assert "summary.json" in _cli_error([str(broken)])


def test_cli_refuses_an_out_that_is_a_file_and_a_run_compared_with_itself(run_dir, tmp_path):
    afile = tmp_path / "file.png"
    afile.write_text("x")
    assert _cli_error([str(run_dir), "--out", str(afile)]) == \
        f"error: --out {afile}: exists and is not a directory"  # was exit 1, "File exists"
    assert _cli_error([str(run_dir), "--out", str(afile / "sub")]) == \
        f"error: --out {afile / 'sub'}: {afile} exists and is not a directory"
    same = run_dir.parent / "." / run_dir.name  # the same folder, spelled differently
    assert f"--compare {same}: given twice" in _cli_error([str(run_dir), "--compare", str(same),
                                                           "--out", str(tmp_path / "plots")])
    assert not (tmp_path / "plots").exists()


def test_latency_cdfs_without_tpot_values_warns_nothing():
    # One-token outputs have no TPOT: the panel says so (it used to emit matplotlib's UserWarning
    # "No artists with labels found to put in legend" on the CLI's stderr).
    sc = load_scenario(ROOT / "scenarios/quickstart.yaml", overrides=[
        "workload.num_requests=10", "workload.output_tokens={dist: fixed, value: 1}"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = latency_cdfs([Run.from_result(simulate(sc))])
    assert [t.get_text() for t in fig.axes[1].texts] == ["no TPOT values"]


def test_load_run_error_is_scenario_error(tmp_path):
    with pytest.raises(ScenarioError, match="no such run directory"):
        load_run(tmp_path / "missing")
    (tmp_path / "summary.json").write_text(json.dumps({}))
    with pytest.raises(ScenarioError, match="requests.csv: missing"):
        load_run(tmp_path)


def test_plot_help():
    result = CliRunner().invoke(app, ["plot", "--help"])
    assert result.exit_code == 0 and "--compare" in result.output


def test_cdfs_draw_the_slo_and_compare_bars_go_log_when_spread(tmp_path):
    chat = load_scenario(ROOT / "scenarios/quickstart.yaml", ["workload.num_requests=80"])
    fast = Run.from_result(simulate(chat), "chunked")
    slow = Run.from_result(simulate(load_scenario(ROOT / "scenarios/quickstart.yaml",
                                                  ["workload.num_requests=80", "engine.scheduler=static",
                                                   "engine.max_num_seqs=8"])), "static")
    fig = latency_cdfs([fast])
    ttft = fig.axes[0]
    slo = [ln for ln in ttft.get_lines() if ln.get_linestyle() == "--"]
    assert len(slo) == 1 and slo[0].get_xdata()[0] == 500  # the scenario's p99 TTFT <= 500 ms
    assert any("SLO p99 <= 500 ms" in t.get_text() for t in ttft.get_legend().get_texts())
    bars = compare_bars([fast, slow])
    ttft_panel = next(ax for ax in bars.axes if ax.get_title() == "TTFT")
    assert ttft_panel.get_yscale() == "log"  # static's TTFT is orders of magnitude above chunked's
    tput = next(ax for ax in bars.axes if ax.get_title() == "request throughput")
    assert tput.get_yscale() == "linear"


def test_batch_kv_counts_time_from_the_first_arrival_and_an_empty_queue_is_not_a_tiny_axis():
    sc = load_scenario(ROOT / "scenarios/quickstart.yaml", ["workload.num_requests=30", "workload.arrival.rate=1"])
    run = Run.from_result(simulate(sc))
    run.requests["arrival_s"] += 1000.0  # a replayed trace whose clock starts late
    run.steps["start_s"] += 1000.0
    fig = batch_kv(run)
    xs = np.concatenate([ln.get_xdata() for ln in fig.axes[0].get_lines() if len(ln.get_xdata()) > 2])
    assert xs.min() == pytest.approx(run.steps["start_s"].min() - run.requests["arrival_s"].min())
    assert xs.max() < 1000
    assert run.steps["waiting"].max() == 0 and fig.axes[2].get_ylim()[1] >= 1.0
    assert "llama-3-8b, h100-sxm" in fig.axes[0].get_title()


def test_plot_a_sweep_folder(tmp_path):
    from sim.planning.sweep import parse_grid, run_sweep
    from sim.reporting.plots import save_folder_plots, sweep_plot

    grid = parse_grid(["engine.max_num_seqs=8,64", "workload.arrival.rate=4,16"])
    run_sweep(ROOT / "scenarios/quickstart.yaml", grid, tmp_path / "sw", sets=["workload.num_requests=60"],
              workers=1)
    import pandas as pd

    rows = pd.read_csv(tmp_path / "sw" / "results.csv")
    fig = sweep_plot(rows, x="workload.arrival.rate", y="ttft_ms.p99", hue="engine.max_num_seqs")
    ax = fig.axes[0]
    lines = [ln for ln in ax.get_lines() if ln.get_linestyle() == "-"]
    assert sorted(ln.get_label() for ln in lines) == ["engine.max_num_seqs = 64", "engine.max_num_seqs = 8"]
    for ln in lines:
        n = int(ln.get_label().split()[-1])
        part = rows[rows["engine.max_num_seqs"] == n].sort_values("workload.arrival.rate")
        assert ln.get_ydata().tolist() == pytest.approx(part["ttft_ms.p99"].tolist())
    assert any(ln.get_linestyle() == "--" and ln.get_ydata()[0] == 500 for ln in ax.get_lines())  # the SLO
    assert ax.get_yscale() == ("log" if rows["ttft_ms.p99"].max() > 10 * rows["ttft_ms.p99"].min() else "linear")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["4", "16"]  # the grid's own values
    # axes in words, not results.csv's column names
    assert ax.get_xlabel() == "arrival rate (req/s)" and ax.get_ylabel().startswith("p99 TTFT (ms)")
    assert "p99 TTFT (ms) vs arrival rate (req/s)" in ax.get_title()
    written = save_folder_plots(tmp_path / "sw", y="tpot_ms.p50")
    assert [p.name for p in written] == ["sweep_tpot_ms_p50.png"]
    # the table as the folder's reader gives it (an error-free run's error is "", not NaN): the
    # same lines (an empty figure, with a legend warning, when only NaN counted as no error)
    from sim.planning.sweep import read_results
    same = sweep_plot(read_results(tmp_path / "sw" / "results.csv"), x="workload.arrival.rate",
                      y="ttft_ms.p99", hue="engine.max_num_seqs")
    assert sorted(ln.get_label() for ln in same.axes[0].get_lines() if ln.get_linestyle() == "-") == \
        ["engine.max_num_seqs = 64", "engine.max_num_seqs = 8"]
    result = CliRunner().invoke(app, ["plot", str(tmp_path / "sw"), "--x", "engine.block_size"])
    assert result.exit_code == 2 and "--x: 'engine.block_size' is not a column of the sweep" in result.output


def test_report_is_one_self_contained_page(run_dir, tmp_path):
    import re

    result = CliRunner().invoke(app, ["report", str(run_dir)])
    assert result.exit_code == 0, result.output
    page = (run_dir / "report.html").read_text()
    assert len(re.findall(r'<img alt="[^"]+\.png" src="data:image/png;base64,', page)) == 4  # timeline, batch/KV, CDFs, power
    assert "<h2>Summary</h2>" in page and "<h2>Scenario</h2>" in page
    # nothing to fetch from elsewhere: no element loads anything but data (the inlined Plotly library's
    # own code holds `src="` in its strings)
    assert not re.findall(r'<(?:img|script|link|iframe)\b[^>]*\b(?:src|href)="(?!data:)', page)
    bad = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert bad.exit_code == 2 and "not a run, sweep, plan or search folder" in bad.output


def test_a_timeline_of_hundreds_of_slots_draws_the_busiest_and_says_which():
    import servesim
    from sim.reporting.analysis import slot_assignment
    from sim.reporting.plots import MAX_TIMELINE_SLOTS

    result = servesim.run(ROOT / "scenarios/quickstart.yaml", workload__num_requests=1500, engine__max_num_seqs=256,
                          workload__arrival={"process": "poisson", "rate": 40}, cost_model="roofline")
    run = result.as_run()
    fig = slot_timeline(run, max_requests=100_000)  # the whole run: no window
    ax = fig.axes[0]
    slots = slot_assignment(run)
    used = int(slots["slot"].max()) + 1
    assert used > MAX_TIMELINE_SLOTS
    work = (slots["end_it"] - slots["start_it"]).groupby(slots["slot"]).sum()
    busiest = sorted(work.sort_values(ascending=False, kind="stable").index[:MAX_TIMELINE_SLOTS])
    assert ax.get_ylim() == (MAX_TIMELINE_SLOTS - 0.5, -0.5)
    assert f"the {MAX_TIMELINE_SLOTS} busiest of {used} slots used" in ax.get_title()
    assert [int(t.get_text()) for t in ax.get_yticklabels()] == busiest[::8]  # ticks name real slots
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert not any("colour = request" in t for t in legend)  # (10 colours cycle: not one per request)
    assert all(len(line) <= 110 for line in ax.get_title().splitlines())  # no line cut at the edge


def test_pareto_labels_of_points_on_top_of_each_other_are_one_label():
    """Two candidates 0.1% apart (h200 TP4 and TP8 at $121.6/hour, p99 ~495 ms) get one "TP4, TP8"
    label; a point 2% of the span away keeps its own."""
    from sim.planning.search_report import _labels

    at = [(108.0, 468.0), (121.6, 494.6), (121.7, 494.9), (114.0, 488.7), (120.0, 435.0)]
    texts = ["TP4", "TP8", "TP4", "TP2", "TP8"]
    assert _labels(at, texts) == [((108.0, 468.0), "TP4"), ((121.6, 494.6), "TP4, TP8"),
                                  ((114.0, 488.7), "TP2"), ((120.0, 435.0), "TP8")]
    assert _labels([(1.0, 1.0), (1.5, 1.0)], ["TP2", "TP4"]) == [((1.0, 1.0), "TP2"), ((1.5, 1.0), "TP4")]
