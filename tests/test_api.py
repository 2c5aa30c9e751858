"""The public Python API (servesim.py) against the CLI it mirrors: the same runs, byte for byte;
the same checks, with the same one-line messages; the same plan."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

import servesim
from cli import app

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
FILES = ("requests.csv", "steps.csv", "scenario.yaml", "summary.json")
runner = CliRunner()


def files(folder: Path) -> dict[str, bytes]:
    return {f: (folder / f).read_bytes() for f in FILES}


def test_run_writes_what_the_cli_writes_byte_for_byte(tmp_path):
    cli = runner.invoke(app, ["run", str(QUICKSTART), "--out", str(tmp_path / "cli"), "-q", "--seed", "3",
                              "--set", "workload.num_requests=150", "--set", "engine.max_num_seqs=32"])
    assert cli.exit_code == 0, cli.output
    result = servesim.run(QUICKSTART, seed=3, workload__num_requests=150, engine__max_num_seqs=32)
    assert result.write(tmp_path / "api") == tmp_path / "api"
    assert files(tmp_path / "api") == files(tmp_path / "cli")
    # the frames are the files' rows, and the summary counts them
    assert len(result.requests) == result.summary["completed"] == 150
    assert int(result.steps["count"].sum()) == result.summary["iterations"]
    assert result.summary["run"]["overrides"] == ["workload.num_requests=150", "engine.max_num_seqs=32"]


def test_overrides_as_lines_a_mapping_or_keywords_are_the_same_run():
    lines = servesim.run(QUICKSTART, ["workload.num_requests=60", "engine.scheduler=continuous"])
    mapping = servesim.run(QUICKSTART, {"workload.num_requests": 60, "engine.scheduler": "continuous"})
    keywords = servesim.run(QUICKSTART, workload__num_requests=60, engine__scheduler="continuous")
    assert lines.summary["run"]["engine"]["scheduler"] == "continuous"
    for other in (mapping, keywords):
        assert other.requests.equals(lines.requests) and other.steps.equals(lines.steps)


def test_a_mapping_or_a_loaded_scenario_runs_like_its_file(tmp_path):
    import yaml

    raw = yaml.safe_load(QUICKSTART.read_text())
    raw["workload"]["num_requests"] = 40
    from_mapping = servesim.run(raw)
    loaded = servesim.load_scenario(QUICKSTART, workload__num_requests=40)
    from_file = servesim.run(loaded)
    assert from_mapping.requests.equals(from_file.requests)
    with pytest.raises(servesim.ScenarioError, match="a loaded Scenario takes no overrides"):
        servesim.run(loaded, engine__max_num_seqs=8)


@pytest.mark.parametrize("call, cli_args", [
    (lambda: servesim.run(QUICKSTART, engine__max_num_seqs=-5), ["--set", "engine.max_num_seqs=-5"]),
    (lambda: servesim.run(QUICKSTART, engine__schedular="chunked"), ["--set", "engine.schedular=chunked"]),
    (lambda: servesim.run(QUICKSTART, ["engine.max_num_seqs"]), ["--set", "engine.max_num_seqs"]),
])
def test_a_bad_setting_raises_the_clis_one_line_message(tmp_path, call, cli_args):
    with pytest.raises(servesim.ScenarioError) as raised:
        call()
    cli = runner.invoke(app, ["run", str(QUICKSTART), "--out", str(tmp_path / "o"), *cli_args])
    assert cli.exit_code == 2
    assert cli.stderr.strip() == f"error: {raised.value}"
    assert "\n" not in str(raised.value)


def test_one_string_of_overrides_is_refused_not_split_into_characters():
    with pytest.raises(servesim.ScenarioError, match="one string"):
        servesim.run(QUICKSTART, "engine.max_num_seqs=8")


def test_summary_frame_and_plots_take_results_and_variants():
    a = servesim.run(QUICKSTART, workload__num_requests=50)
    runs = servesim.run_variants(QUICKSTART, {"8": ["engine.max_num_seqs=8"], "64": ["engine.max_num_seqs=64"]},
                                 common=["workload.num_requests=50"])
    frame = servesim.summary_frame({"api": a, **runs})
    assert list(frame.index) == ["api", "8", "64"]
    assert frame["completed"].tolist() == [50, 50, 50]
    fig = servesim.plots.latency_cdfs(list(runs.values()))
    assert fig.axes


def test_one_vocabulary_and_last_releases_names_still_answer_with_a_warning(tmp_path):
    """summary_frame's columns are results.csv's (summary.json's, flat); requests.csv's E2E is
    e2el_s; the old names give the same values with a FutureWarning, from the API and from an old
    folder read back."""
    import warnings

    result = servesim.run(QUICKSTART, workload__num_requests=40)
    frame = servesim.summary_frame([result])
    assert frame["ttft_ms.p99"].iloc[0] == result.summary["ttft_ms"]["p99"]
    assert frame["e2el_ms.p50"].iloc[0] == result.summary["e2el_ms"]["p50"]
    assert not [c for c in frame.columns if c.endswith(("_p50_ms", "_p99_ms", "_mean_ms"))]
    with pytest.warns(FutureWarning, match="'ttft_p99_ms' is now 'ttft_ms.p99'"):
        assert frame["ttft_p99_ms"].iloc[0] == result.summary["ttft_ms"]["p99"]
    with pytest.warns(FutureWarning, match="'e2e_p50_ms' is now 'e2el_ms.p50'"):
        assert frame[["e2e_p50_ms"]].iloc[0, 0] == result.summary["e2el_ms"]["p50"]
    rq = result.requests
    # requests.csv keeps last release's e2e_s beside e2el_s for one release (scripts read the file by it)
    assert rq["e2el_s"].tolist() == rq["e2e_s"].tolist() == (rq["finish_s"] - rq["arrival_s"]).tolist()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new names warn of nothing
        rq["e2el_s"], frame["tpot_ms.mean"]
    # a folder written before the rename: read with the column renamed, and said so
    folder = result.write(tmp_path / "old")
    old_frame = pd.read_csv(folder / "requests.csv").drop(columns="e2el_s")
    old_frame.to_csv(folder / "requests.csv", index=False)
    with pytest.warns(FutureWarning, match="written by an earlier servesim; column\\(s\\) e2e_s read as e2el_s"):
        old = servesim.load_run(folder)
    assert old.requests["e2el_s"].tolist() == pytest.approx(rq["e2el_s"].tolist(), rel=1e-12)


def test_plan_returns_what_the_cli_writes_to_plan_json(tmp_path):
    args = dict(slo="ttft_ms=500,tpot_ms=50,percentile=99", horizon_s=10, min_requests=100, resolution=0.2,
                workers=1, seeds=1)
    result = servesim.plan(QUICKSTART, out=tmp_path / "api", **args)
    cli = runner.invoke(app, ["plan", str(QUICKSTART), "--slo", args["slo"], "--horizon-s", "10",
                              "--min-requests", "100", "--resolution", "0.2", "--workers", "1", "--seeds", "1",
                              "--out", str(tmp_path / "cli")])
    assert cli.exit_code == 0, cli.output

    def timeless(doc: dict) -> dict:  # (the wall-clock seconds it took differ from run to run)
        return {k: v for k, v in doc.items() if not k.endswith("wall_s")}
    written = json.loads((tmp_path / "api" / "plan.json").read_text())
    assert timeless(written) == timeless(json.loads((tmp_path / "cli" / "plan.json").read_text()))
    assert written["load_search"]["answer"] == result["load_search"]["answer"] > 0
    assert (tmp_path / "api" / "plan.md").is_file()
    with pytest.raises(servesim.ScenarioError, match="plan: no option 'target'"):
        servesim.plan(QUICKSTART, slo=args["slo"], target=3)


def test_the_installed_module_works_from_another_folder(tmp_path):
    code = (f"import servesim; r = servesim.run({str(QUICKSTART)!r}, workload__num_requests=20); "
            "print(r.summary['completed'], servesim.__version__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["20", servesim.__version__]


def test_presets_by_name_and_a_wrong_name_lists_them():
    from sim.presets.hardware import HARDWARE_PRESETS
    from sim.presets.memory import kv_budget
    from sim.presets.models import MODEL_PRESETS

    got = servesim.kv_budget("llama-3-70b", "h100-sxm", tp=4)
    want = kv_budget(MODEL_PRESETS["llama-3-70b"], HARDWARE_PRESETS["h100-sxm"], tensor_parallel_size=4,
                     gpu_memory_utilization=0.9, block_size=16)
    assert got == want and got.max_concurrent_seqs(4096) > 0
    assert servesim.models is MODEL_PRESETS and servesim.gpus is HARDWARE_PRESETS
    with pytest.raises(servesim.ScenarioError, match="model 'llama-9': not a preset; presets: .*llama-3-8b"):
        servesim.kv_budget("llama-9", "h100-sxm")
    # layouts: the busiest pipeline stage's GPU, a data-parallel rank's with the experts spread
    # (the scenario's budget for the same engine keys: tests/cost/test_pipeline.py, test_expert_parallel.py)
    assert servesim.kv_budget("llama-3-8b", "h100-sxm", pp=2).weight_bytes_per_gpu == 9_080_938_496
    assert servesim.kv_budget("deepseek-v3", "h200", dp=8, ep=True).weight_bytes_per_gpu == 100_840_687_968


@pytest.mark.parametrize("call, says", [
    (lambda s: s.kv_budget("llama-3-8b", "h100-sxm", block_size=3), "--block-size: 3 is not a power of two"),
    (lambda s: s.kv_budget("llama-3-8b", "h100-sxm", pp=1000), "--pp: 1000 is not a number of pipeline stages"),
    (lambda s: s.kv_budget("llama-3-8b", "h100-sxm", dp=2), "--dp: data-parallel ranks are modelled for a "
                                                             "mixture-of-experts model"),
    (lambda s: s.kv_budget("llama-3-8b", "h100-sxm", ep=True), "--ep: llama-3-8b is not a mixture of experts"),
    (lambda s: s.kv_budget("llama-3-8b", "h100-sxm", dp=2, ep=True), "--ep: llama-3-8b is not a mixture of experts"),
    (lambda s: s.step_terms("llama-3-8b", "h100-sxm", s.Batch(num_decodes=4, decode_context_sum=400), tp=-1),
     "--tp: -1 does not divide"),
    (lambda s: s.kv_budget("llama-3-8b", "h100-sxm", tp=3), "--tp: 3 does not divide the 32 attention heads"),
    (lambda s: s.kv_budget("llama-3-8b", "h100-sxm", gpu_memory_utilization=1.5), "--gpu-memory-utilization: 1.5"),
    (lambda s: s.kv_budget("llama-3-8b", "h100-sxm").max_concurrent_seqs(0), "seq_len: 0 is not a whole number"),
    (lambda s: s.kv_budget("llama-3-8b", "h100-sxm").max_concurrent_seqs(-4096), "seq_len: -4096 is not"),
    (lambda s: s.cost_model("measured", "llama-3-8b", "h100-sxm", tp=0), "--tp: 0 does not divide"),
])
def test_the_api_applies_the_clis_checks(call, says):
    """kv_budget and cost_model refuse what `servesim capacity` refuses, with its line (not a
    budget for impossible settings, nor a ZeroDivisionError)."""
    import servesim
    from sim.config.errors import ScenarioError

    with pytest.raises(ScenarioError, match=re.escape(says)):
        call(servesim)


def test_a_cost_model_prices_a_batch_as_the_simulator_does():
    batch = servesim.Batch(num_decodes=64, decode_context_sum=64 * 1025)
    roofline = servesim.cost_model("roofline", "llama-3-8b", "h100-sxm")
    from sim.cost.registry import make_cost_model

    same = make_cost_model("roofline", servesim.models["llama-3-8b"], servesim.gpus["h100-sxm"], 1)
    assert roofline.step_times(batch)[0] == same.step_times(batch)[0] > 0
    terms = servesim.step_terms("llama-3-8b", "h100-sxm", batch)
    assert terms["decode_attention"] > 0 and terms["prefill_attention"] == 0  # decodes only
    # the measured profile is fitted to these same terms (composed): within 10% of their sum
    measured = servesim.cost_model("measured", "llama-3-8b", "h100-sxm").step_times(batch)[0] * 1e3
    assert sum(terms.values()) == pytest.approx(measured, rel=0.10)


def test_plan_search_knobs_are_checked():
    with pytest.raises(servesim.ScenarioError, match="plan: search has no knob 'seedz'; knobs: .*first_seeds"):
        servesim.plan(QUICKSTART, slo="ttft_ms=500", search={"seedz": 1})
