"""vLLM V1's engine overheads on top of kernel-table step costs (sim/cost/overheads.py): the step rule
max(gpu, host) + adders, the request-side frontend time and the asynchronous-scheduling lag, the
scenario keys, and what summary.json and the planner say about them. Numbers by hand."""
from pathlib import Path

import numpy as np
import pytest

from sim.build import cost_model
from sim.config.errors import ScenarioError
from sim.cost.batch import BatchStats
from sim.cost.overheads import EngineOverheads, default_overheads, scheduling_lag
from sim.scenario import scenario_from_dict
from sim.simulate import simulate
from simhelpers import make_workload

ROOT = Path(__file__).resolve().parents[2]


def scenario(measured=None, model="llama-3-8b", tp=1, **engine):
    return scenario_from_dict({
        "name": "t", "model": model, "hardware": "h100-sxm",
        "cost_model": {"measured": measured} if measured is not None else None,
        "engine": {"scheduler": "chunked", "tensor_parallel_size": tp, **engine},
        "workload": {"arrival": {"process": "burst"}, "num_requests": 1,
                     "prompt_tokens": {"dist": "fixed", "value": 1},
                     "output_tokens": {"dist": "fixed", "value": 1}}})


NONE = {"host_per_iteration_s": 0.0, "per_iteration_s": 0.0, "tp_sync_per_iteration_s": 0.0,
        "frontend_s": 0.0, "frontend_per_prompt_token_s": 0.0, "async_scheduling": False,
        "frontend_cv": 0.0, "stall_rate_per_s": 0.0, "stall_s": 0.0}


def test_scheduling_lag_by_hand():
    # replica 0: iteration [0, 1), iteration [1, 2.5), a run of three [2.5, 3), [3, 3.5), [3.5, 4),
    # idle, iteration [6, 6.25)
    steps = (np.array([0, 0, 0, 0]), np.array([0.0, 1.0, 2.5, 6.0]), np.array([1.0, 1.5, 1.5, 0.25]),
             np.array([1, 1, 3, 1]))
    durations = np.array([1.0, 1.5, 0.5, 0.5, 0.5, 0.25])
    arrival = np.array([0.0, 0.5, 0.0, 1.2, 2.6, 6.0, 3.7])
    first_scheduled = np.array([0.0, 1.0, 2.5, 2.5, 6.0, 6.0, np.nan])
    lag = scheduling_lag(arrival, first_scheduled, np.zeros(7, dtype=np.int64), steps, durations)
    assert lag.tolist() == [
        0.0,   # arrived to an idle engine: scheduled at once
        1.0,   # arrived during [0, 1): [1, 2.5) was already scheduled; one iteration like [0, 1) late
        0.0,   # waited since 0 (no room): the scheduler saw it before [1, 2.5) started
        1.5,   # arrived during [1, 2.5), first scheduled at 2.5: one iteration like [1, 2.5) late
        0.0,   # first scheduled after an idle gap: the engine was idle when it was taken
        0.0,   # arrived at 6.0 with the engine idle
        0.0,   # never scheduled (nan)
    ]


def test_a_host_floor_and_adders_on_the_kernel_time():
    stats = BatchStats(num_decodes=8, decode_context_sum=8 * 1000)
    gpu = cost_model(scenario(NONE)).step_times(stats)[0]  # ~7 ms of kernel time for Llama-3-8B
    hidden = cost_model(scenario({**NONE, "host_per_iteration_s": gpu / 2})).step_times(stats)[0]
    floor = cost_model(scenario({**NONE, "host_per_iteration_s": 0.02})).step_times(stats)[0]
    added = cost_model(scenario({**NONE, "per_iteration_s": 0.001, "tp_sync_per_iteration_s": 0.002}))
    assert hidden == gpu                       # host time shorter than the GPU's: hidden
    assert floor == pytest.approx(0.02)        # longer: the iteration waits for the host
    assert added.step_times(stats)[0] == pytest.approx(gpu + 0.001)  # TP 1: no TP sync
    tp2 = cost_model(scenario({**NONE, "tp_sync_per_iteration_s": 0.002}, tp=2))
    tp2_none = cost_model(scenario(NONE, tp=2))
    assert tp2.step_times(stats)[0] == pytest.approx(tp2_none.step_times(stats)[0] + 0.002)
    run = cost_model(scenario({**NONE, "host_per_iteration_s": 0.02, "per_iteration_s": 0.001})).step_times(stats, 4)
    assert run.tolist() == pytest.approx([0.021] * 4)


def test_frontend_time_shifts_ttft_and_e2e_and_not_tpot():
    w = make_workload([0.0, 0.3, 0.31], [500, 700, 900], [20, 30, 40])
    base = simulate(scenario(NONE), workload=w).requests
    fe = simulate(scenario({**NONE, "frontend_s": 0.004, "frontend_per_prompt_token_s": 1e-6}),
                  workload=w).requests
    shift = 0.004 + 1e-6 * np.array([500, 700, 900])
    assert (fe["ttft_s"] - base["ttft_s"]).to_numpy() == pytest.approx(shift, abs=1e-12)
    assert (fe["e2el_s"] - base["e2el_s"]).to_numpy() == pytest.approx(shift, abs=1e-12)
    assert fe["tpot_s"].to_numpy() == pytest.approx(base["tpot_s"].to_numpy(), abs=1e-12)
    assert fe["queue_s"].tolist() == base["queue_s"].tolist()  # the engine itself is not delayed


def test_async_scheduling_adds_an_iteration_to_a_request_that_arrived_mid_iteration():
    # request 0 alone at t = 0 (idle engine: no lag); request 1 arrives 1 ms into request 0's
    # prefill iteration, which it then waits one more iteration like for
    w = make_workload([0.0, 0.001], [64, 64], [50, 50])
    base = simulate(scenario(NONE), workload=w)
    lagged = simulate(scenario({**NONE, "async_scheduling": True}), workload=w)
    r0, r1 = base.requests, lagged.requests
    first = base.steps.iloc[0]  # request 0's prefill, [0, d): request 1 arrived during it
    assert first["start_s"] == 0.0 and first["count"] == 1 and r0["queue_s"][1] == pytest.approx(first["duration_s"] - 0.001)
    assert r1["ttft_s"][0] == r0["ttft_s"][0]
    assert r1["ttft_s"][1] - r0["ttft_s"][1] == pytest.approx(first["duration_s"], rel=1e-12)
    assert r1["e2el_s"][1] - r0["e2el_s"][1] == pytest.approx(first["duration_s"], rel=1e-12)


def test_the_defaults_are_the_fitted_ones_and_summary_json_states_them():
    sc = scenario()
    assert sc.cost_model.overheads == default_overheads()
    import yaml
    doc = yaml.safe_load((ROOT / "sim/profiles/vllm_v1_overheads.yaml").read_text())
    assert default_overheads() == EngineOverheads(**doc["overheads"])
    prov = simulate(sc, workload=make_workload([0.0], [100], [5])).summary["run"]["cost_model"]
    assert prov["engine_overheads"] == doc["overheads"]
    band = prov["error_band"]
    assert band["slower"] >= 1 >= band["faster"] > 0 and "leave-one-model-out" in band["basis"]
    # a tuned key replaces its default only, and the resolved scenario writes them all out
    tuned = scenario({"frontend_s": 0.01})
    assert tuned.cost_model.overheads == EngineOverheads(**{**doc["overheads"], "frontend_s": 0.01})
    assert tuned.cost_model.as_yaml() == {"measured": {**doc["overheads"], "frontend_s": 0.01}}


@pytest.mark.parametrize("measured, message", [
    ({"frontend_s": -1}, "cost_model.measured.frontend_s: -1 is not a number >= 0"),
    ({"host_per_iteration_s": "fast"}, "cost_model.measured.host_per_iteration_s"),
    ({"async_scheduling": "yes"}, "cost_model.measured.async_scheduling: must be true or false"),
    ({"frontend": 0.1}, "frontend"),
])
def test_bad_overhead_keys_are_one_clear_error(measured, message):
    with pytest.raises(ScenarioError, match=message.replace(".", r"\.")):
        scenario(measured)


def test_roofline_and_unit_carry_no_overheads_and_no_error_band():
    for spec in ("roofline", "unit"):
        sc = scenario_from_dict({"model": "llama-3-8b", "hardware": "h100-sxm", "cost_model": spec,
                                 "workload": {"arrival": {"process": "burst"}, "num_requests": 1,
                                              "prompt_tokens": {"dist": "fixed", "value": 1},
                                              "output_tokens": {"dist": "fixed", "value": 1}}})
        assert sc.cost_model.overheads is None and sc.cost_model.error_band() is None
