"""Metrics: weighted percentiles, the per-request frame, goodput, utilisation and waste, ITL — on
hand-computed unit-cost runs (every iteration lasts 1 s)."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.presets.hardware import HARDWARE_PRESETS
from sim.presets.models import MODEL_PRESETS
from sim.runtime.metrics import distribution, weighted_percentiles
from simhelpers import run

TOY_OUTPUTS = [444, 480, 91, 315, 573, 547, 464, 360]
QS = (50, 90, 95, 99)


# ------------------------------------------------------------------ percentiles

@settings(max_examples=200, deadline=None)
@given(data=st.lists(st.tuples(st.floats(-1e6, 1e6, allow_nan=False), st.integers(0, 6)),
                     min_size=1, max_size=30).filter(lambda d: sum(w for _, w in d) > 0),
       qs=st.lists(st.floats(0, 100), min_size=1, max_size=5))
def test_weighted_percentiles_equal_numpy_on_the_expanded_array(data, qs):
    values = np.array([v for v, _ in data])
    weights = np.array([w for _, w in data], dtype=np.float64)
    expanded = np.repeat(values, weights.astype(np.int64))
    got = weighted_percentiles(values, weights, qs)
    np.testing.assert_allclose(got, np.percentile(expanded, qs), rtol=1e-9, atol=1e-9)


def test_weighted_percentiles_by_hand():
    # expanded: [1, 1, 1, 5, 9, 9] -> positions q/100 * 5
    values, weights = np.array([9.0, 1.0, 5.0, 7.0]), np.array([2.0, 3.0, 1.0, 0.0])
    got = weighted_percentiles(values, weights, [0, 50, 60, 100])
    # 50 -> 2.5: between 1 (index 2) and 5 (index 3) -> 3;  60 -> 3.0 -> 5
    np.testing.assert_array_equal(got, [1.0, 3.0, 5.0, 9.0])
    assert np.isnan(weighted_percentiles(values, np.zeros(4), [50])).all()


@settings(max_examples=300, deadline=None)
@given(data=st.lists(st.tuples(st.one_of(st.sampled_from([0.0, 0.0125, 0.02, 1e-300, 7.0]),
                                         st.floats(0, 1e3, allow_nan=False)), st.integers(0, 6)),
                     min_size=1, max_size=60),
       qs=st.lists(st.floats(0, 100), min_size=1, max_size=6), few=st.integers(1, 40),
       integer_weights=st.booleans())
def test_radix_selection_gives_the_sorts_values_exactly(data, qs, few, integer_weights):
    """Past select_above values weighted_percentiles finds its ranks by radix selection over the
    floats' bits: the same values, bit for bit, as the sort (ties, zeros, zero weights, a bucket
    split down to its last bit when `_FEW` is small)."""
    import sim.runtime.metrics as metrics

    values = np.array([v for v, _ in data])
    weights = np.array([w for _, w in data], dtype=np.int32 if integer_weights else np.float64)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(metrics, "_FEW", few)
        got = weighted_percentiles(values, weights, qs, select_above=0)
    np.testing.assert_array_equal(got, weighted_percentiles(values, weights, qs))


def test_radix_selection_on_a_long_array_by_hand(monkeypatch):
    """Two million gaps: 1,999,000 of 10 ms and 1,000 of 50 ms (weight 3 each): p50 is 10 ms,
    p99.9 falls in the 50 ms ones (rank 0.999 x 2,001,999 = 1,999,998.0 > 1,998,999)."""
    import sim.runtime.metrics as metrics

    monkeypatch.setattr(metrics, "_CHUNK_VALUES", 1 << 16)  # many chunks
    values = np.concatenate((np.full(1_999_000, 0.010), np.full(1_000, 0.050)))
    weights = np.concatenate((np.ones(1_999_000), np.full(1_000, 3.0)))
    got = weighted_percentiles(values, weights, [50, 99.9], select_above=1000)
    np.testing.assert_array_equal(got, [0.010, 0.050])


def test_distribution_reports_ms_and_skips_nan():
    d = distribution(np.array([0.001, np.nan, 0.003]))
    assert d["mean"] == pytest.approx(2.0)
    assert d["p50"] == pytest.approx(2.0)
    assert d["p99"] == pytest.approx(2.98)
    assert distribution(np.array([np.nan])) == {"mean": None, "p50": None, "p90": None,
                                                "p95": None, "p99": None}


_MEAN_OF_RANDOM_GAPS = """
import numpy as np
from sim.runtime.metrics import distribution
rng = np.random.default_rng(7)
values, weights = rng.random(300_000) * 0.05, rng.integers(1, 4, 300_000).astype(float)
print(repr(distribution(values, weights)["mean"]))
"""


@pytest.mark.skipif(__import__("platform").machine() not in ("x86_64", "AMD64"),
                    reason="OPENBLAS_CORETYPE names x86 kernels")
def test_the_mean_is_the_same_whatever_blas_kernel_and_threads():
    """summary.json's means once came from BLAS's dot, whose order of additions follows the CPU's
    kernel and the thread count: the generic kernel on one thread gave another last digit than
    this machine's on two. The mean must not depend on either, and must be the sum to rounding."""
    import os
    import subprocess
    import sys
    means = set()
    for env in ({}, {"OPENBLAS_CORETYPE": "Prescott", "OPENBLAS_NUM_THREADS": "1"},
                {"OPENBLAS_NUM_THREADS": "2"}):
        out = subprocess.run([sys.executable, "-c", _MEAN_OF_RANDOM_GAPS], capture_output=True,
                             text=True, check=True, env={**os.environ, **env})
        means.add(out.stdout.strip())
    assert len(means) == 1, means
    rng = np.random.default_rng(7)
    values, weights = rng.random(300_000) * 0.05, rng.integers(1, 4, 300_000).astype(float)
    exact = math.fsum((values * weights).tolist()) / weights.sum() * 1e3
    assert float(means.pop()) == pytest.approx(exact, rel=1e-14)


def test_weighted_sum_by_hand(monkeypatch):
    """Chunks are summed exactly: 1e16 + 1 + 1 - 1e16 is 2 (a left fold gives 0)."""
    import sim.runtime.metrics as metrics

    monkeypatch.setattr(metrics, "_CHUNK_VALUES", 1)
    assert metrics.weighted_sum(np.array([1e16, 1.0, 1.0, -1e16]), np.ones(4)) == 2.0
    assert metrics.weighted_sum(np.array([0.5, 0.25]), np.array([2.0, 4.0])) == 2.0


# ------------------------------------------------------------------ per-request frame

def test_request_columns_by_hand():
    r = run([0.0, 0.0, 0.5], 4, [1, 3, 4], scheduler="continuous", max_num_seqs=2,
            max_num_batched_tokens=16)
    # [0,1] A, B prefill -> A done @ 1 (1 token), B tok 1 @ 1
    # [1,2] B decode + C (arrived 0.5) prefill -> B tok 2, C tok 1 @ 2;  [2,3] -> B done @ 3
    # [3,4] [4,5] C -> tok 4 @ 5, done
    rq = r.requests
    assert rq["finish_s"].tolist() == [1.0, 3.0, 5.0]
    assert rq["ttft_s"].tolist() == [1.0, 1.0, 1.5]
    assert rq["e2el_s"].tolist() == [1.0, 3.0, 4.5]
    assert rq["queue_s"].tolist() == [0.0, 0.0, 0.5]
    # tpot = (e2e - ttft) / (output - 1); undefined for a single token
    assert np.isnan(rq["tpot_s"].iloc[0])
    assert rq["tpot_s"].tolist()[1:] == [(3.0 - 1.0) / 2, (4.5 - 1.5) / 3]
    s = r.summary
    assert s["duration_s"] == 5.0  # last finish 5 - first arrival 0
    assert s["request_throughput"] == pytest.approx(3 / 5)
    assert s["output_throughput"] == pytest.approx(8 / 5)
    assert s["total_token_throughput"] == pytest.approx((12 + 8) / 5)
    assert s["ttft_ms"]["mean"] == pytest.approx(3500 / 3)
    assert s["tpot_ms"]["mean"] == pytest.approx(1000.0)  # the NaN of request 0 is skipped
    assert s["e2el_ms"]["p50"] == pytest.approx(3000.0)  # median of 1, 3, 4.5 s


# ------------------------------------------------------------------ goodput

GOODPUT_CASE = dict(arrival=[0.0] * 4, prompt=1, output=[1, 2, 3, 4])
# one seat, fcfs: [0,1] [1,3] [3,6] [6,10] -> ttft 1, 2, 4, 7 s; tpot -, 1, 1, 1 s


def test_goodput_counts_requests_meeting_every_slo():
    c = GOODPUT_CASE
    r = run(c["arrival"], c["prompt"], c["output"], scheduler="continuous", max_num_seqs=1,
            slo={"ttft_ms": 2500, "tpot_ms": 1000, "percentile": 50})
    g = r.summary["goodput"]
    # ttft <= 2.5 s: requests 0, 1; tpot 1000 is not above 1000; request 0 has no tpot
    assert g["requests_per_s"] == pytest.approx(2 / 10)
    assert g["fraction"] == 0.5
    # p50 of ttft [1000, 2000, 4000, 7000] = 3000 > 2500: missed; p50 of tpot [1000]*3 = 1000: met
    assert g["ttft_ms"] == {"target": 2500, "percentile": 50, "observed": 3000.0, "met": False}
    assert g["tpot_ms"] == {"target": 1000, "percentile": 50, "observed": 1000.0, "met": True}
    assert g["percentile"] == 50
    assert g["met"] is False


def test_goodput_with_itl_and_e2el_targets_each_at_its_own_percentile():
    c = GOODPUT_CASE
    r = run(c["arrival"], c["prompt"], c["output"], scheduler="continuous", max_num_seqs=1,
            slo={"itl_ms": "999@p50", "e2el_ms": "5000@p60", "percentile": 99})
    g = r.summary["goodput"]
    # each gap ends with the iteration that sampled its token: [2,3] for request 1, [4,5] [5,6], ...
    assert r.itl[2].tolist() == [3.0, 5.0, 6.0, 8.0, 9.0, 10.0] and r.itl[1].tolist() == [1] * 6
    # e2e 1, 3, 6, 10 s: requests 0 and 1 within 5 s; p60 of [1000, 3000, 6000, 10000] = 5400 > 5000
    assert g["e2el_ms"] == {"target": 5000, "percentile": 60, "observed": pytest.approx(5400.0), "met": False}
    # one seat, 1 s iterations: 1 + 2 + 3 gaps between tokens, each one iteration: p50 = 1000 ms > 999
    assert g["itl_ms"] == {"target": 999, "percentile": 50, "observed": 1000.0, "met": False}
    # ITL is a property of the token stream: only E2EL decides which requests count
    assert g["requests_per_s"] == pytest.approx(2 / 10)
    assert g["met"] is False
    met = run(c["arrival"], c["prompt"], c["output"], scheduler="continuous", max_num_seqs=1,
              slo={"itl_ms": 1000, "e2el_ms": 10000}).summary["goodput"]
    assert met["met"] is True and met["fraction"] == 1.0


def test_goodput_tpot_only():
    c = GOODPUT_CASE
    r = run(c["arrival"], c["prompt"], c["output"], scheduler="continuous", max_num_seqs=1,
            slo={"tpot_ms": 999})
    g = r.summary["goodput"]
    # every multi-token request decodes at 1000 ms/token > 999: only request 0 (no tpot) is good
    assert g["fraction"] == 0.25
    assert g["requests_per_s"] == pytest.approx(1 / 10)
    assert "ttft_ms" not in g
    assert g["tpot_ms"]["met"] is False and g["met"] is False


# ------------------------------------------------------------------ utilisation and waste

@pytest.mark.parametrize("ff", [True, False])
def test_static_toy_utilisation_and_waste(ff):
    r = run([0.0] * 8, 16, TOY_OUTPUTS, scheduler="static", max_num_seqs=8, block_size=16,
            num_gpu_blocks=400, fast_forward=ff)
    s, out = r.summary, np.array(TOY_OUTPUTS)
    iters = 573
    # seats: 8 in the prefill + the rows still generating in each decode = sum(output) = 3274
    assert s["slot_utilization"] == pytest.approx(3274 / (8 * iters), rel=1e-12)
    # padding: prompts are all 16, so only finished rows that keep decoding are idle:
    # 8 x 572 decode row-iterations - 3266 useful = 1310 idle, over 128 prefill + 3266 decode + 1310
    assert s["padding_waste"] == pytest.approx(1310 / (128 + 3266 + 1310), rel=1e-12)
    # KV: each row reserves 16 + 573 slots for the whole run (8 x 589 = 4712 slots, 295 blocks);
    # a row holds 16 tokens in the prefill and 16 + k during decode k while it generates
    held = sum(16 * o + o * (o - 1) // 2 for o in TOY_OUTPUTS)
    assert s["kv_waste"] == pytest.approx(1 - held / (4712 * iters), rel=1e-12)
    assert s["kv_utilization"] == pytest.approx(295 / 400, rel=1e-12)
    # MFU counts useful tokens only (prompts + sampled decodes), never padding
    m, hw = MODEL_PRESETS["llama-3-8b"], HARDWARE_PRESETS["h100-sxm"]
    useful = 8 * 16 + int((out - 1).sum())
    assert s["mfu"] == pytest.approx(useful * m.flops_per_token / (iters * hw.bf16_flops), rel=1e-12)
    assert s["ttft_ms"]["p99"] == 1000.0
    assert s["e2el_ms"]["p50"] == pytest.approx(1e3 * np.percentile(out, 50))


@pytest.mark.parametrize("ff", [True, False])
def test_paged_kv_waste_by_hand(ff):
    r = run([0.0], 5, 4, scheduler="continuous", max_num_seqs=1, max_num_batched_tokens=8,
            block_size=4, num_gpu_blocks=4, fast_forward=ff)
    # [0,1] prefill 5 tokens: 2 blocks = 8 slots; decodes write positions 6, 7, 8 (still 2 blocks)
    # tokens held 5, 6, 7, 8 against 8 slots each -> waste 1 - 26/32
    assert r.summary["kv_waste"] == pytest.approx(1 - 26 / 32, rel=1e-12)
    # 2 of 4 blocks for the whole 4 s
    assert r.summary["kv_utilization"] == pytest.approx(0.5, rel=1e-12)
    assert r.summary["padding_waste"] == 0.0
    assert r.summary["slot_utilization"] == 1.0


# ------------------------------------------------------------------ inter-token latency

def assert_itl(summary, gaps):
    gaps = np.asarray(gaps, dtype=np.float64) * 1e3
    assert summary["itl_ms"]["mean"] == pytest.approx(gaps.mean(), rel=1e-12)
    for q in QS:
        assert summary["itl_ms"][f"p{q}"] == pytest.approx(np.percentile(gaps, q), rel=1e-12)


@pytest.mark.parametrize("ff", [True, False])
def test_itl_without_preemption(ff):
    r = run([0.0, 0.0], [4, 12], [3, 5], scheduler="chunked", max_num_seqs=2,
            max_num_batched_tokens=8, fast_forward=ff)
    # [0,1] A 4 + B chunk 4 -> A tok 1 @ 1;  [1,2] A decode + B chunk 7 (budget 8 - 1)
    # [2,3] A decode -> done @ 3, B last 1 -> B tok 1 @ 3;  B decodes -> tok 5 @ 7
    assert r.requests["finish_s"].tolist() == [3.0, 7.0]
    assert_itl(r.summary, [1, 1] + [1, 1, 1, 1])


@pytest.mark.parametrize("ff", [True, False])
def test_itl_spans_a_recompute_preemption(ff):
    # the continuous preemption timeline of test_sim_schedulers: A tokens @ 1..7;
    # B tokens @ 1..5, preempted @ 5, tok 6 @ 8 after its recompute, tok 7 @ 9
    r = run([0.0, 0.0], 4, 7, scheduler="continuous", max_num_seqs=2, max_num_batched_tokens=16,
            block_size=4, num_gpu_blocks=4, fast_forward=ff)
    assert r.requests["finish_s"].tolist() == [7.0, 9.0]
    assert_itl(r.summary, [1] * 6 + [1, 1, 1, 1, 3, 1])


@pytest.mark.parametrize("ff", [True, False])
def test_itl_spans_two_preemptions_of_one_recompute(ff):
    # test_chunked_preempted_twice_during_recompute: A tokens @ 1..6; B tokens @ 1, 2, 3, then
    # preempted @ 3, re-admitted @ 4, preempted again @ 5 before sampling, tok 4 @ 8:
    # B's last gap is 8 - 3 = 5 s, from its last token, not from the second preemption
    r = run([0.0, 0.0], 1, [6, 4], scheduler="chunked", max_num_seqs=2, max_num_batched_tokens=2,
            block_size=1, num_gpu_blocks=6, fast_forward=ff)
    assert r.requests["finish_s"].tolist() == [6.0, 8.0]
    assert_itl(r.summary, [1] * 5 + [1, 1, 5])


@pytest.mark.parametrize("ff", [True, False])
def test_itl_recompute_ending_in_a_one_token_chunk(ff):
    # test_chunked_recompute_ending_in_one_token_is_a_prefill: A tokens @ 1, 2, 3; B tokens @ 1, 2,
    # preempted @ 2, recomputes 2 + 1 tokens, tok 3 @ 5: gaps A 1, 1; B 1, 3 (each counted once)
    r = run([0.0, 0.0], 1, 3, scheduler="chunked", max_num_seqs=2, max_num_batched_tokens=2,
            block_size=1, num_gpu_blocks=4, fast_forward=ff, enable_prefix_caching=False)
    assert r.requests["finish_s"].tolist() == [3.0, 5.0]
    assert_itl(r.summary, [1, 1, 1, 3])


@pytest.mark.parametrize("ff", [True, False])
def test_itl_resumed_token_inside_a_decode_run(ff):
    # chunked, budget 2, 1-token blocks, 4 of them; six 1-token requests go two by two first.
    # Requests 6 (output 3) and 7 (output 4) prefill [3,4] -> tok 1 @ 4; both decode [4,5] -> @ 5;
    # t=5: 6 needs a block -> 7 preempted (2 tokens); [5,6] 6 done @ 6;
    # [6,7] 7 recomputes 2 of 3, [7,8] the last 1 -> tok 3 @ 8; [8,9] decode -> tok 4 @ 9.
    # gaps: request 6: 1, 1; request 7: 1, 3, 1
    r = run([0.0] * 8, 1, [1] * 6 + [3, 4], scheduler="chunked", max_num_seqs=2,
            max_num_batched_tokens=2, block_size=1, num_gpu_blocks=4, fast_forward=ff, enable_prefix_caching=False)
    assert r.requests["finish_s"].tolist() == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 6.0, 9.0]
    assert_itl(r.summary, [1, 1, 1, 3, 1])


def test_inter_token_gaps_equal_the_direct_computation_on_random_runs(monkeypatch):
    """metrics.inter_token_latencies compacts the recorder's durations in place, chunk by chunk,
    and rebuilds `ends` only when asked: against the direct computation (index the decoding
    iterations out of a copy, cumulative sums for the ends), bit for bit, with prefill-only rows,
    runs of several iterations, chunks smaller than a run, and gaps across preemptions."""
    import pandas as pd

    import sim.runtime.metrics as metrics
    from sim.runtime.metrics import inter_token_latencies

    monkeypatch.setattr(metrics, "_CHUNK_VALUES", 7)
    rng = np.random.default_rng(5)
    for _trial in range(60):
        rows = int(rng.integers(1, 40))
        count = rng.integers(1, 6, rows)
        decode = rng.integers(0, 4, rows) * (rng.random(rows) < 0.8)
        start = np.cumsum(rng.random(rows) * 3)
        durations = rng.random(int(count.sum())) * 0.05
        resumed = rng.random((int(rng.integers(0, 3)), 2))

        class Recorder:
            def take_durations(self, room=0):
                return np.concatenate((durations, np.zeros(room)))  # noqa: B023 (this trial's)

        class Req:
            resume_gaps = [tuple(g) for g in resumed]

        steps = pd.DataFrame({"count": count, "decode_tokens": decode, "start_s": start})
        got = inter_token_latencies(steps, Recorder(), Req())
        decoding = np.repeat(decode > 0, count)
        ends = np.cumsum(durations)
        first = np.cumsum(count) - count
        ends += np.repeat(start - (ends[first] - durations[first]), count)
        want = (np.concatenate((durations[decoding], resumed[:, 0])),
                np.concatenate((np.repeat(decode[decode > 0], count[decode > 0]), np.ones(len(resumed)))),
                np.concatenate((ends[decoding], resumed[:, 1])))
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
        gaps, counts, ends_got = got  # (unpacks, and indexes, as the tuple the planner reads)
        assert [got[i] is x for i, x in ((-3, gaps), (-2, counts), (0, gaps), (1, counts))] == [True] * 4
        np.testing.assert_array_equal(got[-1], ends_got)
