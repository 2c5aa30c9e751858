"""Invariants that hold for any workload and engine settings, checked on random small cases (unit
cost): every request finishes once, tokens are conserved, time never goes back, KV and seat limits
hold, and fast-forward changes nothing."""
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from simhelpers import run

# No shrink phase: shrinking a failing 30-request case costs minutes of reruns. Failures print the
# generated case as is (add Phase.shrink locally to minimise one).
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    phases=[Phase.explicit, Phase.reuse, Phase.generate])


@st.composite
def cases(draw):
    n = draw(st.integers(1, 30))
    # integer arrivals collide with iteration ends (unit cost); fractional ones fall inside them
    arrival = sorted(draw(st.lists(st.one_of(st.integers(0, 40).map(float),
                                             st.floats(0, 40, allow_nan=False)),
                                   min_size=n, max_size=n)))
    prompt = draw(st.lists(st.integers(1, 64), min_size=n, max_size=n))
    output = draw(st.lists(st.integers(1, 64), min_size=n, max_size=n))
    scheduler = draw(st.sampled_from(["static", "continuous", "chunked"]))
    seqs = draw(st.integers(1, 8))
    block_size = draw(st.sampled_from([1, 2, 4, 16]))
    longest = max(p + o for p, o in zip(prompt, output))
    low = max(seqs, longest) if scheduler == "continuous" else seqs
    budget = draw(st.integers(low, low + 64))
    if scheduler == "static":  # a row reserves its prompt + the longest output
        need = -(-(max(prompt) + max(output)) // block_size)
    else:  # prompt + output - 1 tokens of KV, in whole blocks
        need = max(-(-(p + o - 1) // block_size) for p, o in zip(prompt, output))
    engine = dict(scheduler=scheduler, max_num_seqs=seqs, max_num_batched_tokens=budget,
                  block_size=block_size, num_gpu_blocks=need + draw(st.integers(0, 3 * need)),
                  policy=draw(st.sampled_from(["fcfs", "sjf", "priority"])),
                  batch_timeout_s=draw(st.sampled_from([0.0, 0.0, 1.5])),
                  replicas=draw(st.sampled_from([1, 1, 2])),
                  router=draw(st.sampled_from(["round_robin", "least_loaded"])))
    priority = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    return dict(arrival=arrival, prompt=prompt, output=output, priority=priority), engine


def simulate_case(case, ff=True):
    work, engine = case
    return run(work["arrival"], work["prompt"], work["output"], work["priority"],
               fast_forward=ff, **engine)


@SETTINGS
@given(case=cases())
def test_invariants(case):
    work, engine = case
    r = simulate_case(case)
    rq, steps, n = r.requests, r.steps, len(work["arrival"])
    output = np.array(work["output"])

    # every request finishes exactly once
    assert r.summary["completed"] == n
    assert np.isfinite(rq["finish_s"]).all() and np.isfinite(rq["first_token_s"]).all()

    # per-request times: unit cost, so a first token takes >= 1 iteration, each later one >= 1 more
    assert (rq["queue_s"] >= 0).all()
    assert (rq["first_token_s"] >= rq["arrival_s"] + 1).all()
    assert (rq["ttft_s"] <= rq["e2el_s"]).all()
    assert (rq["finish_s"] - rq["first_token_s"] >= output - 1 - 1e-9).all()  # times are floats
    assert (rq["arrival_s"] + rq["queue_s"] < rq["first_token_s"]).all()
    if engine["replicas"] == 1:
        assert (rq["replica"] == 0).all()
    elif engine["router"] == "round_robin":
        assert rq["replica"].tolist() == [i % 2 for i in range(n)]
    assert rq["replica"].isin(range(engine["replicas"])).all()

    # tokens: each prompt token computed at least once, one decode per later output token; with no
    # preemption exactly once, and then every sampled token is a first token or a decode's
    prefill = int((steps["prefill_tokens"] * steps["count"]).sum())
    decodes = int((steps["decode_tokens"] * steps["count"]).sum())
    preemptions = int(rq["preemptions"].sum())
    assert r.summary["preemptions"] == preemptions
    if engine["scheduler"] == "static":
        assert preemptions == 0
    if preemptions == 0:
        assert prefill == sum(work["prompt"])
        assert decodes + n == output.sum()  # decodes + first tokens == tokens sampled
    else:  # a recompute prefill samples one token that is neither a first token nor a decode; it
        # computes again what the resumed request's prefix-cache hits (its own full blocks, cached
        # at the preemption: on by default) do not cover, which may be nothing it had computed
        # (hypothesis found one: all of its computed tokens in full blocks, still cached)
        assert prefill + decodes >= sum(work["prompt"]) + (output - 1).sum()
        assert output.sum() - preemptions <= decodes + n <= output.sum()

    # the engine's own rows
    assert (steps["count"] >= 1).all()
    assert (steps["kv_blocks_used"] >= 0).all()
    assert (steps["kv_blocks_used"] <= steps["kv_blocks_total"]).all()
    assert (steps["kv_blocks_total"] == engine["num_gpu_blocks"]).all()
    assert (steps["num_seqs"] >= 1).all()
    assert (steps["num_seqs"] <= engine["max_num_seqs"]).all()
    if engine["scheduler"] != "static":
        assert (steps["prefill_tokens"] + steps["decode_tokens"]
                <= engine["max_num_batched_tokens"]).all()
    assert (steps["duration_s"] == steps["count"]).all()  # unit cost
    assert r.summary["iterations"] == steps["count"].sum()

    # time never goes back on a replica: an iteration starts after the previous one ended
    for _, rows in steps.groupby("replica"):
        start, end = rows["start_s"].to_numpy(), (rows["start_s"] + rows["duration_s"]).to_numpy()
        assert (np.diff(start) > 0).all()
        assert (end[:-1] <= start[1:]).all()
    assert rq["finish_s"].max() == (steps["start_s"] + steps["duration_s"]).max()


@SETTINGS
@given(case=cases())
def test_fast_forward_changes_nothing(case):
    fast, stepped = simulate_case(case, ff=True), simulate_case(case, ff=False)
    assert np.allclose(fast.requests.to_numpy(np.float64), stepped.requests.to_numpy(np.float64),
                       rtol=1e-9, atol=1e-9, equal_nan=True)
    assert fast.steps["count"].sum() == stepped.steps["count"].sum()
    assert fast.steps["duration_s"].sum() == pytest.approx(stepped.steps["duration_s"].sum())
    for key in ("completed", "duration_s", "iterations", "preemptions", "slot_utilization",
                "kv_utilization", "kv_waste", "padding_waste", "mfu", "mbu"):
        assert fast.summary[key] == pytest.approx(stepped.summary[key], rel=1e-9), key
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        a, b = fast.summary[key], stepped.summary[key]
        assert a.keys() == b.keys(), key
        for stat in a:  # None: no sample at all (e.g. TPOT when every output is one token)
            assert (a[stat] is None) == (b[stat] is None), (key, stat)
            if a[stat] is not None:
                assert a[stat] == pytest.approx(b[stat], rel=1e-9), (key, stat)


@SETTINGS
@given(case=cases())
def test_itl_counts_every_gap_between_tokens_once(case):
    """Each request has output - 1 inter-token gaps that add up to finish - first token, whatever
    the batching and preemptions in between, so the mean ITL over all gaps is exact."""
    r = simulate_case(case)
    rq = r.requests[r.requests["output_tokens"] > 1]
    if len(rq) == 0:
        assert r.summary["itl_ms"]["mean"] is None
        return
    span = (rq["finish_s"] - rq["first_token_s"]).sum()
    gaps = (rq["output_tokens"] - 1).sum()
    assert r.summary["itl_ms"]["mean"] == pytest.approx(1e3 * span / gaps, rel=1e-9)
