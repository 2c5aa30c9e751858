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
    from sim.config.scenario import scenario_from_dict
    from sim.planning.vllm_command import vllm_serve
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
