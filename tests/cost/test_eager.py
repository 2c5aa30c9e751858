"""engine.enforce_eager (sim/cost/eager.py): no iteration shorter than the host's kernel launches."""
from __future__ import annotations

import numpy as np
import pytest

from sim.cost import eager
from sim.presets.models import MODEL_PRESETS


def test_launch_floor_by_hand():
    assert eager.launch_floor_s(MODEL_PRESETS["llama-3-8b"], 1) == pytest.approx((32 * 10 + 4) * 8e-6)
    assert eager.launch_floor_s(MODEL_PRESETS["llama-3-8b"], 2) == pytest.approx((32 * 12 + 4) * 8e-6)
    # Mixtral: every layer MoE, +4 kernels each
    assert eager.launch_floor_s(MODEL_PRESETS["mixtral-8x7b"], 2) == pytest.approx((32 * 16 + 4) * 8e-6)


def test_eager_steps_are_floored_and_the_serve_line_says_so(tmp_path):
    from sim.planning.vllm_command import vllm_serve
    from sim.scenario import scenario_from_dict
    from sim.simulate import simulate
    raw = {"name": "e", "model": "tiny", "hardware": "h100-sxm", "cost_model": {"roofline": {"overhead_s": 0.0, "overhead_per_seq_s": 0.0}},
           "engine": {"scheduler": "chunked"},
           "workload": {"num_requests": 20, "arrival": {"process": "poisson", "rate": 50.0},
                        "prompt_tokens": {"dist": "fixed", "value": 32},
                        "output_tokens": {"dist": "fixed", "value": 16}}}
    graphs = simulate(scenario_from_dict(raw))
    raw["engine"]["enforce_eager"] = True
    sc = scenario_from_dict(raw)
    run = simulate(sc)
    floor = eager.launch_floor_s(MODEL_PRESETS["tiny"], 1)
    d0 = graphs.steps["duration_s"].to_numpy() / graphs.steps["count"].to_numpy()
    d1 = run.steps["duration_s"].to_numpy() / run.steps["count"].to_numpy()
    assert d0.min() < floor  # the tiny model's iterations are shorter than the launches...
    assert np.all(d1 >= floor * (1 - 1e-9))  # ...and eager, none is
    assert "--enforce-eager" in vllm_serve(sc)
    assert "eager mode (no CUDA graphs) (not validated)" in run.summary["error_band"]["basis"]["widened_for"]


@pytest.mark.parametrize("given, seqs, tokens, query, gpu, limit", [
    (None, 128, 2048, 1, "h100-sxm", 256),    # 2 x 128 decodes, under vLLM's 512 ceiling
    (None, 512, 8192, 1, "h100-sxm", 512),    # the ceiling
    (None, 512, 8192, 1, "b200", 1024),       # data-centre Blackwell's ceiling
    (None, 512, 8192, 1, "rtx-pro-6000", 512),  # (a Blackwell workstation card: 512)
    (None, 16, 2048, 3, "h100-sxm", 96),      # 2 speculative tokens: 3 tokens a decode
    (None, 256, 300, 1, "h100-sxm", 300),     # never above the token budget
    (1000, 256, 8192, 1, "h100-sxm", 1000),   # --max-cudagraph-capture-size
    (1000, 256, 600, 1, "h100-sxm", 600),
])
def test_the_capture_limit_is_vllms_rule(given, seqs, tokens, query, gpu, limit):
    """vLLM 0.32 (vllm/config/vllm.py, _set_cudagraph_sizes): min(2 x max_num_seqs x decode query
    length, 512 or 1024 on SM 10.x), then at most max_num_batched_tokens; a given size as given."""
    assert eager.capture_limit(given, seqs, tokens, query, gpu) == limit


class _Linear:
    """A stand-in cost model: 1 ms + 10 us a token, with a decode line of its own."""

    def step_times(self, stats, steps=1):
        return np.full(steps, 1e-3 + 1e-5 * stats.total_tokens)

    def step_time(self, stats):
        return float(self.step_times(stats)[0])

    def decode_line(self, stats):
        return (1.0, 2.0, 3, 4, 5.0)

    def decode_times(self, stats, steps):
        return [float(t) for t in self.step_times(stats, steps)]


def test_only_the_iterations_over_the_limit_take_the_floor():
    from sim.cost.batch import BatchStats
    inner, floor = _Linear(), 4e-3
    cost = eager.graph_limited(inner, floor, 256)  # 257 tokens: 3.57 ms, under the floor: wrapped
    assert isinstance(cost, eager.GraphLimitCost)
    small, big = BatchStats(num_decodes=256, decode_context_sum=256), BatchStats(num_decodes=257, decode_context_sum=257)
    assert cost.step_time(small) == inner.step_time(small) == 1e-3 + 256e-5  # a CUDA graph: as measured
    assert cost.step_time(big) == floor and cost.step_times(big, 3).tolist() == [floor] * 3
    assert cost.decode_line(small) == (1.0, 2.0, 3, 4, 5.0) and cost.decode_line(big) is None
    assert cost.decode_times(big, 2) == [floor, floor]
    long = BatchStats(num_decodes=400, decode_context_sum=400)  # 5 ms: past the floor on its own
    assert cost.step_time(long) == inner.step_time(long)
    # where even the cheapest iteration over the limit lasts the floor, nothing is wrapped
    assert eager.graph_limited(inner, 3e-3, 256) is inner


def test_a_small_models_large_iterations_run_without_graphs_and_the_serve_line_says_the_limit():
    """The tiny model's prefill of 600 tokens is shorter than its launches: over the default limit
    (2 x 16 decodes = 32 tokens) it runs without a CUDA graph and takes the launch floor; with
    max_cudagraph_capture_size 2048 (the whole token budget) every iteration runs from a graph, as
    measured. Decodes (16 tokens) never change."""
    from sim.config.errors import ScenarioError
    from sim.planning.vllm_command import vllm_serve
    from sim.scenario import scenario_from_dict
    from sim.simulate import simulate
    raw = {"name": "g", "model": "tiny", "hardware": "h100-sxm",
           "cost_model": {"roofline": {"overhead_s": 0.0, "overhead_per_seq_s": 0.0}},
           "engine": {"scheduler": "chunked", "max_num_seqs": 16, "max_num_batched_tokens": 2048},
           "workload": {"num_requests": 16, "arrival": {"process": "burst"},
                        "prompt_tokens": {"dist": "fixed", "value": 600},
                        "output_tokens": {"dist": "fixed", "value": 8}}}
    floor = eager.launch_floor_s(MODEL_PRESETS["tiny"], 1)
    default = simulate(scenario_from_dict(raw))
    raw["engine"]["max_cudagraph_capture_size"] = 2048
    sc = scenario_from_dict(raw)
    graphs = simulate(sc)
    s0, s1 = default.steps, graphs.steps
    big = (s0["prefill_tokens"] + s0["decode_tokens"]).to_numpy() > 32
    d0 = s0["duration_s"].to_numpy() / s0["count"].to_numpy()
    d1 = s1["duration_s"].to_numpy() / s1["count"].to_numpy()
    assert big.any() and np.all(d0[big] >= floor * (1 - 1e-12)) and d1.max() < floor
    assert (s0["prefill_tokens"] == s1["prefill_tokens"]).all()  # the same iterations, only their lengths
    assert np.array_equal(d0[~big], d1[~big])  # the small ones exactly as measured
    assert "--max-cudagraph-capture-size 2048" in vllm_serve(sc)
    assert "--max-cudagraph-capture-size" not in vllm_serve(scenario_from_dict({**raw, "engine": {"scheduler": "chunked"}}))
    with pytest.raises(ScenarioError, match="engine.max_cudagraph_capture_size: 2048 with engine.enforce_eager"):
        scenario_from_dict({**raw, "engine": {**raw["engine"], "enforce_eager": True}})
