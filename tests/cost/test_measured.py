"""Measured step costs (issue 13): the composer against the kernel tables it reads, the shipped
profiles against the composer, their provenance, and the default cost model."""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from calibrate.measured import SYSTEMS, TABLES
from sim.build import cost_model
from sim.config.errors import ScenarioError
from sim.cost.batch import BatchStats
from sim.cost.composer import (
    KernelTables,
    StepComposer,
    _round,
    attention_sources,
    bracket,
    build_profile,
    heldout_shapes,
)
from sim.cost.measured import PROFILES, load_table_profile, shipped_index
from sim.cost.table_cost import TableProfileCost
from sim.presets.hardware import HARDWARE_PRESETS
from sim.presets.models import MODEL_PRESETS
from sim.scenario import scenario_from_dict
from sim.simulate import simulate
from simhelpers import make_workload


def read_yaml(path: Path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    return yaml.safe_load(data.decode("utf-8")), data

LLAMA3 = MODEL_PRESETS["llama-3-8b"]
H100 = HARDWARE_PRESETS["h100-sxm"]


@pytest.fixture(scope="module")
def h100():
    return KernelTables.load(TABLES / "h100_sxm", H100.hbm_bandwidth)


def _isotonic(y) -> np.ndarray:
    """scipy's least-squares monotone fit: the reference for the composer's own (sim/cost/composer.py)."""
    from scipy.optimize import isotonic_regression
    return isotonic_regression(np.asarray(y, dtype=float)).x


def _reference_grid(frame: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    """The composer's attention grid rebuilt independently: each row's measured points made monotone
    along b, completed on the union of b (interpolated, proportional past its last point), then
    made monotone down each column, then the running maximum along both axes."""
    xs = np.array(sorted(frame[b].unique()), dtype=float)
    rows = []
    for _, g in frame.sort_values([a, b]).groupby(a):
        x, y = g[b].to_numpy(float), _isotonic(g["latency_ms"])
        rows.append(np.where(xs > x[-1], y[-1] * xs / x[-1], np.interp(xs, x, y)))
    dense = np.array(rows)
    dense = np.column_stack([_isotonic(col) for col in dense.T])
    dense = np.maximum.accumulate(np.maximum.accumulate(dense, axis=1), axis=0)
    return pd.DataFrame(dense, index=sorted(frame[a].unique()), columns=xs)


def test_the_monotone_fit_is_scipys_isotonic_regression():
    from sim.cost.composer import isotonic
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 74, 300):
        y = np.cumsum(rng.normal(0.1, 1.0, n))
        assert isotonic(y) == pytest.approx(_isotonic(y), rel=1e-12, abs=1e-12)
    # an outlier is pooled with what follows, not carried to every larger shape
    assert isotonic([1.0, 3.0, 2.0, 2.0, 5.0]).tolist() == pytest.approx([1.0, 7 / 3, 7 / 3, 7 / 3, 5.0])


def test_gemm_is_the_monotone_fit_of_the_measured_points(h100):
    """Llama-3-8B's qkv GEMM per GPU is n = (32 + 2 x 8) x 128 = 6144, k = 4096: both measured. At
    every measured m the composer gives the least-squares monotone fit of the 74 timings, so it is
    exact where they were in order."""
    c = StepComposer(h100, LLAMA3, 1)
    rows = h100.gemm[(h100.gemm["n"] == 6144) & (h100.gemm["k"] == 4096)].sort_values("m")
    assert len(rows) == 74
    fitted = _isotonic(rows["latency_ms"])
    assert [c.gemm_ms("qkv", m) for m in rows["m"]] == pytest.approx(fitted, rel=1e-12)
    exact = np.isclose(fitted, rows["latency_ms"].to_numpy(), rtol=0, atol=1e-15)
    assert exact.sum() >= 20
    # the 8192 x 8192 GEMM (Llama-2-70B's o at TP 1) between m = 8 and 96: measured 0.046-0.048 ms,
    # after an outlier of 0.054 ms at m = 4 (the envelope used before gave 0.054 for all of them)
    big = StepComposer(h100, MODEL_PRESETS["llama-2-70b"], 1)
    assert big.gemm_ms("o", 64) < 0.050


@pytest.mark.parametrize("kv_cache_dtype, rows", [("auto", "bfloat16"), ("fp8", "fp8")])
def test_attention_is_the_monotone_fit_of_the_measured_points(h100, kv_cache_dtype, rows):
    """32 query / 8 kv heads of 128 (Llama-3-8B at TP 1) are measured in both attention tables,
    with a bf16 and with an FP8 KV cache: engine.kv_cache_dtype picks the rows. At each measured
    point the composer gives the grid rebuilt independently (_reference_grid)."""
    c = StepComposer(h100, LLAMA3, 1, kv_cache_dtype=kv_cache_dtype)
    pick = lambda t: t[(t["num_heads"] == 32) & (t["num_kv_heads"] == 8) & (t["kv_cache_dtype"] == rows)  # noqa: E731
                       & (t["head_dim"] == 128)]
    gen, ctx = pick(h100.generation_attention), pick(h100.context_attention)
    ref = _reference_grid(gen, "batch_size", "kv_len")
    for b, kv in zip(gen["batch_size"], gen["kv_len"]):
        assert c.decode_attention_ms(b, b * kv) == pytest.approx(ref.loc[b, float(kv)], rel=1e-9)
    assert len(gen) > 100
    ref = _reference_grid(ctx, "batch_size", "isl")
    for b, s in zip(ctx["batch_size"], ctx["isl"]):
        assert c.prefill_attention_ms([s] * b, [0] * b) == pytest.approx(ref.loc[b, float(s)], rel=1e-9)


def test_mha_decode_attention_is_the_same_blocks_at_a_larger_batch(h100):
    """Llama-2-7B has 32 kv heads; the decode table stops at 8. Two sequences of 32 kv heads are
    read as eight of 8 (the kernels' grid is sequences x kv heads): the measured 8/8 row at batch 8,
    not 4 x its batch-2 time (which would count the launch floor four times)."""
    c = StepComposer(h100, MODEL_PRESETS["llama-2-7b"], 1)
    gen = h100.generation_attention
    row = gen[(gen["num_heads"] == 8) & (gen["num_kv_heads"] == 8) & (gen["kv_cache_dtype"] == "bfloat16")
              & (gen["head_dim"] == 128)]
    ref = _reference_grid(row, "batch_size", "kv_len")
    assert c.decode_attention_ms(2, 2 * 1024) == pytest.approx(ref.loc[8, 1024.0], rel=1e-9)
    assert c.decode_attention_ms(2, 2 * 1024) < 2 * ref.loc[2, 1024.0]
    assert any("at 4x the batch" in n for n in c.notes)


def test_allreduce_is_the_monotone_fit_of_the_measured_points(h100):
    """TP 2: two all-reduces per layer of tokens x 4096 x 2 bytes; at a measured message size the
    term is the monotone fit of the measured latencies (CUDA-graph rows up to 512 tokens)."""
    c = StepComposer(h100, LLAMA3, 2)
    ar = h100.allreduce[(h100.allreduce["num_gpus"] == 2) & (h100.allreduce["backend"] == "vllm_graph")]
    ar = ar.sort_values("message_size")
    fitted = _isotonic(ar["latency_ms"])
    per_token = 4096 * 2
    hits = 0
    for size, latency in zip(ar["message_size"], fitted):
        if size % per_token == 0 and size // per_token <= 512:
            assert c.allreduce_ms(size // per_token) == pytest.approx(latency, rel=1e-12)
            hits += 1
    assert hits >= 5


@pytest.mark.parametrize("system, preset", sorted((s, p) for p, s in SYSTEMS.items()))
def test_composer_is_monotone_in_tokens_batch_and_context(system, preset):
    hw = HARDWARE_PRESETS[preset]
    tables = KernelTables.load(TABLES / system, hw.hbm_bandwidth)
    moe = [("mixtral-8x7b", 4), ("qwen3-30b-a3b", 1)] if tables.moe is not None else []
    moe += [("gpt-oss-20b", 2)] if tables.moe_w4a16_mxfp4 is not None else []
    moe += [("deepseek-v3", 4)] if tables.mla_generation is not None else []  # (TP 8 on L40S: the
    # measured CUDA-graph all-reduce at 512 tokens is slower than the eager one at 513)
    for model, tp in (("llama-3-8b", 1), ("llama-2-7b", 1), ("llama-3-70b", 4), *moe):
        c = StepComposer(tables, MODEL_PRESETS[model], tp)
        prefill = [c.seconds(BatchStats(prefill_lens=np.array([t]), prefill_contexts=np.array([0])))
                   for t in range(1, 16385, 11)]
        decodes = [c.seconds(BatchStats(num_decodes=n, decode_context_sum=n * 900)) for n in range(1, 700)]
        context = [c.seconds(BatchStats(num_decodes=48, decode_context_sum=48 * x))
                   for x in range(2, 40000, 17)]
        chunk_after = [c.seconds(BatchStats(prefill_lens=np.array([512]), prefill_contexts=np.array([p])))
                       for p in range(0, 16000, 97)]
        for series in (prefill, decodes, context, chunk_after):
            assert (np.diff(series) >= 0).all(), (system, model, tp)


def test_attention_sources_by_hand():
    combos = {(8, 8), (4, 4), (32, 8), (24, 4), (32, 4)}
    assert attention_sources(32, 8, combos) == [(32, 8, 1.0, 1.0)]
    assert attention_sources(28, 4, combos) == [(24, 4, 0.5, 1.0), (32, 4, 0.5, 1.0)]  # linear in q heads
    assert attention_sources(32, 32, combos) == [(8, 8, 1.0, 4.0)]  # MHA past the table: 4x the batch
    assert attention_sources(5, 5, combos) == [(4, 4, 1.0, 1.25)]
    assert bracket([1, 2, 4, 8], 3) == (2, 4) and bracket([1, 2, 4], 4) == (4, 4)
    assert bracket([1, 2, 4], 9) == (4, 4)


def test_profiles_reproduce_the_composer_on_heldout_shapes(h100):
    doc = build_profile(h100, LLAMA3, H100, 1, seed=3)
    meta = doc["metadata"]
    assert meta["heldout_shapes"] == 300
    assert meta["heldout_mape"] <= 0.03 and meta["heldout_max_error"] <= 0.10
    # and independently here, on other shapes than the metadata's
    profile = TableProfileCost(load_table_profile(Path("x"), doc, b""))
    composer = StepComposer(h100, LLAMA3, 1)
    errors = [abs(profile.step_times(s)[0] / composer.seconds(s) - 1)
              for s in heldout_shapes(np.random.default_rng(11), 8192, 256, 120)]
    assert np.mean(errors) <= 0.03 and np.max(errors) <= 0.10


def test_fast_forward_runs_price_each_iteration_as_one(h100):
    profile = TableProfileCost(load_table_profile(Path("x"), build_profile(h100, LLAMA3, H100, 1), b""))
    run = profile.step_times(BatchStats(num_decodes=37, decode_context_sum=37 * 700), 25)
    one = [profile.step_times(BatchStats(num_decodes=37, decode_context_sum=37 * (700 + j)))[0]
           for j in range(25)]
    np.testing.assert_allclose(run, one, rtol=1e-12)


SHIPPED = sorted(PROFILES.glob("*/*-tp*.yaml"))


def test_every_preset_gpu_has_profiles():
    index = shipped_index()
    assert set(index) == set(SYSTEMS)
    for gpu, models in index.items():
        assert "llama-3-8b" in models and 1 in models["llama-3-8b"], gpu
    assert len(SHIPPED) >= 100


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_shipped_profile_loads_meets_its_target_and_simulates(path):
    gpu, (model, _, tp) = path.parent.name, path.stem.rpartition("-tp")
    doc, data = read_yaml(path)
    meta = doc["metadata"]
    assert meta["measured"] is True and meta["heldout_mape"] <= 0.03 and meta["heldout_max_error"] <= 0.10
    sc = scenario_from_dict({"model": model, "hardware": gpu, "cost_model": "measured",
                             "engine": {"scheduler": "chunked", "tensor_parallel_size": int(tp),
                                        "max_num_seqs": 16, "max_num_batched_tokens": 1024},
                             "workload": {"arrival": {"process": "poisson", "rate": 20},
                                          "num_requests": 1, "prompt_tokens": {"dist": "fixed", "value": 1},
                                          "output_tokens": {"dist": "fixed", "value": 1}}})
    assert sc.cost_model.profile.source == path
    w = make_workload(np.arange(12) * 0.05, [300, 1200] * 6, [20, 5, 40] * 4)
    r = simulate(sc, workload=w)
    assert r.summary["completed"] == 12 and r.summary["run"]["cost_model"]["measured"]


def test_shipped_profiles_rebuild_identically_from_the_shipped_tables(tmp_path):
    """Nothing invented: a shipped profile is exactly what the composer makes of the tables."""
    for preset, model, tp in (("h100-sxm", "llama-3-8b", 1), ("a100-80gb", "llama-2-70b", 4),
                              ("b200", "qwen2.5-7b", 2), ("h200", "mixtral-8x7b", 2),
                              ("l40s", "qwen3-30b-a3b", 4), ("h200", "llama-3.1-70b-fp8", 2),
                              ("h200", "deepseek-v3", 8), ("h100-sxm", "gpt-oss-20b", 2)):
        system, hw = SYSTEMS[preset], HARDWARE_PRESETS[preset]
        provenance = yaml.safe_load((TABLES / system / "provenance.yaml").read_text())
        doc = build_profile(KernelTables.load(TABLES / system, hw.hbm_bandwidth), MODEL_PRESETS[model],
                            hw, tp, provenance=provenance)
        shipped, _ = read_yaml(PROFILES / preset / f"{model}-tp{tp}.yaml")
        assert _round(doc) == shipped


@pytest.mark.parametrize("system", sorted(SYSTEMS.values()))
def test_provenance_hashes_match_the_csvs(system):
    folder = TABLES / system
    prov = yaml.safe_load((folder / "provenance.yaml").read_text())
    assert prov["package"] == "aiconfigurator-core" and prov["package_version"] == "0.12.0"
    assert len(prov["wheel_sha256"]) == 64
    for name, entry in prov["tables"].items():
        data = (folder / entry["csv"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["csv_sha256"], name
        assert len(pd.read_csv(folder / entry["csv"])) == entry["rows"]
        assert entry["source"].startswith(f"aiconfigurator_core/systems/data/{system}/")
        assert entry["licence"] == "Apache-2.0" and len(entry["source_sha256"]) == 64


def test_the_default_cost_model_is_measured_where_a_profile_is_shipped():
    base = {"model": "llama-3-8b", "hardware": "h100-sxm",
            "workload": {"trace": str(Path(__file__).resolve().parents[2] / "scenarios/traces/toy8.csv")}}
    sc = scenario_from_dict(base)
    assert sc.cost_model.name == "measured" and sc.cost_model.notice is None
    custom = scenario_from_dict({**base, "hardware": {"name": "h100-sxm", "memory_bytes": 80e9,
                                                      "hbm_bandwidth": 2e12, "bf16_flops": 5e14}})
    assert custom.cost_model.name == "roofline"
    assert "estimated (roofline), not measured" in custom.cost_model.notice
    with pytest.raises(ScenarioError, match="cost_model: measured: kernel tables exist for preset GPUs only"):
        scenario_from_dict({**base, "hardware": custom.raw["hardware"], "cost_model": "measured"})
    tuned = scenario_from_dict({**base, "cost_model": {"measured": {"cpu_overhead_s": 0.001}}})
    stats = BatchStats(num_decodes=8, decode_context_sum=8000)
    # the profile's own CPU term is 0 (kernel time only); the tuning adds 1 ms to every iteration
    assert sc.cost_model.profile.cpu_per_iteration == 0.0
    assert (cost_model(tuned).step_times(stats)[0] - cost_model(sc).step_times(stats)[0]
            == pytest.approx(0.001))


def test_quickstart_uses_the_measured_h100_profile_and_says_so(tmp_path):
    import json

    from typer.testing import CliRunner

    from cli import app

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "qs"
    result = CliRunner().invoke(app, ["run", str(root / "scenarios/quickstart.yaml"), "--out", str(out),
                                      "--set", "workload.num_requests=40"])
    assert result.exit_code == 0, result.output
    assert "step costs: measured" in result.output and "note:" not in result.output
    cost = json.loads((out / "summary.json").read_text())["run"]["cost_model"]
    assert cost["name"] == "measured" and cost["measured"] is True
    assert cost["profile"].endswith("sim/profiles/h100-sxm/llama-3-8b-tp1.yaml")
    assert cost["device"] == "NVIDIA H100 80GB HBM3"


def test_moe_layers_are_the_fused_moe_measurements():
    """An MoE layer costs its router GEMM (experts x hidden) plus vLLM's fused MoE kernel as
    measured at that token count (moe.csv, bf16, balanced routing, experts split over TP): at a
    measured count the experts term is the least-squares monotone fit of the rows' latencies there
    (the row itself where the timings were in order); gate/up/down GEMMs are gone."""
    hw = HARDWARE_PRESETS["h100-sxm"]
    tables = KernelTables.load(TABLES / "h100_sxm", hw.hbm_bandwidth)
    m = MODEL_PRESETS["mixtral-8x7b"]
    c = StepComposer(tables, m, 2)
    rows = tables.moe[(tables.moe["hidden_size"] == 4096) & (tables.moe["inter_size"] == 14336)
                      & (tables.moe["topk"] == 2) & (tables.moe["num_experts"] == 8) & (tables.moe["tp"] == 2)]
    assert len(rows) == 27
    rows = rows.sort_values("num_tokens")
    fitted = dict(zip(rows["num_tokens"], _isotonic(rows["latency_ms"])))
    for tokens in (1, 64, 512, 4096):
        assert c.experts_ms(tokens) == pytest.approx(fitted[tokens], rel=1e-12)
    terms = c.terms(BatchStats(num_decodes=64, decode_context_sum=64 * 1000))
    assert "gate_up" not in terms and terms["experts"] == 32 * c.experts_ms(64)
    assert terms["router"] == 32 * c.gemm_ms("router", 64)
    assert [s.n for s in c.shapes if s.name == "router"] == [8]


def test_no_moe_table_means_no_moe_profile():
    """The A100 tables carry no fused-MoE measurements: no profile is composed, and a scenario
    falls back to the roofline with its notice."""
    from sim.cost.registry import default_cost_model

    hw = HARDWARE_PRESETS["a100-80gb"]
    tables = KernelTables.load(TABLES / "a100_sxm", hw.hbm_bandwidth)
    assert tables.moe is None
    with pytest.raises(ValueError, match="no bf16 fused-MoE measurements"):
        StepComposer(tables, MODEL_PRESETS["mixtral-8x7b"], 2)
    spec = default_cost_model(MODEL_PRESETS["mixtral-8x7b"], hw, 2)
    assert spec.name == "roofline" and "no measured profile for mixtral-8x7b on a100-80gb" in spec.notice


def test_fp8_weights_take_the_fp8_gemm_rows():
    """FP8 linear layers: each layer GEMM at a measured (m, n, k) is the monotone fit of the FP8
    rows' latencies there; the LM head stays on the bf16 rows."""
    hw = HARDWARE_PRESETS["h100-sxm"]
    tables = KernelTables.load(TABLES / "h100_sxm", hw.hbm_bandwidth)
    fp8, bf16 = (StepComposer(tables, MODEL_PRESETS[m], 4) for m in ("llama-3.1-70b-fp8", "llama-3-70b"))
    g = tables.gemm_fp8
    for name, n, k in (("o", 8192, 64 * 128 // 4), ("down", 8192, 28672 // 4)):  # measured (n, k)
        rows = g[(g["n"] == n) & (g["k"] == k)].sort_values("m")
        assert len(rows) and [s for s in fp8.shapes if s.name == name][0].n == n
        fitted = dict(zip(rows["m"], _isotonic(rows["latency_ms"])))
        for m in (1, 64, 1024):
            assert fp8.gemm_ms(name, m) == pytest.approx(fitted[m], rel=1e-12)
        # half the bytes where reading weights bounds it (one token); at 1,024 tokens the measured
        # FP8 'down' GEMM is no faster than bf16's (the table's own finding, kept as measured)
        assert fp8.gemm_ms(name, 1) < bf16.gemm_ms(name, 1)
    assert fp8.gemm_ms("lm_head", 8) == bf16.gemm_ms("lm_head", 8)
    a100 = KernelTables.load(TABLES / "a100_sxm", HARDWARE_PRESETS["a100-80gb"].hbm_bandwidth)
    with pytest.raises(ValueError, match="no FP8 GEMM measurements"):
        StepComposer(a100, MODEL_PRESETS["llama-3.1-70b-fp8"], 4)


def _lifted(frame: pd.DataFrame, a: str, b: str):
    """(a, b, value) at every measured point, the value the composer's grid must give there
    (_reference_grid: the measurements made monotone, rebuilt independently)."""
    ref = _reference_grid(frame, a, b)
    for va, vb in zip(frame[a], frame[b]):
        yield va, vb, ref.loc[va, float(vb)]


def test_deepseek_v3_composes_the_mla_module_block_fp8_and_fp8_experts():
    """DeepSeek-V3 at TP 8 on H200: attention is vLLM's measured MLA module at 128 / 8 = 16 heads
    with block-FP8 projections (its own qkv / o GEMMs are not added again); 3 dense layers run a
    gated MLP of 18432 / 8 per GPU, 58 MoE layers a router (256 x 7168, bf16), the shared expert
    (2048 / 8 wide) and the block-FP8 fused experts; the FP8 layer GEMMs are the FP8 rows."""
    hw = HARDWARE_PRESETS["h200"]
    t = KernelTables.load(TABLES / "h200_sxm", hw.hbm_bandwidth)
    c = StepComposer(t, MODEL_PRESETS["deepseek-v3"], 8)
    shapes = {s.name: (s.n, s.k, s.layers, s.dtype) for s in c.shapes}
    assert shapes == {"gate_up": (2 * 18432 // 8, 7168, 3, "fp8"), "down": (7168, 18432 // 8, 3, "fp8"),
                      "router": (256, 7168, 58, "bfloat16"),
                      "shared_gate_up": (2 * 2048 // 8, 7168, 58, "fp8"), "shared_down": (7168, 256, 58, "fp8"),
                      "lm_head": (129280 // 8, 7168, 1, "bfloat16")}
    gen = t.mla_generation.query("gemm_type == 'fp8_block' and num_heads == 16 and kv_cache_dtype == 'bfloat16'")
    checked = 0
    for b, kv, latency in _lifted(gen, "batch_size", "kv_len"):
        assert c.decode_attention_ms(b, b * kv) == pytest.approx(latency, rel=1e-12)
        checked += 1
    assert checked > 50
    ctx = t.mla_context.query("gemm_type == 'fp8_block' and num_heads == 16 and kv_cache_dtype == 'bfloat16'")
    for b, s, latency in _lifted(ctx, "batch_size", "isl"):
        assert c.prefill_attention_ms([s] * b, [0] * b) == pytest.approx(latency, rel=1e-12)
    fp8 = t.gemm_fp8[(t.gemm_fp8["n"] == 7168) & (t.gemm_fp8["k"] == 256)].sort_values("m")  # shared_down
    for m, latency in zip(fp8["m"], _isotonic(fp8["latency_ms"])):
        assert c.gemm_ms("shared_down", m) == pytest.approx(latency, rel=1e-12)
    moe = t.moe_fp8_block.query("hidden_size == 7168 and inter_size == 2048 and topk == 8 "
                                "and num_experts == 256 and tp == 8")
    assert len(moe) == 27
    terms = c.terms(BatchStats(num_decodes=64, decode_context_sum=64 * 1000))
    moe = moe.sort_values("num_tokens")
    fitted = dict(zip(moe["num_tokens"], _isotonic(moe["latency_ms"])))
    assert terms["experts"] == pytest.approx(58 * fitted[64], rel=1e-12)
    assert terms["shared_down"] == 58 * c.gemm_ms("shared_down", 64) and terms["gate_up"] == 3 * c.gemm_ms("gate_up", 64)
    assert "qkv" not in terms and "o" not in terms
    assert terms["decode_attention"] == 61 * c.decode_attention_ms(64, 64 * 1000)


def test_gpt_oss_composes_head_dim_64_attention_and_mxfp4_experts():
    """gpt-oss-20b at TP 1 on H100: 64 query / 8 kv heads of width 64 (the head_dim-64 rows, not
    the 128 ones), bf16 qkv with n = (64 + 2 x 8) x 64, and the MXFP4 fused experts (top-4 of 32,
    2880 wide) as measured."""
    t = KernelTables.load(TABLES / "h100_sxm", H100.hbm_bandwidth)
    c = StepComposer(t, MODEL_PRESETS["gpt-oss-20b"], 1)
    assert [(s.name, s.n, s.k) for s in c.shapes][:3] == [("qkv", 80 * 64, 2880), ("o", 2880, 4096),
                                                           ("router", 32, 2880)]
    gen = t.generation_attention
    gen = gen.query("head_dim == 64 and num_heads == 64 and num_kv_heads == 8 and kv_cache_dtype == 'bfloat16'")
    checked = 0
    for b, kv, latency in _lifted(gen, "batch_size", "kv_len"):
        assert c.decode_attention_ms(b, b * kv) == pytest.approx(latency, rel=1e-12)
        checked += 1
    assert checked > 50
    moe = t.moe_w4a16_mxfp4
    moe = moe.query("hidden_size == 2880 and inter_size == 2880 and topk == 4 and num_experts == 32 and tp == 1")
    assert len(moe) == 27
    moe = moe.sort_values("num_tokens")
    fitted = dict(zip(moe["num_tokens"], _isotonic(moe["latency_ms"])))
    for tokens in (1, 64, 512, 4096):
        assert c.experts_ms(tokens) == pytest.approx(fitted[tokens], rel=1e-12)


def _kv_scenario(gpu: str, kv: str, **extra):
    return scenario_from_dict({"model": "llama-3-8b", "hardware": gpu, **extra,
                               "engine": {"scheduler": "chunked", "kv_cache_dtype": kv},
                               "workload": {"arrival": {"process": "poisson", "rate": 1}, "num_requests": 1,
                                            "prompt_tokens": {"dist": "fixed", "value": 8},
                                            "output_tokens": {"dist": "fixed", "value": 2}}})


def test_fp8_kv_cache_reads_the_profiles_fp8_attention():
    """engine.kv_cache_dtype fp8 on H100: the shipped profile's fp8_kv_cache grids (attention timed
    with an FP8 KV cache) price attention; everything else is the same profile. At a grid point
    the decode term is the grid's value exactly."""
    auto, fp8 = _kv_scenario("h100-sxm", "auto"), _kv_scenario("h100-sxm", "fp8")
    assert fp8.cost_model.name == "measured" and fp8.cost_model.profile.sha256 == auto.cost_model.profile.sha256
    profile = fp8.cost_model.profile
    dec, _ = profile.fp8_kv_cache
    b, c = 64.0, 4096.0  # on the decode grid
    assert b in dec.a.tolist() and c in dec.rows[0].x.tolist()
    stats = BatchStats(num_decodes=64, decode_context_sum=64 * 4096)
    fixed = cost_model(auto).step_times(stats)[0] - profile.decode_attention(b, c)
    assert cost_model(fp8).step_times(stats)[0] == pytest.approx(fixed + dec(b, c), rel=1e-12)
    assert dec(b, c) != profile.decode_attention(b, c)


def test_fp8_kv_cache_without_fp8_rows_falls_back_or_is_refused():
    """The A100 tables time a bf16 KV cache only: by default the roofline prices an FP8 KV cache and
    says why; asking for `measured` is one clear error."""
    sc = _kv_scenario("a100-80gb", "fp8")
    assert sc.cost_model.name == "roofline"
    assert ("no measured profile for llama-3-8b on a100-80gb at tensor_parallel_size=1 with an FP8 KV "
            "cache (") in sc.cost_model.notice and "time a bf16 KV cache only" in sc.cost_model.notice
    with pytest.raises(ScenarioError, match=r"^scenario: cost_model: .*a100-80gb/llama-3-8b-tp1.yaml: has no FP8 "
                                            r"KV-cache attention \(its kernel tables time a bf16 KV cache only\)"):
        _kv_scenario("a100-80gb", "fp8", cost_model="measured")


def test_from_tables_names_what_the_gpus_tables_lack_once(tmp_path):
    """`servesim calibrate --from-tables` for a model whose kernels a GPU's tables do not hold (the
    A100 tables have no MXFP4 fused MoE): one line naming the folder once, exit 2, no file."""
    from typer.testing import CliRunner

    from cli import app

    folder = TABLES / "a100_sxm"
    r = CliRunner().invoke(app, ["calibrate", "--from-tables", str(folder), "--model", "gpt-oss-20b",
                                 "--gpu", "a100-80gb", "--out", str(tmp_path / "p.yaml")])
    assert r.exit_code == 2
    assert r.output.strip() == (f"error: --from-tables {folder}: no MXFP4 fused-MoE "
                                                 f"measurements for this GPU")
    assert not (tmp_path / "p.yaml").exists()


def test_a_model_that_is_not_a_preset_is_composed_from_the_tables_at_load_time(tmp_path):
    """CodeLlama-34B (a config.json; no preset) on H100 at TP 2 gets measured step costs composed
    from the same tables the shipped profiles come from, not the roofline; and says where from."""
    import json
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 48,
           "hidden_size": 8192, "num_attention_heads": 64, "num_key_value_heads": 8,
           "intermediate_size": 22016, "vocab_size": 32000, "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    sc = scenario_from_dict({"model": {"hf_config": str(tmp_path / "config.json"), "name": "codellama-34b"},
                             "hardware": "h100-sxm", "engine": {"tensor_parallel_size": 2},
                             "workload": {"arrival": {"process": "burst"}, "num_requests": 2,
                                          "prompt_tokens": {"dist": "fixed", "value": 300},
                                          "output_tokens": {"dist": "fixed", "value": 4}}})
    assert sc.cost_model.name == "measured" and sc.cost_model.notice is None
    prov = sc.cost_model.provenance()
    assert prov["profile"] == "<composed: codellama-34b on h100-sxm, TP 2>" and prov["measured"] is True
    assert "composed when the scenario was loaded" in sc.cost_model.profile.metadata["notes"][0]
    # the same numbers as a profile built offline from the same tables
    doc = build_profile(KernelTables.load(TABLES / "h100_sxm", H100.hbm_bandwidth), sc.model, H100, 2)
    offline = TableProfileCost(load_table_profile(Path("x"), {**doc, "metadata": {
        "device": "-", "model": "m", "tensor_parallel_size": 2}}, b""))
    stats = BatchStats(prefill_lens=np.array([300]), prefill_contexts=np.array([0]), num_decodes=5,
                       decode_context_sum=5 * 700)
    bare = TableProfileCost(sc.cost_model.profile)
    assert bare.step_times(stats)[0] == offline.step_times(stats)[0]
    # a GPU without tables, or kernels the tables lack, fall back to the roofline and say why
    custom = scenario_from_dict({**sc.raw, "hardware": {"name": "my-gpu", "memory_bytes": 80e9,
                                                        "hbm_bandwidth": 2e12, "bf16_flops": 5e14,
                                                        "interconnect_bandwidth": 4e11}})
    assert custom.cost_model.name == "roofline" and "not measured" in custom.cost_model.notice


def test_a_kernel_table_profile_of_another_model_or_gpu_is_refused(tmp_path):
    """An H100 profile pricing an H200 run, or a Llama profile a Qwen run, went through silently;
    both are refused naming the two. The same model read from its config.json under another name
    is the profile's model."""
    h100 = PROFILES / "h100-sxm" / "llama-3-8b-tp1.yaml"
    base = {"workload": {"arrival": {"process": "burst"}, "num_requests": 1,
                         "prompt_tokens": {"dist": "fixed", "value": 8}, "output_tokens": {"dist": "fixed", "value": 2}},
            "cost_model": {"profile": str(h100)}}
    with pytest.raises(ScenarioError, match="a profile of h100-sxm kernel timings, but the scenario runs on h200"):
        scenario_from_dict({**base, "model": "llama-3-8b", "hardware": "h200"})
    with pytest.raises(ScenarioError, match="a profile of llama-3-8b, but the scenario's model is qwen2.5-7b"):
        scenario_from_dict({**base, "model": "qwen2.5-7b", "hardware": "h100-sxm"})
    cfg = tmp_path / "config.json"
    cfg.write_text((Path(__file__).parents[1] / "fixtures/hf_configs/meta-llama--Meta-Llama-3.1-8B.json").read_text())
    sc = scenario_from_dict({**base, "model": {"hf_config": str(cfg), "name": "my-llama"}, "hardware": "h100-sxm"})
    assert sc.model.name == "my-llama" and sc.cost_model.profile.source == h100


def test_attention_at_an_unmeasured_head_dim_is_linear_between_the_measured_ones(h100):
    """Phi-3-mini's head_dim 96 (the H100 tables time 64, 128 and 256): its attention at every batch
    and length is the mean of the same heads' at 64 and 128 (96 is halfway)."""
    from dataclasses import replace
    tables = h100
    at = {d: StepComposer(tables, replace(LLAMA3, head_dim=d), 1) for d in (64, 96, 128)}
    for n, ctx in ((1, 100), (16, 1000), (256, 5000)):
        s = BatchStats(num_decodes=n, decode_context_sum=n * ctx)
        want = 0.5 * at[64].terms(s)["decode_attention"] + 0.5 * at[128].terms(s)["decode_attention"]
        assert at[96].terms(s)["decode_attention"] == pytest.approx(want, rel=1e-12)
        p = BatchStats(prefill_lens=np.array([ctx]), prefill_contexts=np.array([0]))
        want = 0.5 * at[64].terms(p)["prefill_attention"] + 0.5 * at[128].terms(p)["prefill_attention"]
        assert at[96].terms(p)["prefill_attention"] == pytest.approx(want, rel=1e-12)
    assert any("head_dim 96: linear between the measured 64 (x 0.5) and 128 (x 0.5)" in n for n in at[96].notes)
    past = StepComposer(tables, replace(LLAMA3, head_dim=512), 1)  # past 256: as heads of 256
    assert any("head_dim 512 (measured: 64, 128, 256): 32/8 heads read as 64/16 heads of 256" in n for n in past.notes)


def test_attention_past_the_measured_head_dims_reads_as_heads_of_a_measured_one():
    """The A100 tables time head_dim 128 only: 32 heads / 8 kv heads of 64 read as 16 / 4 heads of 128
    (the same bytes and FLOPs), exactly; one kv head of 64 (no whole number of heads of 128) as the
    time at 128 x 0.5."""
    from dataclasses import replace
    a100 = KernelTables.load(TABLES / "a100_sxm", HARDWARE_PRESETS["a100-80gb"].hbm_bandwidth)
    half = StepComposer(a100, replace(LLAMA3, head_dim=64), 1)
    as_128 = StepComposer(a100, replace(LLAMA3, num_attention_heads=16, num_kv_heads=4), 1)
    mqa = StepComposer(a100, replace(LLAMA3, head_dim=64, num_kv_heads=1, num_attention_heads=8), 1)
    mqa_128 = StepComposer(a100, replace(LLAMA3, num_kv_heads=1, num_attention_heads=8), 1)
    for n, ctx in ((1, 100), (32, 2000)):
        s = BatchStats(num_decodes=n, decode_context_sum=n * ctx)
        assert half.terms(s)["decode_attention"] == as_128.terms(s)["decode_attention"]
        assert mqa.terms(s)["decode_attention"] == pytest.approx(0.5 * mqa_128.terms(s)["decode_attention"], rel=1e-12)
    assert any("32/8 heads read as 16/4 heads of 128" in n for n in half.notes)
    assert any("the time at 128 x 0.5" in n for n in mqa.notes)
