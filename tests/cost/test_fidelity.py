"""The fidelity benchmark's guard (bench/fidelity.py): a stable subset of the published real-vLLM
H100 runs, simulated with the default cost model, must stay within issue 33's bounds; plus the
benchmark's own pieces, checked by hand."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import fidelity  # noqa: E402
from calibrate.overheads import Result, best_frontend, loss  # noqa: E402

RUNS = fidelity.load_runs()
BY_NAME = {s["stage"]: s for s in RUNS["stages"]}
# one sustained stage per model (lowest load: the quickest), and one the real server could not
# sustain
GUARD = ["llama-2-7b-tp1-codegen-s0", "llama-2-70b-tp4-codegen-s0", "mixtral-8x7b-tp2-codegen-s0",
         "codellama-34b-tp2-codegen-s0"]


@pytest.fixture(scope="module")
def guard(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fidelity")
    return {s: fidelity.simulate_stage(RUNS, BY_NAME[s], None, folder) for s in GUARD}


@pytest.mark.parametrize("name", GUARD)
def test_the_default_cost_model_stays_within_the_bounds(guard, name):
    r = guard[name]
    assert not r.real_overloaded and not r.sim_overloaded
    assert abs(r.error["tpot_mean_ms"]) <= 0.10, r.error
    assert abs(r.error["e2e_p50_s"]) <= 0.10, r.error
    assert abs(r.error["ttft_p50_ms"]) <= 0.15, r.error


def test_the_ground_truth_table_is_the_published_one():
    """Spot values of the committed table against the figures quoted in issue 33 (from the source
    files named in each stage)."""
    assert len(RUNS["stages"]) == 24 and RUNS["commit"].startswith("ed5c1d2")
    s = BY_NAME["llama-2-7b-tp1-codegen-s0"]
    real = fidelity.real_metrics(s)
    assert real["tpot_mean_ms"] == pytest.approx(7.26, abs=0.005)
    assert real["ttft_p50_ms"] == pytest.approx(24.26, abs=0.01)
    assert sum(fidelity.real_overloaded(s) for s in RUNS["stages"]) == 4  # the reasoning stages


def test_prompt_lengths_read_off_the_quantiles_by_hand():
    stage = {"distinct_prompts": 4, "prompt_len": {"min": 100, "median": 200, "max": 300}}
    # inverse CDF at 0.125, 0.375, 0.625, 0.875 on the line (0, 100) (0.5, 200) (1, 300)
    assert fidelity.prompt_lengths(stage).tolist() == [125, 175, 225, 275]


def test_the_trace_cycles_the_distinct_prompts_with_their_prefix_ids(tmp_path):
    stage = {**BY_NAME["llama-2-7b-tp1-codegen-s0"], "requests": 250}
    fidelity.write_trace(stage, tmp_path / "t.jsonl")
    import json
    lines = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert len(lines) == 250 and lines[1]["timestamp"] == pytest.approx(200.0)  # 5 req/s, in ms
    assert lines[100]["hash_ids"] == lines[0]["hash_ids"] and lines[0]["hash_ids"] != lines[1]["hash_ids"]
    assert len(lines[0]["hash_ids"]) == -(-lines[0]["input_length"] // 16)
    assert {x["output_length"] for x in lines} == {247}


def test_a_later_stage_starts_with_every_prompt_cached_and_is_judged_on_its_own(tmp_path):
    """-s1 ran on the server that had just served -s0 the same prompts: its trace sends each of the
    100 distinct prompts once (1/rate s apart), waits WARM_GAP_S, then the stage's own requests."""
    stage = {**BY_NAME["llama-2-7b-tp1-codegen-s1"], "requests": 250}  # 10 req/s
    assert fidelity.follows(stage) and not fidelity.follows(BY_NAME["llama-2-7b-tp1-codegen-s0"])
    start = fidelity.stage_start(stage)
    assert start == pytest.approx(99 / 10 + 60.0)
    fidelity.write_trace(stage, tmp_path / "t.jsonl")
    import json
    lines = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert len(lines) == 100 + 250
    assert lines[99]["timestamp"] == pytest.approx(9900.0) and lines[100]["timestamp"] == pytest.approx(69900.0)
    assert {tuple(x["hash_ids"]) for x in lines[:100]} == {tuple(x["hash_ids"]) for x in lines[100:200]}
    # the stage's own requests are the same cycle an -s0 trace has, shifted by start
    assert lines[100]["hash_ids"] == lines[0]["hash_ids"] and lines[101]["timestamp"] == pytest.approx(70000.0)
    small = {**stage, "requests": 300}
    r = fidelity.simulate_stage(RUNS, small, None, tmp_path / "sim")
    assert r.times is None and r.sim["ttft_p50_ms"] > 0
    kept = fidelity.simulate_stage(RUNS, small, None, tmp_path / "sim", keep_times=True).times
    assert len(kept["arrival_s"]) == 300 and kept["arrival_s"].min() == pytest.approx(start)
    # every one of its prompts was served from the prefix cache: no TTFT as slow as a cold prefill
    cold = fidelity.simulate_stage(RUNS, {**small, "stage": "llama-2-7b-tp1-codegen-s0"}, None, tmp_path / "cold")
    assert r.sim["ttft_p99_ms"] < cold.sim["ttft_p99_ms"]


def test_the_frontend_is_solved_without_simulating():
    """Two sustained runs whose simulated TTFT is 10 and 20 ms short and E2E as much: the loss is
    minimised at the frontend that splits them."""
    real = {"ttft_p50_ms": 50.0, "tpot_mean_ms": 10.0, "e2e_p50_s": 2.0}
    runs = [Result({"stage": f"s{i}", "model": "m"}, real,
                   {"ttft_p50_ms": 50.0 - d, "tpot_mean_ms": 10.0, "tpot_p50_ms": 10.0,
                    "e2e_p50_s": 2.0 - d / 1e3, "e2e_p90_s": 2.0}, False, False) for i, d in enumerate((10, 20))]
    f, value = best_frontend(runs)
    assert 0.010 <= f <= 0.020
    # any f in [10, 20] ms leaves 10 ms of TTFT error in all (|f - 10| + |20 - f| over 50 ms) and
    # 10 ms of E2E error (over 2 s), over 6 errors (3 metrics x 2 runs)
    assert value == pytest.approx((10 / 50 + 0.010 / 2) / 6, abs=1e-9)
    assert loss(runs, 0.0) > value


def test_the_whole_benchmark_meets_issue_33s_gate(tmp_path):
    """Every stage (~15 s of CPU): median |error| over the sustained stages <= 10% for mean TPOT
    and median E2E, <= 15% for median TTFT, and no stage mis-classified."""
    results = fidelity.simulate_stages(RUNS, RUNS["stages"], None, tmp_path)
    s = fidelity.summarise(results)
    m = s["median_abs_error"]
    assert s["misclassified"] == [] and s["sustained"] == 20
    assert m["tpot_mean_ms"] <= 0.10 and m["e2e_p50_s"] <= 0.10 and m["ttft_p50_ms"] <= 0.15, m
