"""Multi-LoRA serving (engine.lora, workload.adapters): adapter slots and admission by hand, an adapter
miss costing its load, the memory set aside, and the refusals."""
from __future__ import annotations

import shlex

import numpy as np
import pytest

from sim.config.errors import ScenarioError
from sim.features.lora.slots import LoRASlots
from sim.planning.vllm_command import vllm_serve
from sim.presets.memory import lora_adapter_bytes
from sim.presets.models import MODEL_PRESETS
from sim.scenario import scenario_from_dict
from sim.simulate import simulate
from sim.workload.generators import SharedAdapters, Workload

M = MODEL_PRESETS["llama-3-8b"]
# a rank-16 adapter on every projection of Llama-3-8B: 16 x (8,192 + 2 x 5,120 + 8,192 + 2 x 18,432 +
# 18,432) x 32 layers x 2 bytes
ADAPTER = 16 * (8192 + 2 * 5120 + 8192 + 2 * 18432 + 18432) * 32 * 2
# a host link that loads one adapter a second, so a load shows in a unit-cost timeline
HW = {"name": "h100-sxm", "memory_bytes": 80e9, "hbm_bandwidth": 3.35e12, "bf16_flops": 989e12,
      "interconnect_bandwidth": 450e9, "host_bandwidth": ADAPTER}
_ONE = {"arrival": {"process": "burst"}, "num_requests": 1, "prompt_tokens": {"dist": "fixed", "value": 1},
        "output_tokens": {"dist": "fixed", "value": 1}}


def test_an_adapter_is_rank_times_every_projection():
    assert lora_adapter_bytes(M, 16) == ADAPTER == 83_886_080


def test_slots_admit_at_most_max_loras_adapters_and_evict_the_least_recently_used():
    slots = LoRASlots(2, np.array([0, 1, 2, 0, -1]))
    assert slots.admits(0) and slots.admits(4)
    slots.join(0)
    slots.join(1)
    assert not slots.admits(2) and slots.admits(3) and slots.admits(4)  # adapter 2 would be a third
    assert slots.batch() == (2, 2) and slots.batch() == (2, 0)           # both loaded once
    slots.leave(0)
    assert slots.admits(2)
    slots.join(2)
    assert slots.batch() == (2, 1) and list(slots.slots) == [1, 2]      # 0, least recently used, out
    assert slots.loads == 3


def _timeline(lora):
    """A (adapter 0), B (adapter 1), C (adapter 0) arrive at 0: 4-token prompts, 2 output tokens."""
    w = Workload(arrival_s=np.zeros(3), prompt_tokens=np.full(3, 4), output_tokens=np.full(3, 2),
                 priority=np.zeros(3, np.int64), adapter=np.array([0, 1, 0]))
    sc = scenario_from_dict({"model": "llama-3-8b", "hardware": HW, "cost_model": "unit",
                             "engine": {"scheduler": "chunked", "block_size": 4, "lora": lora},
                             "workload": _ONE})
    return simulate(sc, workload=w)


def test_an_adapter_miss_costs_its_load_and_one_slot_serializes_adapters():
    """One slot: A and C (adapter 0) run together; B (adapter 1) is skipped, not blocking C behind
    it, and joins once A and C are done. Each iteration is 1 (unit cost) plus the adapter kernels
    (its 83,886,080 bytes read from HBM, 2 x 16 x 81,920 x 32 FLOPs a token at 989 TFLOP/s), and the
    iteration that first uses an adapter also loads it (1 s on this host link): A and C's prefill
    and B's."""
    r = _timeline({"max_loras": 1})
    read, per_token = ADAPTER / 3.35e12, 2 * 16 * 81920 * 32 / 989e12
    t1 = 1 + 1 + read + 8 * per_token          # A, C prefill 4 tokens each, adapter 0 loaded
    t2 = t1 + 1 + read + 2 * per_token         # A, C decode: done
    t3 = t2 + 1 + 1 + read + 4 * per_token     # B prefill, adapter 1 loaded (0 evicted)
    t4 = t3 + 1 + read + per_token             # B decode: done
    assert r.requests["first_token_s"].tolist() == pytest.approx([t1, t3, t1], rel=1e-12)
    assert r.requests["finish_s"].tolist() == pytest.approx([t2, t4, t2], rel=1e-12)
    assert r.requests["adapter"].tolist() == [0, 1, 0]
    assert r.summary["lora"] == {"max_loras": 1, "max_lora_rank": 16, "adapters_used": 2, "adapter_loads": 2}
    # two slots: all three start together, both adapters loaded before the first iteration (2 s)
    two = _timeline({"max_loras": 2})
    assert two.requests["first_token_s"].tolist() == pytest.approx([1 + 2 + 2 * read + 12 * per_token] * 3,
                                                                    rel=1e-12)


def test_the_slots_memory_comes_out_of_the_kv_cache():
    def budget(lora):
        return scenario_from_dict({"model": "llama-3-8b", "hardware": "h100-sxm", "workload": _ONE,
                                   "engine": {} if lora is None else {"lora": lora}}).budget
    block = 16 * 131_072  # bytes of a 16-token block of Llama-3-8B on one GPU
    b = budget(None)
    free = b.usable_bytes - b.weight_bytes_per_gpu - b.activation_reserve_bytes  # what KV blocks may fill
    assert b.num_gpu_blocks == free // block
    # 4 slots of rank-16 adapters: 335,544,320 bytes fewer for KV
    assert budget({"max_loras": 4}).num_gpu_blocks == (free - 4 * ADAPTER) // block


def test_adapters_in_the_workload_and_the_refusals():
    draw = SharedAdapters(count=4, share=0.5, zipf_s=1.0).draw(np.random.default_rng(0), 20_000)
    used = draw[draw >= 0]
    assert 0.48 < len(used) / len(draw) < 0.52
    counts = np.bincount(used, minlength=4) / len(used)  # 1 : 1/2 : 1/3 : 1/4, normalised
    assert counts == pytest.approx(np.array([12, 6, 4, 3]) / 25, abs=0.02)
    raw = {"model": "llama-3-8b", "hardware": "h100-sxm", "workload": {**_ONE, "adapters": {"count": 3, "share": 1}}}
    with pytest.raises(ScenarioError, match="workload.adapters: the requests name LoRA adapters but the engine "
                                            "serves none"):
        scenario_from_dict(raw)
    sc = scenario_from_dict({**raw, "engine": {"lora": {"max_loras": 2, "max_lora_rank": 32}}})
    words = shlex.split(vllm_serve(sc))
    assert "--enable-lora" in words and words[words.index("--max-loras") + 1] == "2" \
        and words[words.index("--max-lora-rank") + 1] == "32"
    for model, engine, message in (
            ("mixtral-8x7b", {"lora": {}, "tensor_parallel_size": 2}, "LoRA adapters on mixtral-8x7b's experts"),
            ("llama-3-8b", {"lora": {}, "scheduler": "static"}, "engine.lora: not modelled together with engine.scheduler: static"),
            ("llama-3-8b", {"lora": {"max_loras": 0}}, "engine.lora.max_loras: 0"),
            ("llama-3-8b", {"lora": {"rank": 8}}, "engine.lora.rank: unknown key")):
        with pytest.raises(ScenarioError, match=message):
            scenario_from_dict({"model": model, "hardware": "h100-sxm", "workload": _ONE, "engine": engine})


def _routed(router):
    w = Workload(arrival_s=np.array([0.0, 0.1, 0.2]), prompt_tokens=np.full(3, 4), output_tokens=np.full(3, 2),
                 priority=np.zeros(3, np.int64), adapter=np.array([0, 0, 1]))
    sc = scenario_from_dict({"model": "llama-3-8b", "hardware": HW, "cost_model": "unit",
                             "engine": {"scheduler": "chunked", "block_size": 4, "replicas": 2, "router": router,
                                        "lora": {"max_loras": 1}}, "workload": _ONE})
    return simulate(sc, workload=w)


def test_lora_affinity_routing_by_hand():
    """Two replicas of one slot each. A (adapter 0) goes to replica 0 (a free slot, the lower index);
    B (adapter 0) follows it there (in use: no load, and 1 request is within 2 x 0 + 1 of the idle
    replica's load); C (adapter 1) takes replica 1's free slot. least_loaded sends B to the idle
    replica 1 and C back to replica 0, where adapter 0 holds the only slot: C waits there, and
    adapter 0 is loaded twice."""
    affinity, least = _routed("lora_affinity"), _routed("least_loaded")
    assert affinity.requests["replica"].tolist() == [0, 0, 1]
    assert least.requests["replica"].tolist() == [0, 1, 0]
    assert affinity.summary["lora"]["adapter_loads"] == 2 and least.summary["lora"]["adapter_loads"] == 3
    assert affinity.requests["finish_s"].max() < least.requests["finish_s"].max()


def test_capacity_of_a_scenario_sets_its_adapter_slots_aside(tmp_path):
    """`servesim capacity --scenario` shows the blocks the run gets: its LoRA slots out of the KV cache."""
    import json

    from typer.testing import CliRunner

    from cli import app
    path = tmp_path / "lora.yaml"
    path.write_text("model: llama-3-8b\nhardware: h100-sxm\nengine: {lora: {max_loras: 2}}\n"
                    "workload: {arrival: {process: burst}, num_requests: 1, prompt_tokens: {dist: fixed, value: 1}, "
                    "output_tokens: {dist: fixed, value: 1}}\n")
    out = CliRunner().invoke(app, ["capacity", "--scenario", str(path), "--json"])
    assert out.exit_code == 0, out.output
    got = json.loads(out.stdout)
    sc = scenario_from_dict({"model": "llama-3-8b", "hardware": "h100-sxm", "workload": _ONE,
                             "engine": {"lora": {"max_loras": 2}}})
    assert got["num_gpu_blocks"] == sc.budget.num_gpu_blocks
    plain = scenario_from_dict({"model": "llama-3-8b", "hardware": "h100-sxm", "workload": _ONE}).budget
    assert got["activation_reserve_bytes"] == plain.activation_reserve_bytes + 2 * ADAPTER


def test_the_run_says_how_many_adapters_and_loads(tmp_path):
    from typer.testing import CliRunner

    from cli import app
    path = tmp_path / "lora.yaml"
    path.write_text("model: llama-3-8b\nhardware: h100-sxm\ncost_model: roofline\n"
                    "engine: {scheduler: chunked, lora: {max_loras: 2}}\n"
                    "workload: {arrival: {process: poisson, rate: 4}, num_requests: 60, "
                    "prompt_tokens: {dist: fixed, value: 200}, output_tokens: {dist: fixed, value: 20}, "
                    "adapters: {count: 3, share: 1.0}}\n")
    out = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "run")], env={"COLUMNS": "120"})
    assert out.exit_code == 0, out.output
    import json
    s = json.loads((tmp_path / "run" / "summary.json").read_text())["lora"]
    assert s["adapters_used"] == 3
    assert f"LoRA: 3 adapters used; {s['adapter_loads']} loads into 2 slot(s) a replica (rank 16)" in out.output


def test_a_gpu_without_a_host_link_cannot_load_adapters_and_the_model_is_said_stated():
    """Loads cross the host link: without its bandwidth they would be free, so it is asked for; and a
    LoRA run says its adapters' costs are a stated model, not measured."""
    no_link = {k: v for k, v in HW.items() if k != "host_bandwidth"}
    with pytest.raises(ScenarioError, match="engine.lora: h100-sxm has no host link bandwidth"):
        scenario_from_dict({"model": "llama-3-8b", "hardware": no_link, "engine": {"lora": {"max_loras": 2}},
                            "workload": _ONE})
    sc = scenario_from_dict({"model": "llama-3-8b", "hardware": "h100-sxm", "engine": {"lora": {"max_loras": 2}},
                             "workload": _ONE})
    assert "LoRA adapters' loads and kernels are a stated model" in sc.cost_model.notice


def test_a_traces_adapter_column_names_each_requests_adapter(tmp_path):
    """A generic CSV trace's `adapter` column: names numbered in order of first appearance, blank the base
    model. With one slot the second adapter's request waits for the first's (as in the hand timeline
    above); without engine.lora the run is refused, not run on the base model."""
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens,adapter\n0,4,2,support\n0,4,2,sql\n"
                                    "0,4,2,\n0,4,2,support\n")
    from sim.workload.traces import read_trace

    table = read_trace(tmp_path / "t.csv")
    assert table["adapter"].tolist() == [0, 1, -1, 0] and table.attrs["adapters"] == ["support", "sql"]
    raw = {"model": "llama-3-8b", "hardware": HW, "cost_model": "unit", "workload": {"trace": "t.csv"},
           "engine": {"scheduler": "chunked", "block_size": 4, "lora": {"max_loras": 1}}}
    r = simulate(scenario_from_dict(raw, base_dir=tmp_path))
    assert r.requests["adapter"].tolist() == [0, 1, -1, 0]
    first = r.requests.set_index("request_id")["first_token_s"]
    assert first[1] > first[0] == first[3] == first[2]  # sql waits for the one slot; the rest go together
    with pytest.raises(ScenarioError, match="its requests name LoRA adapters .* set engine.lora"):
        simulate(scenario_from_dict({**raw, "engine": {"scheduler": "chunked"}}, base_dir=tmp_path))
    with pytest.raises(ScenarioError, match="has an adapter column and workload.adapters draws them too"):
        simulate(scenario_from_dict({**raw, "workload": {"trace": "t.csv", "adapters": {"count": 2, "share": 1.0}}},
                                    base_dir=tmp_path))
