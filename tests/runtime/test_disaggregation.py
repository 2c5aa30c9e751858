"""Disaggregated prefill/decode (sim/runtime/disaggregation.py): hand-computed timelines with the unit cost
model, the transfer formula, decode-side admission waiting for blocks, invariants, config errors."""
from __future__ import annotations

import numpy as np
import pytest

from sim.config.errors import ScenarioError
from sim.presets.hardware import HARDWARE_PRESETS
from simhelpers import make_scenario, run

KV_BYTES = 32 * 8 * 128 * 2 * 2  # llama-3-8b: layers x KV heads x head dim x (K, V) x bf16 = 131072 B/token
# a link on which 100 tokens of KV take 0.25 s + 0.25 s latency: 13,107,200 B / 0.25 s
SLOW_LINK = {"bandwidth_gbps": 13_107_200 / 0.25 * 8 / 1e9, "latency_us": 250_000}


def disagg(p=1, d=1, link=SLOW_LINK, **pools):
    return {"prefill_replicas": p, "decode_replicas": d, "link": link, **pools}


def test_two_requests_prefill_transfer_and_decode_by_hand():
    # unit cost: prefill replica runs both prompts in [0, 1]; each KV takes 0.5 s -> both reach the
    # decode replica at 1.5; it recomputes their last prompt token in [1.5, 2.5] (first tokens, as
    # the client sees them), then decodes tokens 2 and 3 in [2.5, 3.5] and [3.5, 4.5]
    r = run([0.0, 0.0], 100, 3, scheduler="chunked", disaggregation=disagg())
    rq = r.requests
    assert rq["ttft_s"].tolist() == [2.5, 2.5] and rq["finish_s"].tolist() == [4.5, 4.5]
    assert rq["kv_transfer_s"].tolist() == pytest.approx([0.5, 0.5])
    assert rq["prefill_replica"].tolist() == [0, 0] and rq["replica"].tolist() == [1, 1]
    assert rq["tpot_s"].tolist() == [1.0, 1.0]
    s = r.summary
    assert s["kv_transfer_bytes"] == 2 * 100 * KV_BYTES
    steps = r.steps
    assert steps[steps["replica"] == 0]["start_s"].tolist() == [0.0]
    assert steps[steps["replica"] == 1][["start_s", "count"]].values.tolist() == [[1.5, 1], [2.5, 2]]
    # decode pool busy 3 of 4.5 s, prefill pool 1 of 4.5 s
    assert s["pool_utilization"] == pytest.approx({"prefill": 1 / 4.5, "decode": 3 / 4.5})


def test_a_full_decode_replica_makes_the_arriving_request_wait_for_blocks():
    # 8 blocks of 16 on the decode side: one 100-token prompt takes 7 (its KV arrives whole), so
    # the second waits until the first finishes at 4.5, then runs [4.5, 5.5] [5.5, 6.5] [6.5, 7.5]
    r = run([0.0, 0.0], 100, 3, scheduler="chunked", disaggregation=disagg(decode={"num_gpu_blocks": 8}))
    rq = r.requests
    assert rq["first_token_s"].tolist() == [2.5, 5.5] and rq["finish_s"].tolist() == [4.5, 7.5]
    assert (r.steps[r.steps["replica"] == 1]["kv_blocks_used"] <= 8).all()


def test_transfer_time_is_latency_plus_bytes_over_min_tp_links():
    sc = make_scenario(scheduler="chunked", disaggregation=disagg(link="infiniband",
                                                                  prefill={"tensor_parallel_size": 2}))
    d = sc.engine.disaggregation
    # infiniband: 50 GB/s per GPU, 5 us; TP 2 -> 1 decode rank: min(2, 1) = 1 link
    assert d.transfer_s(1000, KV_BYTES, sc.hardware) == pytest.approx(5e-6 + 1000 * KV_BYTES / 50e9)
    nv = make_scenario(scheduler="chunked", disaggregation=disagg(link="nvlink")).engine.disaggregation
    assert nv.bandwidth(sc.hardware) == HARDWARE_PRESETS["h100-sxm"].interconnect_bandwidth
    assert d.prefill.tensor_parallel_size == 2 and d.decode.tensor_parallel_size == 1


def test_every_request_finishes_once_and_tokens_add_up_under_load():
    rng = np.random.default_rng(3)
    n = 300
    arrival = np.sort(rng.uniform(0, 20, n))
    prompt = rng.integers(50, 2000, n)
    output = rng.integers(2, 300, n)
    r = run(arrival, prompt, output, scheduler="chunked", cost_model="roofline",
            disaggregation=disagg(p=2, d=2, link="infiniband", decode={"num_gpu_blocks": 400}))
    rq = r.requests
    assert rq["finish_s"].notna().all() and (rq["first_token_s"] > rq["arrival_s"]).all()
    assert set(rq["prefill_replica"]) <= {0, 1} and set(rq["replica"]) <= {2, 3}
    # the first token comes after the prefill and the transfer
    assert (rq["first_token_s"] >= rq["arrival_s"] + rq["kv_transfer_s"]).all()
    assert r.summary["kv_transfer_bytes"] == pytest.approx(float(prompt.sum()) * KV_BYTES)
    assert (r.steps[r.steps["replica"] >= 2]["kv_blocks_used"] <= 400).all()
    assert 0 < r.summary["pool_utilization"]["prefill"] <= 1 and 0 < r.summary["pool_utilization"]["decode"] <= 1


@pytest.mark.parametrize("engine, says", [
    ({"replicas": 2, "disaggregation": disagg()}, "leave replicas at 1"),
    ({"disaggregation": disagg(link="carrier-pigeon")}, "'carrier-pigeon' is not one of nvlink"),
    ({"disaggregation": disagg(prefill={"block_size": 32})}, "engine.disaggregation.prefill.block_size: unknown key"),
    ({"disaggregation": disagg(decode={"scheduler": "static"})}, "disaggregation.decode.scheduler: static cannot"),
    ({"disaggregation": disagg(prefill={"tensor_parallel_size": 3})}, "engine.disaggregation.prefill.tensor_parallel_size: 3 does not divide"),
    ({"disaggregation": {"prefill_replicas": 1}}, "decode_replicas"),
    ({"disaggregation": disagg(), "speculative": {"method": "ngram", "num_speculative_tokens": 2,
                                                  "acceptance_rate": 0.5}}, "not modelled"),
])
def test_bad_disaggregation_is_one_clear_error(engine, says):
    with pytest.raises(ScenarioError) as e:
        make_scenario(scheduler="chunked", **engine)
    assert says in str(e.value)


def test_a_pool_on_another_gpu_gets_that_gpus_budget_and_costs():
    from sim.build import pool_scenarios

    sc = make_scenario(cost_model="roofline", scheduler="chunked",
                       disaggregation=disagg(link="nvlink", decode={"hardware": "h200"}))
    prefill, decode = pool_scenarios(sc)
    assert prefill.hardware.name == "h100-sxm" and decode.hardware.name == "h200"
    assert decode.budget.num_gpu_blocks > prefill.budget.num_gpu_blocks  # 141 GB vs 80 GB
    r = run(np.linspace(0, 1, 20), 500, 50, scheduler="chunked", cost_model="roofline",
            disaggregation=disagg(link="nvlink", decode={"hardware": "h200"}))
    assert r.requests["finish_s"].notna().all()
    with pytest.raises(ScenarioError, match="engine.disaggregation.decode.hardware: unknown GPU 'tpu'"):
        make_scenario(scheduler="chunked", disaggregation=disagg(decode={"hardware": "tpu"}))
