"""Sliding-window attention: configs read into windowed layers, vLLM's KV-cache groups, the memory
budget, exact block timelines (the hybrid manager frees the blocks behind each window), the cost
of windowed attention, and what is refused. The reference-model and real-vLLM checks are in
test_sim_schedulers.py (test_sliding_window_matches_reference) and test_vllm_adapter.py."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cli import app
from sim.config.errors import ScenarioError
from sim.cost.batch import WindowedBatchStats
from sim.cost.registry import WindowedCost
from sim.presets.hardware import HARDWARE_PRESETS
from sim.presets.memory import kv_budget
from sim.presets.models import MODEL_PRESETS, KVLayout, model_from_fields, model_from_hf_config
from sim.scenario import scenario_from_dict
from simhelpers import assert_one_line_error, make_scenario, run

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs"
LLAMA_31_8B = json.loads((FIXTURES / "meta-llama--Meta-Llama-3.1-8B.json").read_text())
TINY = {"name": "sw", "num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "num_kv_heads": 2,
        "intermediate_size": 128, "vocab_size": 256}


def _config(tmp_path: Path, **changes) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA_31_8B, **changes}))
    return tmp_path


# ------------------------------------------------------------------ reading configs

def test_mistral_style_window_covers_every_layer(tmp_path):
    """Mistral-7B-v0.1's layout: `sliding_window` set and no `use_sliding_window` key."""
    m = model_from_hf_config(_config(tmp_path, model_type="mistral", sliding_window=4096))
    assert (m.sliding_window, m.sliding_layers) == (4096, 32)
    assert m.kv_layout == KVLayout(32, 0, 1, 4096)  # one group, every layer windowed
    assert MODEL_PRESETS["mistral-7b"].kv_layout == KVLayout(32, 0, 1, 4096)


def test_qwen2_windows_the_layers_from_max_window_layers(tmp_path):
    m = model_from_hf_config(_config(tmp_path, model_type="qwen2", sliding_window=4096,
                                     use_sliding_window=True, max_window_layers=28))
    assert (m.sliding_window, m.sliding_layers) == (4096, 4)  # layers 28..31 of 32
    off = model_from_hf_config(_config(tmp_path, model_type="qwen2", sliding_window=131072,
                                       use_sliding_window=False, max_window_layers=28))
    assert off.sliding_layers == 0 and off.kv_layout == KVLayout(32)


def test_layer_types_give_the_hybrid_layout(tmp_path):
    types = ["sliding_attention", "full_attention"] * 16
    m = model_from_hf_config(_config(tmp_path, sliding_window=512, layer_types=types))
    assert (m.sliding_window, m.sliding_layers) == (512, 16)
    assert m.kv_layout == KVLayout(16, 1, 1, 512)  # 16 + 16: two groups of 16 layers


@pytest.mark.parametrize("layers, sliding, layout", [
    (62, 52, KVLayout(10, 1, 6, 1024)),  # 5:1 (Gemma-3-27B's count): groups of min = 10, 8 padding
    (25, 12, KVLayout(13, 1, 1, 1024)),  # 12 + 13 (< 1.5x): groups of max = 13, 1 padding
    (24, 24, KVLayout(24, 0, 1, 1024)),  # all windowed: one group
    (24, 0, KVLayout(24)),               # none: one full group
])
def test_kv_groups_follow_vllm(layers, sliding, layout):
    """vLLM 0.32 `_get_kv_cache_groups_uniform_page_size`: group size = the smaller layer count,
    or the larger one when it is under 1.5x the smaller; each type padded to whole groups."""
    m = model_from_fields({**TINY, "num_layers": layers, "sliding_window": 1024 if sliding else 0,
                           "sliding_layers": sliding}, "model")
    assert m.kv_layout == layout


def test_model_fields_are_validated():
    with pytest.raises(ScenarioError, match=r"model.sliding_layers: 5 is not an integer in \[0, 4\]"):
        model_from_fields({**TINY, "sliding_window": 16, "sliding_layers": 5}, "model")
    with pytest.raises(ScenarioError, match="model.sliding_layers: 2 windowed layers with sliding_window 0"):
        model_from_fields({**TINY, "sliding_layers": 2}, "model")


# ------------------------------------------------------------------ memory budget

def test_hybrid_budget_by_hand():
    """gpt-oss-20b (published config): 12 windowed (128 tokens) + 12 full layers, 8 KV heads of 64.
    A block holds 16 tokens of one group's 12 layers: 16 x 12 x (2 x 8 x 64 x 2 B) = 393,216 B."""
    m = model_from_hf_config(FIXTURES / "openai--gpt-oss-20b.json")
    assert (m.sliding_window, m.sliding_layers) == (128, 12)
    assert m.kv_layout == KVLayout(12, 1, 1, 128)
    hw = HARDWARE_PRESETS["h100-sxm"]
    b = kv_budget(m, hw, tensor_parallel_size=1, gpu_memory_utilization=0.9, block_size=16)
    assert b.block_bytes == 16 * 12 * 2 * 8 * 64 * 2 == 393_216
    assert b.num_gpu_blocks == int((0.9 * hw.memory_bytes - b.weight_bytes_per_gpu
                                    - b.activation_reserve_bytes) // 393_216)
    # 8192 tokens: 512 blocks in the full group; the window group keeps blocks from position
    # 8192 - 128 + 1 = 8065 on: 512 - 8065 // 16 = 512 - 504 = 8
    assert b.layout.held(8192, 16) == 512 + 8
    assert b.max_concurrent_seqs(8192) == b.num_gpu_blocks // 520
    assert b.max_tokens == b.num_gpu_blocks * 16 // 2  # a short sequence: every token in both groups


def test_gpt_oss_weights_by_hand():
    """gpt-oss-20b: 24 layers, hidden 2880, 64 query / 8 KV heads of 64, 32 experts of width 2880
    (4 per token) in MXFP4 (4-bit values + one scale byte per 32: 4.25 bits), the rest bf16, q/k/v
    biases, untied 201,088-token embedding and LM head."""
    m = model_from_hf_config(FIXTURES / "openai--gpt-oss-20b.json")
    h, layers, q, kv, inter, experts, vocab = 2880, 24, 64 * 64, 8 * 64, 2880, 32, 201088
    attention = h * q + 2 * h * kv + q * h
    experts_params = layers * experts * 3 * h * inter
    router = layers * h * experts
    other = 2 * vocab * h + layers * ((q + 2 * kv) + 2 * h) + h  # embed, head, biases + norms, final norm
    assert m.num_params == layers * attention + experts_params + router + other
    assert round(m.num_params / 1e9, 1) == 20.9  # OpenAI's model card: 21B parameters
    assert round(m.matmul_params / 1e9, 2) == 3.61  # and 3.6B active
    assert m.weight_bytes == (layers * attention + router) * 2 + experts_params * 4.25 / 8 + other * 2


def test_capacity_shows_the_window(tmp_path):
    r = CliRunner().invoke(app, ["capacity", "--model", str(FIXTURES / "openai--gpt-oss-20b.json"),
                                 "--gpu", "h100-sxm", "--seq-len", "8192", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["blocks_per_seq"] == 520 and out["sliding_window"] == 128
    assert out["expert_weight_bytes"] == 0.53125
    text = CliRunner().invoke(app, ["capacity", "--model", "mistral-7b", "--gpu", "h100-sxm"],
                              env={"COLUMNS": "250"}).stdout
    assert "all 32 layers attend the last 4,096 tokens" in text


# ------------------------------------------------------------------ exact timelines

@pytest.mark.parametrize("ff", [True, False])
@pytest.mark.parametrize("sliding, used", [
    # one windowed group of 4 layers: prefill 10 -> 3 blocks; after the decode of position 10 the
    # block of tokens 0-3 is behind the window (11 - 8 + 1 = 4); position 12 opens a block; after
    # position 14, tokens 4-7 go (15 - 8 + 1 = 8); position 16 opens one
    (4, [3, 3, 2, 3, 3, 3, 2, 3]),
    # 2 + 2 layers: a full and a windowed group, each block doubled, the full one never freed
    (2, [6, 6, 5, 7, 7, 7, 6, 8]),
    # no window: [3, 3, 3, 4, 4, 4, 4, 5]
    (0, [3, 3, 3, 4, 4, 4, 4, 5]),
])
def test_window_frees_blocks_behind_it_by_hand(sliding, used, ff):
    """One request, prompt 10, output 8, window 8, blocks of 4, unit cost: iteration k computes
    position 9 + k (k >= 1) and the blocks in use are read during it."""
    model = {**TINY, "sliding_window": 8 if sliding else 0, "sliding_layers": sliding}
    r = run([0.0], [10], [8], model=model, scheduler="continuous", block_size=4, num_gpu_blocks=64,
            max_num_batched_tokens=64, max_num_seqs=8, fast_forward=ff)
    assert r.requests["finish_s"].tolist() == [8.0]
    if ff:  # one prefill, then a single decode run of 7 (its row reports its last iteration)
        assert r.steps["count"].tolist() == [1, 7] and r.steps["kv_blocks_used"].tolist() == used[::7]
    else:
        assert r.steps["kv_blocks_used"].tolist() == used


def test_a_run_stops_when_a_freed_block_lets_the_waiting_head_in():
    """Request 1 waits for blocks while request 0 decodes; the decode run ends with the iteration
    that frees a block behind request 0's window, and request 1 joins in the next one."""
    model = {**TINY, "sliding_window": 8, "sliding_layers": 4}
    kw = dict(model=model, scheduler="continuous", block_size=4, num_gpu_blocks=5,
              max_num_batched_tokens=64, max_num_seqs=8, scheduler_reserve_full_isl=False)
    # request 0: prompt 10 (3 blocks), decodes; request 1 (prompt 9, 3 blocks) waits for a 3rd
    # free block: position 10's decode frees one at the end of iteration 1 -> joins at 2
    fast, stepped = (run([0.0, 0.0], [10, 9], [8, 2], fast_forward=ff, **kw) for ff in (True, False))
    for r in (fast, stepped):
        assert (r.requests["arrival_s"] + r.requests["queue_s"]).tolist() == [0.0, 2.0]
    assert fast.requests.equals(stepped.requests)


# ------------------------------------------------------------------ cost

class _Seen:
    def step_times(self, stats, steps=1):
        self.stats, self.steps = stats, steps
        return np.zeros(steps)


def test_windowed_cost_averages_the_layers_by_hand():
    """Half the layers windowed at 10 tokens. Decodes at contexts 4 and 24 attend 5 and 25 keys in
    a full layer, 5 and 10 in a windowed one: (30 + 15) / 2 = 22.5 per layer, growing by
    (2 + 1) / 2 = 1.5 per iteration. A chunk of 8 after 6 tokens: (query, key) pairs 8 x 6 + 36
    = 84 in a full layer, 4 x 6 + 10 + 4 x 10 = 74 in a windowed one (queries 5-8 see 10 keys):
    its context becomes 6 - 0.5 x 10 / 8 = 5.375."""
    seen = _Seen()
    stats = WindowedBatchStats(prefill_lens=np.array([8]), prefill_contexts=np.array([6]), num_decodes=2,
                               decode_context_sum=30, decode_window_sum=15, decode_capped=1)
    WindowedCost(seen, 0.5, 10).step_times(stats, 3)
    s = seen.stats
    assert (s.decode_context_sum, s.decode_context_growth, seen.steps) == (22.5, 1.5, 3)
    assert s.prefill_contexts.tolist() == [5.375] and s.prefill_lens.tolist() == [8]


def test_decode_window_sums_come_from_the_pool():
    """The roofline over a windowed model: a run's iterations priced in bulk equal iterations
    priced one at a time (capped members stop growing; a run stops where one becomes capped)."""
    model = {**TINY, "sliding_window": 40, "sliding_layers": 2}
    kw = dict(model=model, cost_model="roofline", scheduler="chunked", block_size=4, num_gpu_blocks=400, max_num_seqs=8,
              max_num_batched_tokens=64)
    arrival, prompt, output = [0.0, 0.0, 0.01, 0.02], [30, 5, 50, 12], [40, 60, 25, 45]
    fast, stepped = (run(arrival, prompt, output, fast_forward=ff, **kw) for ff in (True, False))
    assert len(fast.steps) < len(stepped.steps)
    for col in ("first_token_s", "finish_s"):
        assert fast.requests[col].to_numpy() == pytest.approx(stepped.requests[col].to_numpy(), rel=1e-12)


def test_windowed_decodes_cost_less_than_full_attention():
    arrival, prompt, output = [0.0] * 4, [3000] * 4, [200] * 4
    kw = dict(cost_model="roofline", scheduler="chunked", max_num_batched_tokens=8192)
    full = run(arrival, prompt, output, model="llama-3-8b", **kw)
    windowed = run(arrival, prompt, output, model={**_llama3_fields(), "sliding_window": 256}, **kw)
    assert windowed.summary["tpot_ms"]["mean"] < full.summary["tpot_ms"]["mean"]


def _llama3_fields() -> dict:
    m = MODEL_PRESETS["llama-3-8b"]
    return {"name": "llama-3-8b-sw", "num_layers": m.num_layers, "hidden_size": m.hidden_size,
            "num_attention_heads": m.num_attention_heads, "num_kv_heads": m.num_kv_heads,
            "intermediate_size": m.intermediate_size, "vocab_size": m.vocab_size}


# ------------------------------------------------------------------ what is refused

@pytest.mark.parametrize("engine, message", [
    ({"enable_prefix_caching": True}, "engine.enable_prefix_caching: prefix caching with sw's sliding-window "
                                      "layers is not modelled"),
    ({"speculative": {"method": "ngram", "num_speculative_tokens": 2, "acceptance_rate": 0.7}},
     "engine.speculative: speculative with sw's sliding-window layers is not modelled"),
])
def test_unmodelled_combinations_are_refused(engine, message):
    with pytest.raises(ScenarioError, match=message):
        make_scenario(model={**TINY, "sliding_window": 8}, scheduler="chunked", **engine)


def test_prefix_caching_is_off_by_default_for_a_window():
    sc = make_scenario(model={**TINY, "sliding_window": 8}, scheduler="chunked")
    assert sc.engine.enable_prefix_caching is False


def test_refusal_on_the_command_line(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text("model: mistral-7b\nhardware: h100-sxm\nengine: {enable_prefix_caching: true}\n"
                        "workload: {arrival: {process: burst}, num_requests: 2, "
                        "prompt_tokens: {dist: fixed, value: 10}, output_tokens: {dist: fixed, value: 2}}\n")
    r = CliRunner().invoke(app, ["run", str(scenario), "--out", str(tmp_path / "o")])
    assert_one_line_error(r, "s.yaml: engine.enable_prefix_caching: prefix caching with mistral-7b's")
    assert not (tmp_path / "o").exists()


def test_vllm_gets_the_window_and_refuses_a_hybrid():
    from calibrate import vllm_engine

    sc = scenario_from_dict({"model": {**TINY, "sliding_window": 64}, "hardware": "h100-sxm",
                             "engine": {"scheduler": "chunked", "block_size": 32, "num_gpu_blocks": 64},
                             "workload": {"arrival": {"process": "burst"}, "num_requests": 1,
                                          "prompt_tokens": {"dist": "fixed", "value": 8},
                                          "output_tokens": {"dist": "fixed", "value": 2}}})
    cfg = vllm_engine.model_config(sc)
    assert cfg["sliding_window"] == 64 and cfg["layer_types"] == ["sliding_attention"] * 4
    vllm_engine.check_vllm_scenario(sc)
    hybrid = scenario_from_dict({**sc.raw, "model": {**TINY, "sliding_window": 64, "sliding_layers": 2}})
    with pytest.raises(ScenarioError, match="vLLM on the CPU runs without the hybrid KV-cache manager"):
        vllm_engine.check_vllm_scenario(hybrid)


# ------------------------------------------------------------------ Gemma-2 / Gemma-3 text

@pytest.mark.parametrize("name, sliding, layout", [
    ("Gemma2Config", 13, KVLayout(13, 1, 1, 4096)),      # alternating: 13 + 13, groups of 13
    ("Gemma3TextConfig", 22, KVLayout(4, 1, 6, 4096)),   # 5:1: 22 + 4, groups of 4 (2 padding)
])
def test_gemma_layouts_and_weights_by_hand(tmp_path, name, sliding, layout):
    """transformers' Gemma2Config / Gemma3TextConfig defaults (fixtures): 26 layers, hidden 2304,
    8 query / 4 KV heads of 256, GeGLU of 9216, tied embeddings, four norms per layer."""
    path = FIXTURES / f"transformers--{name}-defaults.json"
    cfg = json.loads(path.read_text())
    m = model_from_hf_config(path)
    assert (m.sliding_window, m.sliding_layers, m.kv_layout) == (4096, sliding, layout)
    h, layers, q, kv, inter, vocab = 2304, 26, 8 * 256, 4 * 256, 9216, cfg["vocab_size"]
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * inter + 4 * h
    if name == "Gemma3TextConfig":  # + q_norm and k_norm, head_dim each
        per_layer += 2 * 256
    assert m.num_params == layers * per_layer + vocab * h + h  # tied: one embedding; final norm
    # an older config without layer_types: the same layers from the model type's own pattern
    cfg.pop("layer_types")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert model_from_hf_config(tmp_path).sliding_layers == sliding


def test_pool_window_sums_against_brute_force():
    """The decode pool's running sums for windowed attention (min(c + 1, window) over members, how
    many are capped, blocks behind their windows) equal a direct count after joins, runs and a
    leave, capping included."""
    from sim.kv.cache import WindowedKVCache
    from sim.schedulers.decode_pool import WindowedDecodePool
    from sim.workload.request import RequestTable
    from simhelpers import make_workload

    req = RequestTable.from_workload(make_workload([0.0] * 4, [3, 9, 14, 30], [100] * 4))
    layout = KVLayout(4, 0, 1, 10)
    pool = WindowedDecodePool(req, WindowedKVCache(1000, 4, layout, 64))
    for rid in range(3):
        req.computed[rid] = req.prompt[rid]
        pool.join(rid)

    def check():
        cs = [pool.computed(r) for r in pool.members]
        assert pool.window_sums() == (sum(min(c + 1, 10) for c in cs), sum(c >= 9 for c in cs))
        assert pool.behind_sum == sum(layout.behind(c, 4) for c in cs)

    check()
    for steps in (1, pool.steps_to_next_finish(), 4, 3):  # the first run stops where request 0 caps
        pool.advance(steps)
        check()
    req.computed[3] = 30
    pool.join(3)
    check()
    pool.leave(1)
    pool.advance(5)
    check()
