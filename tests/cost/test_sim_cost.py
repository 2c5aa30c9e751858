"""Step-cost models: unit, roofline (checked against hand formulas), profile (parsing + errors),
the steps-vectorisation contract, and monotonicity."""
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.build import cost_model
from sim.config.errors import ScenarioError
from sim.cost.batch import BatchStats
from sim.cost.registry import (
    COST_MODELS,
    ProfileCost,
    RooflineCost,
    UnitCost,
    load_profile,
    make_cost_model,
    prefill_attention_work,
)
from sim.cost.table_cost import TableProfileCost
from sim.presets.hardware import HARDWARE_PRESETS
from sim.presets.models import MODEL_PRESETS
from simhelpers import make_scenario

EXAMPLE = Path(__file__).parents[2] / "scenarios/profiles/example-h100-llama-3-8b.yaml"
LLAMA3, H100 = MODEL_PRESETS["llama-3-8b"], HARDWARE_PRESETS["h100-sxm"]
EFF_FLOPS, EFF_BW = 989e12 * 0.7, 3.35e12 * 0.85  # default efficiencies


def batch(prefill=(), contexts=None, decodes=0, ctx_sum=0):
    lens = np.array(prefill, dtype=np.int64)
    ctxs = np.zeros_like(lens) if contexts is None else np.array(contexts, dtype=np.int64)
    return BatchStats(prefill_lens=lens, prefill_contexts=ctxs, num_decodes=decodes,
                      decode_context_sum=ctx_sum)


def test_unit_cost_counts_iterations():
    np.testing.assert_array_equal(UnitCost().step_times(batch([5]), 1), [1.0])
    np.testing.assert_array_equal(UnitCost().step_times(batch(decodes=3, ctx_sum=9), 4), [1.0] * 4)


def test_roofline_decode_batch1_is_bandwidth_bound():
    t = RooflineCost(LLAMA3, H100).step_times(batch(decodes=1, ctx_sum=1024))[0]
    # Weights read once: 32 layers x 218,103,808 + lm_head 128256 x 4096, 2 bytes each.
    weights = (32 * 218_103_808 + 128256 * 4096) * 2
    kv = (1024 + 1) * 131_072  # context read + one new token written
    expected = 2e-3 + 5e-6 + weights / EFF_BW + kv / EFF_BW
    assert t == pytest.approx(expected, rel=1e-12)
    assert t - 2e-3 == pytest.approx(16e9 / EFF_BW, rel=0.1)  # the "~5.6 ms" envelope


def test_roofline_prefill_8k_is_compute_bound():
    t = RooflineCost(LLAMA3, H100).step_times(batch([8192]))[0]
    linear = 2 * (32 * 218_103_808 * 8192 + 128256 * 4096 * 1) / EFF_FLOPS  # logits: 1 row
    attention = 4 * 32 * 32 * 128 * (8192 * 8193 / 2) / EFF_FLOPS
    assert t == pytest.approx(2e-3 + 5e-6 + linear + attention, rel=1e-12)
    assert linear == pytest.approx(2 * 8e9 * 8192 / EFF_FLOPS, rel=0.15)  # the "~190 ms"
    assert 0.17 < t < 0.22


def test_roofline_tensor_parallel_adds_allreduce():
    m70 = MODEL_PRESETS["llama-3-70b"]
    one = RooflineCost(m70, H100, 4, allreduce_latency_s=0.0)
    lat = RooflineCost(m70, H100, 4)
    b = batch(decodes=8, ctx_sum=8000)
    # 160 all-reduces of 8 tokens x 8192 x 2 bytes, ring factor 2 x 3/4, at 450e9 x 0.7 B/s
    ring = 160 * 1.5 * 8 * 8192 * 2 / (450e9 * 0.7)
    no_comm = RooflineCost(m70, H100, 1)._weight_read_s / 4  # weights split over 4 ranks
    assert lat.step_times(b)[0] - one.step_times(b)[0] == pytest.approx(160 * 10e-6)
    assert one.step_times(b)[0] == pytest.approx(
        2e-3 + 8 * 5e-6 + no_comm + ring + (8000 + 8) * (327_680 / 4) / EFF_BW, rel=1e-9)


def test_prefill_attention_work():
    assert prefill_attention_work(batch([4, 10], [6, 0])) == 4 * 6 + 8 + 50
    assert prefill_attention_work(batch(decodes=3, ctx_sum=10)) == 0.0


@pytest.fixture(scope="module")
def models():
    return {"unit": UnitCost(), "roofline": RooflineCost(LLAMA3, H100),
            "roofline-tp2": RooflineCost(LLAMA3, H100, 2),
            "profile": ProfileCost(load_profile(EXAMPLE))}


@settings(max_examples=60, deadline=None)
@given(decodes=st.integers(0, 512), ctx=st.integers(0, 4000), steps=st.integers(1, 300),
       prefill=st.lists(st.integers(1, 2048), max_size=2))
def test_steps_vectorisation_matches_one_by_one(models, decodes, ctx, steps, prefill):
    if not decodes and not prefill:
        return
    b = batch(prefill, decodes=decodes, ctx_sum=decodes * ctx)
    for name, model in models.items():
        times = model.step_times(b, steps)
        assert times.shape == (steps,)
        for j in sorted({0, min(1, steps - 1), steps // 2, steps - 1}):
            advanced = b._replace(decode_context_sum=b.decode_context_sum + j * decodes)
            single = model.step_times(advanced, 1)
            assert single.shape == (1,)
            assert times[j] == pytest.approx(single[0], rel=1e-12), (name, j)


def test_a_run_priced_by_one_term_is_the_max_of_both_to_the_bit():
    """RooflineCost prices a decode run by the one attention term that is the larger throughout
    (RooflineCost._one_term); runs whose two terms cross anywhere near them must come out as
    fixed + max(pairs, reads) elementwise, bit for bit, whichever path they take."""
    cost = RooflineCost(LLAMA3, H100)
    rng = np.random.default_rng(7)
    taken = {True: 0, False: 0}
    for t in range(3000):
        n, steps = int(rng.integers(1, 300)), int(rng.integers(2, 100))
        ctx = int(rng.integers(n, 10**6))
        last = ctx + n * (steps - 1)
        # where the two terms cross: inside the run, just outside it, or on a whole context
        cross = float(rng.uniform(ctx - 3 * n, last + 3 * n)) if t % 3 else float(rng.integers(ctx - n, last + n))
        cost._s_per_pair = float(rng.lognormal(-21, 1))
        # (every 4th: reads at least twice the pairs, the usual decode, priced without the ends)
        cost._s_per_kv_token = cost._s_per_pair * (cross / (cross + n) if t % 4 else 2 + rng.exponential(20))
        b = BatchStats(num_decodes=n, decode_context_sum=ctx)
        fixed = cost._fixed_time(b)
        contexts = np.arange(ctx, ctx + n * steps, n, dtype=np.float64)
        want = fixed + np.maximum(cost._s_per_pair * contexts, cost._s_per_kv_token * (contexts + n))
        assert cost.step_times(b, steps).tobytes() == want.tobytes(), (n, ctx, steps, cross)
        taken[cost._one_term(fixed, ctx, n, steps) is not None] += 1
    assert min(taken.values()) > 300  # both paths were exercised


@settings(max_examples=200, deadline=None)
@given(decodes=st.integers(1, 512), ctx=st.integers(0, 100_000), steps=st.integers(2, 300),
       preset=st.sampled_from([("llama-3-8b", "h100-sxm", 1), ("llama-3-70b", "a100-80gb", 4),
                               ("llama-3-8b", "l40s", 2)]))
def test_a_decode_line_gives_the_floats_of_step_times(decodes, ctx, steps, preset):
    """`decode_line` (sim/cost/registry.CostModel, optional) promises that iteration j of a decode run takes
    a + b x (c + n j) seconds, bit for bit what step_times returns: the engine walks runs with it."""
    model, hardware, tp = preset
    stats = batch([], decodes=decodes, ctx_sum=decodes * ctx)
    lines = 0
    for cost in (RooflineCost(MODEL_PRESETS[model], HARDWARE_PRESETS[hardware], tp),
                 ProfileCost(load_profile(EXAMPLE)), ProfileCost(load_profile(EXAMPLE), 0.00025)):
        line = cost.decode_line(stats)
        if line is None:
            continue
        a, b, c, n, scale = line
        assert scale == 1.0
        walked = np.array([(a + b * (c + n * j)) * scale for j in range(steps)])
        assert walked.tobytes() == cost.step_times(stats, steps).tobytes()
        lines += 1
    assert lines >= 2  # (ProfileCost always has one, with or without a server's per-iteration adder)
    assert RooflineCost(LLAMA3, H100).decode_line(batch([100], [0], decodes, decodes * ctx)) is None


@settings(max_examples=200, deadline=None)
@given(decodes=st.integers(0, 512), ctx=st.integers(0, 100_000), steps=st.integers(2, 300),
       chunk=st.tuples(st.integers(1, 4096), st.integers(0, 8192)))
def test_step_time_is_the_first_of_step_times(decodes, ctx, steps, chunk):
    """`step_time` (optional) prices one iteration without an array; the engine uses it for most
    single iterations, so it must be step_times' first float, with or without a prefill chunk,
    and the first of a run priced by step_times' other branches."""
    runs = [batch([], decodes=decodes, ctx_sum=decodes * ctx)] if decodes else []
    for cost in (RooflineCost(LLAMA3, H100), RooflineCost(MODEL_PRESETS["llama-3-70b"], H100, 4),
                 ProfileCost(load_profile(EXAMPLE)), ProfileCost(load_profile(EXAMPLE), 0.00025)):
        for stats in (batch([chunk[0]], [chunk[1]], decodes, decodes * ctx), *runs):
            one = cost.step_time(stats)
            assert isinstance(one, float) and one == cost.step_times(stats, 1)[0]
        for stats in runs:
            assert cost.step_time(stats) == cost.step_times(stats, steps)[0]


chunks = st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 8192)), max_size=4)


@settings(max_examples=150, deadline=None)
@given(chunks=chunks, decodes=st.integers(0, 256), ctx=st.integers(1, 8192),
       grow=st.sampled_from(["chunk", "context", "new_chunk", "decode", "decode_ctx"]),
       by=st.integers(1, 5000))
def test_more_work_is_never_cheaper(models, chunks, decodes, ctx, grow, by):
    lens, ctxs = [c for c, _ in chunks], [p for _, p in chunks]
    small = batch(lens, ctxs, decodes, decodes * ctx)
    if grow in ("chunk", "context") and not lens:
        return
    if grow == "chunk":
        lens[0] += by
    elif grow == "context":
        ctxs[0] += by
    elif grow == "new_chunk":
        lens, ctxs = lens + [by], ctxs + [0]
    big = batch(lens, ctxs, decodes + (grow == "decode"),
                decodes * ctx + by * (grow in ("decode", "decode_ctx")))
    for name, model in models.items():
        assert model.step_times(big)[0] >= model.step_times(small)[0], name


def test_profile_cost_formula():
    p = load_profile(EXAMPLE)
    assert p.metadata["measured"] is False and p.metadata["model"] == "llama-3-8b"
    b = batch([100, 30], [0, 50], decodes=10, ctx_sum=5000)  # 140 tokens, 12 seqs
    tokens = 5.8e-3 + (6.8e-3 - 5.8e-3) * (140 - 128) / 128
    work = 100 * 100 / 2 + 30 * 50 + 30 * 30 / 2
    expected = 2e-3 + tokens + 6.0e-11 * 5000 + 8.8e-10 * work + 4e-6 * 12
    assert ProfileCost(p).step_times(b)[0] == pytest.approx(expected, rel=1e-12)
    # Past the last knot the last segment's slope continues: 20k tokens.
    slope = (334e-3 - 167e-3) / 8192
    assert p.tokens_time(20000) == pytest.approx(334e-3 + slope * (20000 - 16384), rel=1e-12)


def _doc():
    return yaml.safe_load(EXAMPLE.read_text())


def _write(tmp_path, doc):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(doc) if not isinstance(doc, str) else doc)
    return path


def _set(doc, dotted, value):
    *parents, last = dotted.split(".")
    node = doc
    for key in parents:
        node = node[key]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    return doc


@pytest.mark.parametrize("key, value, message", [
    ("format", "servesim-step-profile/v0", "p.yaml: format: got 'servesim-step-profile/v0'; "
                                           "allowed: servesim-step-profile/v1"),
    ("extra", 1, "p.yaml: unknown key 'extra'; allowed: format, metadata, model"),
    ("model", KeyError, "p.yaml: missing key 'model'"),
    ("metadata.device", KeyError, "p.yaml: metadata: missing key 'device'"),
    ("metadata.colour", "red", "p.yaml: metadata: unknown key 'colour'; allowed: device"),
    ("metadata.tensor_parallel_size", 0, "p.yaml: metadata.tensor_parallel_size: must be a "
                                         "positive integer, got 0"),
    ("metadata.measured", "no", "p.yaml: metadata.measured: must be true or false"),
    ("metadata.model", 3, "p.yaml: metadata.model: must be a non-empty string"),
    ("metadata.heldout_mape", -0.1, "p.yaml: metadata.heldout_mape: must be >= 0"),
    ("model.num_seqs", KeyError, "p.yaml: model: missing key 'num_seqs'"),
    ("model.slope", 1.0, "p.yaml: model: unknown key 'slope'; allowed: intercept"),
    ("model.intercept", -1e-3, "p.yaml: model.intercept: must be >= 0, got -0.001"),
    ("model.decode_context_sum", "fast", "p.yaml: model.decode_context_sum: must be a finite "
                                         "number, got 'fast'"),
    ("model.num_seqs", float("inf"), "p.yaml: model.num_seqs: must be a finite number"),
    ("model.total_tokens", [1, 2], "p.yaml: model.total_tokens: must be a mapping"),
    ("model.total_tokens.knots", [0, 5, 5] + list(range(6, 14)), "p.yaml: model.total_tokens."
                                                              "knots: must be strictly increasing"),
    ("model.total_tokens.knots", [0], "p.yaml: model.total_tokens.knots: must be a list of at "
                                      "least 2"),
    ("model.total_tokens.seconds", [1.0, 0.5] + [2.0] * 9, "p.yaml: model.total_tokens.seconds: "
                                                            "must be non-decreasing"),
    ("model.total_tokens.seconds", [1.0, 2.0], "p.yaml: model.total_tokens: knots and seconds "
                                               "must have the same length, got 11 and 2"),
    ("model.total_tokens.knots", [-1] + list(range(1, 11)), "p.yaml: model.total_tokens."
                                                             "knots\\[0\\]: must be >= 0"),
])
def test_profile_errors(tmp_path, key, value, message):
    path = _write(tmp_path, _set(_doc(), key, value))
    with pytest.raises(ScenarioError, match="^" + message.replace("p.yaml", str(path))):
        load_profile(path)


def test_profile_file_errors(tmp_path):
    with pytest.raises(ScenarioError, match="^s.yaml: cost_model.profile: profile file .*nope"):
        make_cost_model({"profile": tmp_path / "nope.yaml"}, LLAMA3, H100, 1, "s.yaml: cost_model")
    with pytest.raises(ScenarioError, match="p.yaml: not a readable YAML file"):
        load_profile(_write(tmp_path, "model: [unclosed"))
    with pytest.raises(ScenarioError, match="p.yaml: must be a mapping with keys format"):
        load_profile(_write(tmp_path, "- just a list"))
    # PyYAML reads 6e-11 (no dot) as a string; it is still accepted as a number.
    text = EXAMPLE.read_text().replace("6.0e-11", "6e-11")
    assert load_profile(_write(tmp_path, text)).decode_context_sum == 6e-11


def test_make_cost_model():
    assert set(COST_MODELS) == {"unit", "roofline", "profile", "measured"}
    assert isinstance(make_cost_model("unit", LLAMA3, H100, 1), UnitCost)
    assert isinstance(make_cost_model("roofline", LLAMA3, H100, 1), RooflineCost)
    assert isinstance(make_cost_model({"profile": EXAMPLE}, LLAMA3, H100, 1), ProfileCost)
    assert isinstance(make_cost_model("measured", LLAMA3, H100, 1), TableProfileCost)
    slow = make_cost_model({"roofline": {"overhead_s": 0.01}}, LLAMA3, H100, 1)
    fast = make_cost_model("roofline", LLAMA3, H100, 1)
    b = batch(decodes=1, ctx_sum=10)
    assert slow.step_times(b)[0] - fast.step_times(b)[0] == pytest.approx(0.008)


@pytest.mark.parametrize("spec, tp, hw, message", [
    ("vidur", 1, "h100-sxm", "^s.yaml: cost_model: unknown cost model 'vidur'; allowed: measured, "
                             "\\{measured: "),
    ({"unit": 1}, 1, "h100-sxm", "unknown cost model \\{'unit': 1\\}"),
    ({"roofline": {"speed": 2}}, 1, "h100-sxm", "s.yaml: cost_model.roofline.speed: unknown key; "
                                                "allowed: compute_efficiency"),
    ({"roofline": {"compute_efficiency": 1.5}}, 1, "h100-sxm",
     "cost_model.roofline.compute_efficiency: 1.5 is not a number in \\(0, 1\\]"),
    ("roofline", 2, "custom", "roofline needs custom.interconnect_bandwidth > 0 for "
                              "tensor_parallel_size=2"),
    ({"profile": EXAMPLE}, 2, "h100-sxm", "metadata.tensor_parallel_size is 1 but the scenario "
                                          "runs tensor_parallel_size=2"),
])
def test_make_cost_model_errors(spec, tp, hw, message):
    hardware = HARDWARE_PRESETS.get(hw) or replace(H100, name="custom", interconnect_bandwidth=0.0)
    with pytest.raises(ScenarioError, match=message):
        make_cost_model(spec, LLAMA3, hardware, tp, "s.yaml: cost_model")


def test_roofline_reads_an_fp8_kv_cache_at_one_byte():
    from sim.cost.batch import BatchStats


    auto = cost_model(make_scenario(cost_model="roofline", scheduler="chunked"))
    fp8 = cost_model(make_scenario(cost_model="roofline", scheduler="chunked", kv_cache_dtype="fp8"))
    # llama-3-8b: 32 layers x 8 KV heads x 128 x (K, V) = 65,536 elements per token: 131,072 B in
    # bf16, 65,536 B in fp8; read at 3.35 TB/s x 0.85
    byte_s = 3.35e12 * 0.85
    assert auto._s_per_kv_token == pytest.approx(131_072 / byte_s)
    assert fp8._s_per_kv_token == pytest.approx(65_536 / byte_s)
    long_decodes = BatchStats(num_decodes=64, decode_context_sum=64 * 8000)  # memory-bound attention
    assert fp8.step_times(long_decodes)[0] < auto.step_times(long_decodes)[0]
    no_kv = BatchStats(prefill_lens=np.array([512]), prefill_contexts=np.array([0]))
    assert fp8.step_times(no_kv)[0] == pytest.approx(auto.step_times(no_kv)[0])  # prefill reads no cache


@settings(max_examples=150, deadline=None)
@given(decodes=st.integers(0, 300), ctx=st.integers(0, 60_000), steps=st.integers(2, 200),
       chunk=st.tuples(st.integers(1, 4096), st.integers(0, 8192)),
       factor=st.sampled_from([1.0, 1.0648493238206793, 0.9541984732824427, 0.5]))
def test_wrappers_pass_the_fast_paths_on_with_the_same_floats(decodes, ctx, steps, chunk, factor):
    """ScaledCost and WindowedCost (sim/cost/step_cost.py) answer step_time and decode_line from
    the model they wrap (a wrapper that hid them made the engine price every iteration with numpy:
    1.54x the CPU time of the plain roofline, bench/wrappers.py). Each fast path must give the
    floats of the wrapper's own step_times, and the measured model's step_time its step_times'."""
    from sim.cost.step_cost import ScaledCost, WindowedCost

    measured = cost_model(make_scenario(cost_model="measured", scheduler="chunked"))
    models = (RooflineCost(LLAMA3, H100), ProfileCost(load_profile(EXAMPLE)), measured)
    runs = [batch([], decodes=decodes, ctx_sum=decodes * ctx)] if decodes else []
    for inner in models:
        for cost in (inner, ScaledCost(inner, factor), WindowedCost(inner, 0.5, 1024),
                     ScaledCost(WindowedCost(inner, 0.5, 1024), factor)):
            for stats in (batch([chunk[0]], [chunk[1]], decodes, decodes * ctx), *runs):
                assert cost.step_time(stats) == cost.step_times(stats, 1)[0], (cost, stats)
            for stats in runs:
                line = cost.decode_line(stats)
                if line is None:
                    continue
                a, b, c, n, scale = line
                walked = np.array([(a + b * (c + n * j)) * scale for j in range(steps)])
                assert walked.tobytes() == cost.step_times(stats, steps).tobytes(), (cost, factor)
    scaled = ScaledCost(models[0], factor)
    if decodes and models[0].decode_line(runs[0]) is not None:  # the roofline's line survives scaling
        assert scaled.decode_line(runs[0])[4] == factor


def test_a_plug_in_with_step_times_only_gets_the_fast_paths_defaults():
    from sim.cost.step_cost import as_cost_model

    class Twice:
        def step_times(self, stats, steps=1):
            return np.full(steps, 2.0)

    cost = as_cost_model(Twice())
    stats = batch([], decodes=3, ctx_sum=30)
    assert cost.step_time(stats) == 2.0 and cost.decode_line(stats) is None
    roofline = RooflineCost(LLAMA3, H100)
    assert as_cost_model(roofline) is roofline


def test_a_preset_gpu_with_its_own_price_keeps_the_measured_costs():
    """hardware: the H100's fields with usd_per_hour 2.0 is still an H100: measured step costs, the
    same as the preset's (it fell back to the roofline before); another memory size is not."""
    from dataclasses import asdict

    from sim.scenario import scenario_from_dict

    fields = {**asdict(H100), "usd_per_hour": 2.0}
    work = {"arrival": {"process": "poisson", "rate": 5}, "num_requests": 10,
            "prompt_tokens": {"dist": "fixed", "value": 100}, "output_tokens": {"dist": "fixed", "value": 20}}
    priced = scenario_from_dict({"model": "llama-3-8b", "hardware": fields, "workload": work})
    preset = scenario_from_dict({"model": "llama-3-8b", "hardware": "h100-sxm", "workload": work})
    assert priced.hardware.usd_per_hour == 2.0 and priced.cost_model.name == "measured"
    assert priced.cost_model.notice is None
    stats = batch([512], [0], decodes=8, ctx_sum=8 * 700)
    assert cost_model(priced).step_times(stats)[0] == cost_model(preset).step_times(stats)[0]
    bigger = scenario_from_dict({"model": "llama-3-8b", "hardware": {**fields, "memory_bytes": 96e9},
                                 "workload": work})
    assert bigger.cost_model.name == "roofline" and "differs from it beyond its price" in bigger.cost_model.notice


def test_a_fitted_profile_survives_pickling_as_the_planner_sends_it_to_workers():
    """The planner pickles scenarios to its worker processes. Compiled (mypyc), a frozen dataclass was
    unpickled by setting each field, which it refuses: `servesim plan` on any fitted (v1) profile
    crashed with FrozenInstanceError. Its overheads travel too."""
    import pickle
    profile = load_profile(EXAMPLE)
    with_overheads = replace(profile, overheads="any")  # (a field like the others)
    for p in (profile, with_overheads):
        back = pickle.loads(pickle.dumps(p))
        assert type(back) is type(p) and back.knots.tolist() == p.knots.tolist()
        assert (back.intercept, back.num_seqs, back.metadata, back.source, back.sha256, back.overheads) == (
            p.intercept, p.num_seqs, p.metadata, p.source, p.sha256, p.overheads)
