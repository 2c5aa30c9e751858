"""`servesim validate --engine vllm`: the adapter between servesim and real vLLM.

The fixture tests/fixtures/vllm/ is a real run: vllm_raw.json is what calibrate/vllm_driver.py wrote
when real vLLM 0.32.0 (CPU) ran scenario.yaml (16 requests in a burst into 24 KV blocks: chunked
prompts and preemptions). The tests check vLLM's record against its own knobs and our reading of
it; the test marked `vllm` runs vLLM itself when .vllm-venv exists (`bash calibrate/vllm_setup.sh`,
then `pytest -m vllm`).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from calibrate import vllm_engine
from calibrate.real_run import write_real
from sim.config.errors import ScenarioError
from sim.runtime.metrics import REQUEST_COLUMNS
from sim.runtime.recorder import STEP_COLUMNS
from sim.scenario import load_scenario
from sim.workload.generators import Workload, build_workload

ROOT = Path(__file__).resolve().parents[2]
FIX = Path(__file__).parents[1] / "fixtures" / "vllm"


def _driver():
    spec = importlib.util.spec_from_file_location("vllm_driver", ROOT / "calibrate" / "vllm_driver.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # stdlib only at import: vLLM is imported inside run()
    return module


@pytest.fixture(scope="module")
def fixture():
    sc = load_scenario(FIX / "scenario.yaml")
    wl = build_workload(sc.workload, np.random.default_rng(sc.seed))
    raw = json.loads((FIX / "vllm_raw.json").read_text())
    return sc, wl, raw, vllm_engine.to_real_run(raw, sc, wl)


def test_schema(fixture):
    sc, wl, raw, real = fixture
    r = real.result
    assert list(r.requests.columns) == list(REQUEST_COLUMNS)
    assert list(r.steps.columns) == list(STEP_COLUMNS)
    assert len(r.requests) == len(wl) == len(raw["requests"])
    assert len(r.steps) == len(r.stats) == len(r.step_s) == len(raw["iterations"])
    assert r.summary["completed"] == len(wl)


def test_vllm_obeys_the_mapped_knobs(fixture):
    """What vLLM did stays inside the scenario's engine settings: the mapping is right."""
    sc, wl, raw, real = fixture
    e = sc.engine
    steps = real.result.steps
    assert (steps["num_seqs"] <= e.max_num_seqs).all()
    assert (steps["prefill_tokens"] + steps["decode_tokens"] <= e.max_num_batched_tokens).all()
    assert steps["kv_blocks_used"].max() <= sc.budget.num_gpu_blocks
    assert steps["kv_blocks_total"].eq(sc.budget.num_gpu_blocks).all()
    assert (steps["prefill_tokens"] > 0).any() and (steps["decode_tokens"] > 0).any()


def test_every_request_computes_its_tokens_in_order(fixture):
    """Per request, each iteration continues where the last stopped (context = previous context +
    tokens), except right after a preemption, when it restarts lower: at 0, or at the whole blocks
    of its own that were still cached (a prefix-cache hit on resumption); the last step computes
    token prompt + output - 1 (the last sampled token is never fed back)."""
    sc, wl, raw, real = fixture
    seen: dict[int, list[tuple[int, int]]] = {}
    for it in raw["iterations"]:
        for i, tokens, ctx in it["scheduled"]:
            seen.setdefault(i, []).append((tokens, ctx))
    restarts = hits = 0
    for i, steps in seen.items():
        assert steps[0][1] == 0
        for (t0, c0), (_t1, c1) in zip(steps, steps[1:]):
            if c1 != c0 + t0:
                assert c1 < c0 + t0 and c1 % sc.engine.block_size == 0, (i, steps)
                restarts += 1
                hits += c1 > 0
        tokens, ctx = steps[-1]
        assert ctx + tokens == wl.prompt_tokens[i] + wl.output_tokens[i] - 1
    recorded = int(real.result.requests["preemptions"].sum())
    assert restarts == recorded > 0  # the fixture preempts, and every preemption is a restart
    assert hits > 0                  # and at least one resumption found its own blocks cached


def test_first_token_is_the_end_of_the_last_prompt_chunk(fixture):
    sc, wl, raw, real = fixture
    rq = real.result.requests
    for i in range(len(wl)):
        end = next(it["returned_s"] for it in raw["iterations"]
                   for j, tokens, ctx in it["scheduled"] if j == i and ctx + tokens == wl.prompt_tokens[i])
        assert rq.loc[i, "first_token_s"] == pytest.approx(end)
        assert rq.loc[i, "ttft_s"] == pytest.approx(end - wl.arrival_s[i])
        times = raw["requests"][i]["token_s"]
        assert rq.loc[i, "finish_s"] == times[-1] and len(times) == wl.output_tokens[i]


def test_batch_stats_split_decodes_from_chunks(fixture):
    """A decode is one token after the prompt; everything else is a prefill chunk. Tokens add up."""
    sc, wl, raw, real = fixture
    for it, stats in zip(raw["iterations"], real.result.stats):
        decodes = [(t, c) for i, t, c in it["scheduled"] if t == 1 and c >= wl.prompt_tokens[i]]
        assert stats.num_decodes == len(decodes)
        assert stats.decode_context_sum == sum(c + 1 for _, c in decodes)
        assert stats.total_tokens == sum(t for _, t, _ in it["scheduled"])


def test_fit_profile_on_vllm_iterations(fixture):
    sc, wl, raw, real = fixture
    prof, meta, fit = vllm_engine.fit_profile(real, sc)
    assert meta["model"] == sc.model.name and meta["measured"] is True
    assert 0 <= meta["heldout_mape"] < 1
    rows = vllm_engine.iteration_rows(real)
    predicted = fit.predict(rows)
    assert (predicted > 0).all()
    # in-sample, the fit is unbiased to within 10% in total time
    assert predicted.sum() == pytest.approx(rows["step_ms"].sum() / 1e3, rel=0.1)


def test_job_maps_knobs(fixture, tmp_path):
    sc, wl, raw, real = fixture
    j = vllm_engine.job(sc, wl, tmp_path, "cpu")
    e = j["engine"]
    assert e["enable_chunked_prefill"] is True
    assert e["num_gpu_blocks"] == sc.budget.num_gpu_blocks == 24
    assert (e["max_num_seqs"], e["max_num_batched_tokens"], e["block_size"]) == (8, 128, 32)
    assert e["enable_prefix_caching"] is True  # None: the scheduler's default, on as in vLLM V1
    longest = int((wl.prompt_tokens + wl.output_tokens).max())
    assert e["max_model_len"] == -(-longest // 32) * 32
    assert j["requests"][3] == [float(wl.arrival_s[3]), int(wl.prompt_tokens[3]), int(wl.output_tokens[3])]
    cont = dataclasses.replace(sc, engine=dataclasses.replace(sc.engine, scheduler="continuous",
                                                               enable_prefix_caching=False))
    jc = vllm_engine.job(cont, wl, tmp_path, "cpu")["engine"]
    assert jc["enable_chunked_prefill"] is False and jc["enable_prefix_caching"] is False
    assert jc["max_model_len"] <= 128  # vLLM: budget >= max_model_len without chunking


def test_model_config_is_the_scenario_model(fixture):
    sc = fixture[0]
    c = vllm_engine.model_config(sc)
    m = sc.model
    assert (c["num_hidden_layers"], c["hidden_size"], c["num_attention_heads"],
            c["num_key_value_heads"], c["intermediate_size"], c["vocab_size"]) == (12, 768, 12, 4, 2048, 32000)
    assert c["architectures"] == ["LlamaForCausalLM"] and m.num_params == pytest.approx(124.67e6, rel=1e-3)


def test_prompt_ids_share_exactly_the_prefix():
    d = _driver()
    a = d.prompt_ids(0, 100, 32000, [[11, 12], 32])
    b = d.prompt_ids(1, 90, 32000, [[11, 13], 32])
    c = d.prompt_ids(2, 100, 32000, None)
    assert a[:32] == b[:32] and a[32:64] != b[32:64]
    assert len(a) == 100 and len(b) == 90 and all(0 < t < 32000 for t in a + b + c)
    assert a[64:] != c[64:] and d.prompt_ids(0, 100, 32000, None) != d.prompt_ids(1, 100, 32000, None)


@pytest.mark.parametrize("override, says", [
    ("engine.scheduler=static", "iteration-level"),
    ("engine.replicas=2", "one replica"),
    ("engine.tensor_parallel_size=2", "one device"),
    ("engine.block_size=16", "multiple of 32"),
    ("engine.policy=priority", "fcfs"),
    ("engine.num_gpu_blocks=2", "does not fit"),
])
def test_refusals(override, says):
    sc = load_scenario(FIX / "scenario.yaml", overrides=[override])
    wl = build_workload(sc.workload, np.random.default_rng(sc.seed))
    with pytest.raises(ScenarioError, match=says):
        vllm_engine.check_vllm_scenario(sc, wl)


def test_closed_loop_refused(fixture):
    sc, wl, raw, real = fixture
    closed = Workload(arrival_s=np.full(2, np.nan), prompt_tokens=np.array([8, 8]),
                      output_tokens=np.array([4, 4]), priority=np.zeros(2, dtype=np.int64))
    with pytest.raises(ScenarioError, match="closed loop"):
        vllm_engine.check_vllm_scenario(sc, closed)


def _cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, str(ROOT / "cli.py"), "validate", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd)


def test_cli_errors(tmp_path):
    bad = _cli(FIX / "scenario.yaml", "--engine", "sglang", "--out", tmp_path / "o")
    assert bad.returncode == 2 and "--engine 'sglang': allowed: servesim, vllm" in bad.stderr
    missing = _cli(FIX / "scenario.yaml", "--engine", "vllm", "--vllm-venv", tmp_path / "none",
                   "--out", tmp_path / "o")
    assert missing.returncode == 2 and "no vLLM virtualenv there" in missing.stderr
    assert "Traceback" not in missing.stderr and not (tmp_path / "o").exists()
    static = _cli(FIX / "scenario.yaml", "--engine", "vllm", "--set", "engine.block_size=16",
                  "--out", tmp_path / "o")
    assert static.returncode == 2 and "multiple of 32" in static.stderr


def test_compare_only_on_the_fixture(fixture, tmp_path):
    """The simulator half on vLLM's recorded run: a profile fitted on its iterations, the same
    requests simulated, the comparison with a verdict, preemptions on both sides."""
    sc, wl, raw, real = fixture
    write_real(real, tmp_path / "v")
    done = _cli(FIX / "scenario.yaml", "--engine", "vllm", "--compare-only", tmp_path / "v")
    assert done.returncode == 0, done.stderr
    md = (tmp_path / "v" / "comparison.md").read_text()
    assert "Verdict:" in md and "vLLM 0.32.0" in md
    import pandas as pd
    table = pd.read_csv(tmp_path / "v" / "comparison.csv").set_index(["metric", "stat"])
    assert table.loc[("preemptions", "count"), "real"] == real.result.requests["preemptions"].sum()
    assert table.loc[("preemptions", "count"), "sim"] > 0
    assert table.loc[("iterations", "count"), "real"] == len(raw["iterations"])
    assert (tmp_path / "v" / "profile.yaml").exists()


def test_the_driver_run_as_a_script_imports_nothing_from_its_folder(tmp_path):
    """The driver runs in vLLM's venv as `python calibrate/vllm_driver.py`, which puts calibrate/
    first on sys.path: a calibrate/requests.py once hid PyPI's `requests` from vLLM, and every real
    run failed with "No module named 'sim'". A stand-in vLLM here records where the modules it
    imports come from, then stops the driver (exit 3)."""
    fake = tmp_path / "site" / "vllm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "import json, os, sys\n"
        "import importlib.util as u\n"
        "calibrate = os.environ['CALIBRATE_DIR']\n"
        "spots = {n: (u.find_spec(n).origin if u.find_spec(n) else None) for n in json.loads(os.environ['NAMES'])}\n"
        "open(os.environ['SEEN'], 'w').write(json.dumps({'path': sys.path, 'spots': spots}))\n"
        "sys.exit(3)\n")
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"model_dir": str(tmp_path), "engine": {}, "requests": [], "seed": 0,
                               "clock": "cpu", "vocab_size": 10, "prefix": None}))
    calibrate = ROOT / "calibrate"
    names = sorted(p.stem for p in calibrate.glob("*.py") if p.stem != "__init__")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path / "site"), "CALIBRATE_DIR": str(calibrate),
           "NAMES": json.dumps(names), "SEEN": str(tmp_path / "seen.json")}
    done = subprocess.run([sys.executable, str(calibrate / "vllm_driver.py"), str(job), str(tmp_path / "out.json")],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr[-2000:]  # it reached `import vllm`, the stand-in's exit
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert str(calibrate) not in [str(Path(p or ".").resolve()) for p in seen["path"]]
    shadowed = {n: where for n, where in seen["spots"].items() if where and Path(where).parent == calibrate}
    assert shadowed == {}


@pytest.mark.vllm
def test_real_vllm_end_to_end(tmp_path):
    """Real vLLM on the fixture's scenario (about 1.5 min: engine start-up and compilation)."""
    venv = vllm_engine.default_venv()
    if not (venv / "bin" / "python").exists():
        pytest.skip(f"no vLLM venv at {venv}: bash calibrate/vllm_setup.sh")
    done = _cli(FIX / "scenario.yaml", "--engine", "vllm", "--out", tmp_path / "v")
    assert done.returncode == 0, done.stderr[-2000:]
    sc = load_scenario(FIX / "scenario.yaml")
    wl = build_workload(sc.workload, np.random.default_rng(sc.seed))
    raw = json.loads((tmp_path / "v" / "real" / vllm_engine.RAW_FILE).read_text())
    real = vllm_engine.to_real_run(raw, sc, wl)  # raises unless every request got its tokens
    assert real.result.requests["preemptions"].sum() > 0
    md = (tmp_path / "v" / "comparison.md").read_text()
    assert "Verdict:" in md
    # every arrival is at 0, so what vLLM batches does not depend on its timing: the simulator's
    # scheduler, priced with vLLM's own iteration times, must batch every iteration as vLLM did
    from calibrate.validate import scheduling_replay

    rep = scheduling_replay(sc, real)
    assert rep["identical"] == rep["iterations_real"] == rep["iterations_sim"], rep


def test_scheduling_replay_is_exact_on_the_fixture(fixture):
    """The simulator's scheduler priced with vLLM's own iteration durations batches every one of
    vLLM's iterations identically (chunks, contexts, decodes, preemptions and resumption hits), so
    every request's first token and finish land within the driver's bookkeeping (< 1 ms)."""
    from calibrate.validate import scheduling_replay

    sc, wl, raw, real = fixture
    rep = scheduling_replay(sc, real)
    assert rep["identical"] == rep["iterations_real"] == rep["iterations_sim"] == len(raw["iterations"])
    assert rep["kv_identical"] == rep["iterations_real"]  # the same KV blocks in use, every iteration
    assert rep["max_first_token_diff_s"] < 1e-3 and rep["max_finish_diff_s"] < 1e-3


@pytest.mark.parametrize("override", ["engine.scheduler_reserve_full_isl=false",
                                      "engine.enable_prefix_caching=false"])
def test_replay_diverges_without_vllm_semantics(fixture, override):
    """Each of the two semantics found against vLLM matters on the fixture: without the full-
    sequence admission gate, or without the resumed request hitting its own cached blocks, the
    simulator batches differently from vLLM."""
    from calibrate.validate import scheduling_replay

    sc, wl, raw, real = fixture
    other = load_scenario(FIX / "scenario.yaml", overrides=[override])
    real_other = dataclasses.replace(real, workload=wl)
    rep = scheduling_replay(other, real_other)
    assert rep["first_difference"] is not None and rep["identical"] < rep["iterations_real"]


WINDOW = Path(__file__).parents[1] / "fixtures" / "vllm_window"


def test_sliding_window_replay_is_exact_against_vllm():
    """Real vLLM with a 64-token window on every layer (its SlidingWindowManager): the simulator's
    windowed cache, priced with vLLM's own iteration times, batches all 680 iterations as vLLM did,
    with the same KV blocks in use in each and the same 10 preemptions. Two semantics make it so:
    the blocks behind the window are freed, and only as vLLM's pass over the running requests
    reaches each one (iteration 341 preempts on that order)."""
    from calibrate.validate import scheduling_replay

    sc = load_scenario(WINDOW / "scenario.yaml")
    wl = build_workload(sc.workload, np.random.default_rng(sc.seed))
    raw = json.loads((WINDOW / "vllm_raw.json").read_text())
    real = vllm_engine.to_real_run(raw, sc, wl)
    assert real.result.requests["preemptions"].sum() == 10
    rep = scheduling_replay(sc, real)
    assert rep["identical"] == rep["iterations_real"] == rep["iterations_sim"] == len(raw["iterations"]) == 680
    assert rep["kv_identical"] == 680
    assert rep["max_first_token_diff_s"] < 1e-3 and rep["max_finish_diff_s"] < 1e-3
    # the same requests on a full-attention model batch differently from iteration 2 on
    full = load_scenario(WINDOW / "scenario.yaml", overrides=["model.sliding_window=0"])
    rep = scheduling_replay(full, dataclasses.replace(real, workload=wl))
    assert rep["first_difference"] == 2


def test_job_gives_prefix_units_integer_ids(fixture, tmp_path):
    """Generated system prompts name their unit by a tuple: the job numbers distinct units 1, 2, ...
    so that the driver builds the same tokens for the same unit (and vLLM's hashes match)."""
    sc, wl, raw, real = fixture
    prefix = [((("prefix", 0),), 64), None, ((("prefix", 1),), 32), ((("prefix", 0),), 64)]
    w2 = dataclasses.replace(wl, prefix=prefix + [None] * (len(wl) - 4))
    j = vllm_engine.job(sc, w2, tmp_path, "cpu")
    assert j["prefix"][:4] == [[[1], 64], None, [[2], 32], [[1], 64]]
    d = _driver()
    a, b = (d.prompt_ids(i, 80, 32000, j["prefix"][i]) for i in (0, 3))
    assert a[:64] == b[:64] and a[64:] != b[64:]
