"""summary.json's MBU estimate for a mixture of experts and a hybrid, by hand (unit cost: 1 s an
iteration): the experts an iteration's tokens touch are read, not all of them; a hybrid's decodes
read and write their linear-attention states."""
from __future__ import annotations

import pytest

from sim.presets.hardware import HARDWARE_PRESETS
from sim.presets.memory import linear_state_bytes
from sim.presets.models import MODEL_PRESETS
from sim.scenario import scenario_from_dict
from sim.simulate import simulate
from simhelpers import make_workload, run

H100 = HARDWARE_PRESETS["h100-sxm"]


def test_a_moe_iteration_reads_the_experts_its_tokens_touch():
    """Qwen3-30B-A3B (128 experts, 8 a token), one request of 8 + 3 tokens, chunked: [0,1] prefills 8
    tokens, [1,2] and [2,3] decode 1 each (contexts 9 and 10 read). A T-token iteration reads the
    non-expert weights and 1 - (1 - 8/128)^T of the routed experts' bytes."""
    m = MODEL_PRESETS["qwen3-30b-a3b"]
    r = run([0.0], [8], [3], model="qwen3-30b-a3b", scheduler="chunked")
    routed = m.routed_expert_params * m.expert_bytes_per_weight
    miss = 1 - 8 / 128
    weights = sum((m.weight_bytes - routed) + routed * (1 - miss ** t) for t in (8, 1, 1))
    kv = (9 + 10) * m.kv_bytes_per_token
    assert r.summary["duration_s"] == 3.0
    assert r.summary["mbu"] == pytest.approx((weights + kv) / (3.0 * H100.hbm_bandwidth), rel=1e-12)
    # (reading every expert every iteration, as before, would put it 4.6x higher)
    assert r.summary["mbu"] < 0.25 * (3 * m.weight_bytes + kv) / (3.0 * H100.hbm_bandwidth)


def test_a_hybrids_decodes_read_and_write_their_states():
    """Qwen3-Next at TP2 on an H100-sized GPU of 200 GB: besides its weights (experts as above: 512, 10
    a token) and the KV of its 12 attention layers, each decode reads and writes the state of every
    one of its 36 GDN layers (1,097,728 B each, over both GPUs)."""
    m = MODEL_PRESETS["qwen3-next-80b-a3b"]
    hw = {"name": "big", "memory_bytes": 200e9, "hbm_bandwidth": 3.35e12, "bf16_flops": 989e12,
          "interconnect_bandwidth": 450e9}
    sc = scenario_from_dict({"model": "qwen3-next-80b-a3b", "hardware": hw, "cost_model": "unit",
                             "engine": {"scheduler": "chunked", "tensor_parallel_size": 2},
                             "workload": {"arrival": {"process": "burst"}, "num_requests": 1,
                                          "prompt_tokens": {"dist": "fixed", "value": 1},
                                          "output_tokens": {"dist": "fixed", "value": 1}}})
    r = simulate(sc, workload=make_workload([0.0], [8], [3]))
    routed = m.routed_expert_params * m.expert_bytes_per_weight
    miss = 1 - 10 / 512
    weights = sum((m.weight_bytes - routed) + routed * (1 - miss ** t) for t in (8, 1, 1))
    states = 2 * 36 * linear_state_bytes(m, 1) * 2  # two decodes
    kv = (9 + 10) * m.kv_bytes_per_token
    assert linear_state_bytes(m, 1) == 1_097_728
    assert r.summary["mbu"] == pytest.approx((weights + states + kv) / (3.0 * 2 * 3.35e12), rel=1e-12)
