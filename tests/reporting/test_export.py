"""`servesim export --to vllm-bench`: every field `vllm bench serve --save-result --save-detailed`
writes, checked against the run's own files (per-request gaps against its decode times, std
against the requests, the arrival process against the scenario)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cli import app
from sim.reporting.analysis import Run
from sim.reporting.export import request_itls, vllm_bench
from sim.scenario import load_scenario
from sim.simulate import simulate

ROOT = Path(__file__).resolve().parents[2]
S = ROOT / "scenarios"
runner = CliRunner()
VLLM_KEYS = {"date", "backend", "model_id", "num_prompts", "request_rate", "burstiness", "max_concurrency",
             "duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
             "request_goodput", "output_throughput", "total_token_throughput", "input_lens", "output_lens",
             "start_times", "ttfts", "itls", "errors",
             *(f"{stat}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el")
               for stat in ("mean", "median", "std", "p90", "p95", "p99"))}


def test_stepped_run_gaps_are_its_iterations_exactly():
    """Every iteration recorded (no fast-forward), step costs without request handling: each
    request's gaps are the iterations after its first token, summing to its decode time, and all
    gaps together are the summary's ITL."""
    sc = load_scenario(S / "chat-chunked.yaml", ["workload.num_requests=120", "cost_model=roofline"])
    result = simulate(sc, fast_forward=False)
    run = Run.from_result(result)
    itls = request_itls(run)
    rq = run.requests
    assert all(one is not None for one in itls)
    assert [len(one) for one in itls] == (rq["output_tokens"] - 1).tolist()
    decode = (rq["finish_s"] - rq["first_token_s"]).to_numpy()
    assert np.array([sum(one) for one in itls]) == pytest.approx(decode, rel=1e-12, abs=1e-12)
    steps = run.steps
    assert (steps["count"] == 1).all()
    ends = set((steps["start_s"] + steps["duration_s"]).round(12))
    first, gaps = rq["first_token_s"].iloc[7], itls[7]
    assert all(round(first + sum(gaps[:k + 1]), 9) in {round(e, 9) for e in ends} for k in range(len(gaps)))
    flat = np.array([g for one in itls for g in one]) * 1e3
    assert flat.mean() == pytest.approx(result.summary["itl_ms"]["mean"], rel=1e-9)
    doc = vllm_bench(run)
    assert doc["std_itl_ms"] == pytest.approx(float(np.std(flat)), rel=1e-12)


def test_fast_forwarded_run_with_request_handling_keeps_each_decode_time():
    """quickstart: measured costs with vLLM's request handling on every request's times, iterations
    fast-forwarded: each request's gaps still span its decode time exactly (its first and last
    tokens end rows; the iterations within a row are split evenly) and number one per output token
    after the first; all together, the summary's mean ITL."""
    result = simulate(load_scenario(S / "quickstart.yaml", ["workload.num_requests=300"]))
    run = Run.from_result(result)
    assert (run.steps["count"] > 1).any() and result.summary["run"]["cost_model"]["engine_overheads"]["frontend_s"] > 0
    itls = request_itls(run)
    rq = run.requests
    assert all(one is not None for one in itls)
    assert [len(one) for one in itls] == (rq["output_tokens"] - 1).tolist()
    decode = (rq["finish_s"] - rq["first_token_s"]).to_numpy()
    assert np.array([sum(one) for one in itls]) == pytest.approx(decode, rel=1e-12)
    flat = np.array([g for one in itls for g in one]) * 1e3
    # the summary's gaps are the iterations'; the exported ones also hold the engine pauses in each
    # request's decode (stall_s, spread over its gaps: sim/cost/overheads.py)
    paused = 1e3 * float(rq["stall_s"].sum()) / len(flat) if "stall_s" in rq else 0.0
    assert flat.mean() == pytest.approx(result.summary["itl_ms"]["mean"] + paused, rel=1e-9)


def test_a_request_stalled_mid_decode_has_no_gaps_rather_than_wrong_ones():
    """Preemption in a cache of 700 blocks, roofline costs (no request handling: a request's times
    are its iterations' ends), every iteration recorded. A request whose replica ran more iterations
    between its first token and its finish than it has gaps was preempted mid-decode: None. Every
    other request (preempted before its first token, or never) gets exactly its iterations."""
    sc = load_scenario(S / "chat-llama3-8b-h100.yaml", ["workload.num_requests=400", "engine.num_gpu_blocks=700",
                                                         "cost_model=roofline"])
    run = Run.from_result(simulate(sc, fast_forward=False))
    itls = request_itls(run)
    rq, steps = run.requests, run.steps
    ends = (steps["start_s"] + steps["duration_s"]).to_numpy()
    ran = np.array([np.count_nonzero((ends > f + 1e-12) & (ends <= e + 1e-12)) for f, e in
                    zip(rq["first_token_s"], rq["finish_s"])])  # (one replica)
    stalled = ran > rq["output_tokens"].to_numpy() - 1
    assert stalled.any() and (rq["preemptions"].to_numpy()[stalled] > 0).all()
    assert all(itls[i] is None for i in np.flatnonzero(stalled))
    for i in np.flatnonzero(~stalled):
        assert itls[i] is not None and len(itls[i]) == rq["output_tokens"].iloc[i] - 1
        assert sum(itls[i]) == pytest.approx(rq["finish_s"].iloc[i] - rq["first_token_s"].iloc[i], rel=1e-12)


@pytest.mark.parametrize("scenario, overrides, rate, burstiness, users", [
    ("quickstart.yaml", [], 8.0, 1.0, None),
    ("quickstart.yaml", ["workload.arrival={process: gamma, rate: 5, cv: 2}", "workload.time_scale=2"],
     10.0, 0.25, None),
    ("closed-loop-llama3-8b-h100.yaml", [], None, None, 64),
])
def test_the_cli_export_has_every_field_and_the_scenarios_arrivals(tmp_path, scenario, overrides, rate,
                                                                    burstiness, users):
    out = tmp_path / "run"
    sets = [a for o in ["workload.num_requests=150", *overrides] for a in ("--set", o)]
    r = runner.invoke(app, ["run", str(S / scenario), "--out", str(out), "-q", *sets])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["export", str(out), "--to", "vllm-bench"])
    assert r.exit_code == 0, r.output
    doc = json.loads((out / "vllm_bench.json").read_text())
    assert set(doc) == VLLM_KEYS
    assert (doc["request_rate"], doc["burstiness"], doc["max_concurrency"]) == (rate, burstiness, users)
    summary = json.loads((out / "summary.json").read_text())
    assert doc["p95_ttft_ms"] == summary["ttft_ms"]["p95"] and doc["p90_e2el_ms"] == summary["e2el_ms"]["p90"]
    import pandas as pd

    rq = pd.read_csv(out / "requests.csv")
    assert doc["std_ttft_ms"] == pytest.approx(float(np.std(rq["ttft_s"] * 1e3)), rel=1e-12)
    assert doc["std_e2el_ms"] == pytest.approx(float(np.std(rq["e2el_s"] * 1e3)), rel=1e-12)
    goodput = summary.get("goodput")
    assert doc["request_goodput"] == (goodput["requests_per_s"] if goodput else None)
    assert len(doc["itls"]) == 150
