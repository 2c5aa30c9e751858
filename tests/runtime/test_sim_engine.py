"""The engine replica loop, routing, fast-forward and determinism.

Timing contract: an idle replica starts an iteration the moment a request arrives; a busy one
admits arrivals at its next iteration boundary; same-instant arrivals are all visible; a request
arriving exactly when an iteration ends is visible to the next schedule. Unit cost: 1 s/iteration.
"""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import sim.runtime.engine as engine_module
from sim.runtime.engine import Replica
from sim.simulate import simulate, write_outputs
from simhelpers import assert_same_run, make_scenario, run

EXAMPLE_PROFILE = Path(__file__).parents[2] / "scenarios/profiles/example-h100-llama-3-8b.yaml"
CHAT = {"arrival": {"process": "poisson", "rate": 5.0}, "num_requests": 300,
        "prompt_tokens": {"dist": "lognormal", "mean": 400, "std": 300, "max": 2048},
        "output_tokens": {"dist": "lognormal", "mean": 150, "std": 100, "max": 1024}}
SCHEDULERS = ["static", "continuous", "chunked"]


# ------------------------------------------------------------------ timing

@pytest.mark.parametrize("ff", [True, False])
@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_idle_replica_starts_at_the_arrival(scheduler, ff):
    r = run([2.5, 10.0], 4, 3, scheduler=scheduler, max_num_seqs=4, max_num_batched_tokens=16,
            fast_forward=ff)
    # A: [2.5,3.5] prefill -> tok 1 @ 3.5, decodes to tok 3 @ 5.5; idle until B at 10 -> 11, 13
    assert r.requests["first_token_s"].tolist() == [3.5, 11.0]
    assert r.requests["finish_s"].tolist() == [5.5, 13.0]
    assert r.requests["queue_s"].tolist() == [0.0, 0.0]
    assert r.steps["start_s"].iloc[0] == 2.5
    assert 10.0 in r.steps["start_s"].tolist()


@pytest.mark.parametrize("ff", [True, False])
@pytest.mark.parametrize("scheduler", ["continuous", "chunked"])
def test_busy_replica_admits_at_the_next_boundary(scheduler, ff):
    r = run([0.0, 0.5, 2.0], 4, [5, 2, 2], scheduler=scheduler, max_num_seqs=4,
            max_num_batched_tokens=16, fast_forward=ff)
    # A: [0,1] prefill; B arrives at 0.5 while A computes -> joins [1,2] -> B tok 1 @ 2, done @ 3
    # C arrives at 2.0 exactly when [1,2] ends -> joins [2,3] -> tok 1 @ 3, done @ 4
    assert r.requests["first_token_s"].tolist() == [1.0, 2.0, 3.0]
    assert r.requests["finish_s"].tolist() == [5.0, 3.0, 4.0]
    assert r.requests["queue_s"].tolist() == [0.0, 0.5, 0.0]


@pytest.mark.parametrize("ff", [True, False])
@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_same_instant_arrivals_share_the_first_iteration(scheduler, ff):
    r = run([1.0, 1.0, 1.0], 4, 2, scheduler=scheduler, max_num_seqs=4, max_num_batched_tokens=16,
            fast_forward=ff)
    # all three arrive at 1.0: [1,2] prefills 3 x 4 tokens, [2,3] decodes -> done @ 3
    assert r.steps["num_seqs"].iloc[0] == 3
    assert r.steps["prefill_tokens"].iloc[0] == 12
    assert r.requests["finish_s"].tolist() == [3.0, 3.0, 3.0]


@pytest.mark.parametrize("ff", [True, False])
def test_static_arrival_at_batch_end_joins_the_next_batch(ff):
    r = run([0.0, 3.0, 3.0], 4, 3, scheduler="static", max_num_seqs=4, fast_forward=ff)
    # batch [0] on [0,3]; B, C arrive at 3.0 exactly as it ends -> batch [1,2] on [3,6]
    assert r.requests["first_token_s"].tolist() == [1.0, 4.0, 4.0]
    assert r.requests["finish_s"].tolist() == [3.0, 6.0, 6.0]


def test_decode_run_is_cut_by_an_arrival_that_can_join():
    r = run([0.0, 3.5], 4, [10, 2], scheduler="continuous", max_num_seqs=4, fast_forward=True)
    # A decodes [1,2]..; B arrives at 3.5, joins at 4 -> tok 1 @ 5, done @ 6
    assert r.requests["first_token_s"].tolist() == [1.0, 5.0]
    assert r.requests["finish_s"].tolist() == [10.0, 6.0]
    # fast-forward rows: [0,1] prefill; [1,4] decode run cut at the boundary after 3.5; [4,5] A
    # decode + B prefill; [5,6] both decode (B finishes); [6,10] A alone
    assert [tuple(x) for x in r.steps[["start_s", "count"]].itertuples(index=False)] == [
        (0.0, 1), (1.0, 3), (4.0, 1), (5.0, 1), (6.0, 4)]


# ------------------------------------------------------------------ replicas and routing

def test_round_robin_routes_request_i_to_replica_i_mod_r():
    r = run([0.0] * 7, 4, 3, scheduler="continuous", max_num_seqs=4, replicas=3,
            router="round_robin")
    assert r.requests["replica"].tolist() == [0, 1, 2, 0, 1, 2, 0]
    # each replica runs its own requests from t=0: everyone done @ 3
    assert r.requests["finish_s"].tolist() == [3.0] * 7
    assert sorted(r.steps["replica"].unique().tolist()) == [0, 1, 2]


@pytest.mark.parametrize("ff", [True, False])
def test_least_loaded_routes_to_the_fewest_unfinished(ff):
    r = run([0.0, 0.0, 0.0, 0.0, 2.5, 2.5], 1, [2, 10, 10, 10, 10, 10], scheduler="continuous",
            max_num_seqs=8, replicas=2, router="least_loaded", fast_forward=ff)
    # t=0: loads (0,0) -> 0; (1,0) -> 1; (1,1) tie -> 0; (2,1) -> 1
    # request 0 (output 2) finishes on replica 0 @ 2, so at 2.5 loads are (1,2) -> 0; then (2,2) -> 0
    # (round robin would give 0,1,0,1,0,1)
    assert r.requests["replica"].tolist() == [0, 1, 0, 1, 0, 0]
    # 4 and 5 arrive at 2.5 while replica 0 computes [2,3] -> join [3,4] -> tok 1 @ 4, done @ 13
    assert r.requests["first_token_s"].tolist() == [1.0, 1.0, 1.0, 1.0, 4.0, 4.0]
    assert r.requests["finish_s"].tolist() == [2.0, 10.0, 10.0, 10.0, 13.0, 13.0]


@pytest.mark.parametrize("ff", [True, False])
def test_least_loaded_arrival_at_iteration_end_is_visible_to_the_next_schedule(ff):
    r = run([0.0, 0.0, 0.0, 0.0, 1.5, 2.0], 1, 10, scheduler="continuous", max_num_seqs=8,
            replicas=2, router="least_loaded", fast_forward=ff)
    # t=0: replicas 0,1,0,1 (loads tie, then alternate); 1.5: loads (2,2) -> 0; 2.0: (3,2) -> 1
    # replica 1 is mid-run ([1,2] ends at 2.0); request 5 arriving at 2.0 is visible to the schedule
    # at 2.0 -> joins [2,3] -> tok 1 @ 3 (exactly as with round_robin, where it also lands on 1)
    assert r.requests["replica"].tolist() == [0, 1, 0, 1, 0, 1]
    assert r.requests["first_token_s"].tolist() == [1.0, 1.0, 1.0, 1.0, 3.0, 3.0]
    assert r.requests["finish_s"].tolist() == [10.0, 10.0, 10.0, 10.0, 12.0, 12.0]


@pytest.mark.parametrize("ff", [True, False])
def test_least_loaded_counts_completions_at_the_arrival_instant(ff):
    r = run([0.0, 0.0, 0.0, 0.0, 1.5, 3.0], 1, [3, 1, 1, 1, 1, 1], scheduler="static",
            max_num_seqs=1, replicas=2, router="least_loaded", fast_forward=ff)
    # t=0: 0 -> replica 0, 1 -> 1, 2 -> 0 (tie), 3 -> 1. Replica 0 runs 0 on [0,3], then 2;
    # replica 1 runs 1 on [0,1], 3 on [1,2]. t=1.5: loads (2, 1) -> 4 to replica 1, on [2,3].
    # t=3: request 0 and request 4 both finish as 5 arrives: loads (1: request 2, 0) -> replica 1,
    # idle, so 5 runs on [3,4]. Whether a replica's iteration ending at 3.0 was a 1-iteration step
    # or the end of a fast-forwarded run must not matter.
    assert r.requests["replica"].tolist() == [0, 1, 0, 1, 1, 1]
    assert r.requests["first_token_s"].tolist() == [1.0, 1.0, 4.0, 2.0, 3.0, 4.0]
    assert r.requests["finish_s"].tolist() == [3.0, 1.0, 4.0, 2.0, 3.0, 4.0]


def test_least_loaded_static_batch_timeout():
    r = run([0.0, 0.5, 1.0], 4, 2, scheduler="static", max_num_seqs=4, batch_timeout_s=2.0,
            replicas=2, router="least_loaded")
    # 0 -> replica 0, 0.5 -> replica 1 (loads 1,0), 1.0 -> replica 0 (tie 1,1)
    # replica 0 waits until 0 + 2 = 2: batch [0,2] on [2,4]; replica 1 until 2.5: [2.5,4.5]
    assert r.requests["replica"].tolist() == [0, 1, 0]
    assert r.requests["first_token_s"].tolist() == [3.0, 3.5, 3.0]
    assert r.requests["finish_s"].tolist() == [4.0, 4.5, 4.0]


# ------------------------------------------------------------------ fast-forward

FF_CASES = {
    "static": dict(scheduler="static", max_num_seqs=32),
    "continuous": dict(scheduler="continuous", max_num_seqs=64, max_num_batched_tokens=4096),
    "chunked": dict(scheduler="chunked", max_num_seqs=64, max_num_batched_tokens=512),
    "static-small-kv": dict(scheduler="static", max_num_seqs=32, num_gpu_blocks=400),
    "continuous-preempting": dict(scheduler="continuous", max_num_seqs=64,
                                  max_num_batched_tokens=4096, num_gpu_blocks=300),
    "chunked-preempting": dict(scheduler="chunked", max_num_seqs=64, max_num_batched_tokens=512,
                               num_gpu_blocks=300),
    "chunked-2x-least-loaded": dict(scheduler="chunked", max_num_seqs=64,
                                    max_num_batched_tokens=512, replicas=2, router="least_loaded",
                                    num_gpu_blocks=250),
    "continuous-2x-least-loaded-sjf": dict(scheduler="continuous", max_num_seqs=16,
                                           max_num_batched_tokens=4096, replicas=2,
                                           router="least_loaded", policy="sjf"),
}


@pytest.mark.parametrize("name", list(FF_CASES))
def test_fast_forward_equals_stepping(name):
    workload = CHAT
    if "least-loaded" in name:  # twice the rate for two replicas
        workload = {**CHAT, "arrival": {"process": "poisson", "rate": 10.0}}
    scenario = make_scenario(cost_model="roofline", workload=workload, seed=3, **FF_CASES[name])
    fast, stepped = simulate(scenario, fast_forward=True), simulate(scenario, fast_forward=False)
    assert fast.summary["completed"] == 300
    if "preempting" in name:
        assert fast.summary["preemptions"] > 0  # the case exercises recompute preemption
    assert len(fast.steps) < len(stepped.steps)  # fast-forward did merge iterations
    assert_same_run(fast, stepped)


# A replica alone in its environment keeps the clock itself (Replica.run_alone): its records must
# be the SimPy loop's to the bit, whatever the scheduler, cache or cost model.
ALONE_CASES = {
    "static": dict(scheduler="static", max_num_seqs=32, num_gpu_blocks=400),
    "continuous-preempting": dict(scheduler="continuous", max_num_seqs=64, max_num_batched_tokens=4096,
                                  num_gpu_blocks=300),
    "chunked-preempting-sjf": dict(scheduler="chunked", max_num_seqs=64, max_num_batched_tokens=512,
                                   num_gpu_blocks=300, policy="sjf"),
    "chunked-speculative": dict(scheduler="chunked", max_num_seqs=32, max_num_batched_tokens=512,
                                speculative={"method": "ngram", "num_speculative_tokens": 3,
                                             "acceptance_rate": 0.6}),
    "chunked-sliding-window": dict(scheduler="chunked", max_num_seqs=32, max_num_batched_tokens=512,
                                   num_gpu_blocks=200, model="mistral-7b"),
}


class _SimPyReplica(Replica):
    """The SimPy loop (`Replica.run`) even where the replica is alone."""

    def __init__(self, *args, alone=False, **kwargs):
        super().__init__(*args, alone=False, **kwargs)


@pytest.mark.parametrize("ff", [True, False])
@pytest.mark.parametrize("name", list(ALONE_CASES))
def test_a_replica_alone_keeps_the_clock_exactly_as_simpy(name, ff, monkeypatch):
    engine = dict(ALONE_CASES[name])
    model = engine.pop("model", "llama-3-8b")
    # bursty arrivals with idle gaps between bursts (the replica waits, then wakes at an arrival)
    workload = {**CHAT, "arrival": {"process": "gamma", "rate": 2.0, "cv": 3.0},
                "prefix": {"tokens": 256, "groups": 3, "share": 0.5}}
    if "speculative" in engine or model != "llama-3-8b":
        workload.pop("prefix")  # (not modelled together)
    scenario = make_scenario(cost_model="roofline", workload=workload, seed=5, model=model, **engine)
    alone = simulate(scenario, fast_forward=ff)
    monkeypatch.setattr(engine_module, "Replica", _SimPyReplica)
    stepped = simulate(scenario, fast_forward=ff)
    assert alone.summary["completed"] == 300
    if "preempting" in name:
        assert alone.summary["preemptions"] > 0
    pd.testing.assert_frame_equal(alone.steps, stepped.steps, check_exact=True)
    pd.testing.assert_frame_equal(alone.requests, stepped.requests, check_exact=True)
    assert json.dumps(alone.summary) == json.dumps(stepped.summary)


@pytest.mark.parametrize("cost_model", ["roofline", "profile"])
@pytest.mark.parametrize("engine", [dict(scheduler="chunked", max_num_seqs=64, max_num_batched_tokens=512,
                                         num_gpu_blocks=300),
                                    dict(scheduler="continuous", max_num_seqs=64, max_num_batched_tokens=4096,
                                         replicas=2, router="least_loaded")])
def test_walking_decode_runs_in_python_changes_no_float(cost_model, engine, monkeypatch):
    """A cost model's decode_line lets the engine walk a run's iterations in Python up to the next
    arrival (sim/runtime/fast_forward.Runner); without it the same run is priced by numpy and cut there.
    Arrivals at 2/s (long runs, past the 32-iteration probe) and 10/s (runs cut early)."""
    from sim.cost.registry import ProfileCost, RooflineCost
    spec = {"profile": str(EXAMPLE_PROFILE)} if cost_model == "profile" else cost_model
    for rate in (2.0, 10.0):
        workload = {**CHAT, "arrival": {"process": "poisson", "rate": rate}}
        scenario = make_scenario(cost_model=spec, workload=workload, seed=11, **engine)
        walked = simulate(scenario)
        with monkeypatch.context() as m:
            for cls in (ProfileCost, RooflineCost):
                m.setattr(cls, "decode_line", lambda self, stats: None)
            priced = simulate(scenario)
        assert walked.summary["completed"] == 300
        pd.testing.assert_frame_equal(walked.steps, priced.steps, check_exact=True)
        pd.testing.assert_frame_equal(walked.requests, priced.requests, check_exact=True)
        assert json.dumps(walked.summary) == json.dumps(priced.summary)
        assert walked.steps["count"].max() > 32  # some runs outlasted the probe


def test_total_is_numpys_sum_to_the_bit():
    """fast_forward.total adds a run's durations as numpy's pairwise sum does (np.add.reduce):
    lengths across its three regimes (< 8, up to 128, halves), values over six decades."""
    from sim.runtime.fast_forward import listed, total
    rng = np.random.default_rng(3)
    lengths = [*range(1, 140), 255, 256, 257, 1000, 1031, 4096, 5000]
    for n in lengths:
        for _ in range(3):
            a = rng.random(n) * 10.0 ** rng.integers(-4, 2, n)
            assert total(a.tolist()) == float(np.add.reduce(a)), n
            assert listed(a) == (a.tolist(), float(np.add.reduce(a)))
    # a left fold differs from numpy's sum on some of these, so the check can fail
    a = [0.1] * 9 + [1e-17] * 8
    assert total(a) == float(np.add.reduce(np.array(a)))
    assert sum(a) != total(a)


def test_recorder_integrates_a_decode_run_by_hand():
    """Two decodes, a run of 3 iterations of 1, 2 and 4 s, 16 slots held, 16 more from the
    second iteration on, 10 tokens held at first (each decode adds one per iteration)."""
    from sim.cost.batch import BatchStats
    from sim.runtime.recorder import Recorder
    from sim.schedulers.step import NO_IDS, Schedule, StepOutcome
    stats = BatchStats(num_decodes=2, decode_context_sum=12)
    schedule = Schedule(NO_IDS, NO_IDS, stats, num_seqs=2, prefill_tokens=0, decode_tokens=2,
                        telemetry=(16, 8, 10, 0, 0),  # kv_slots, capacity, kv_tokens, waiting, cached
                        max_steps=3)
    rec = Recorder(block_size=16)
    rec.record(0, 0.0, [1.0, 2.0, 4.0], 7.0, schedule, StepOutcome((), (2, [16, 16], None)))
    assert rec.kv_slot_seconds == 16 * 7 + 16 * (2 + 4)
    assert rec.kv_token_seconds == 10 * 7 + 2 * (1 * 2 + 2 * 4)
    assert rec.kv_block_seconds == 1 * 7 + 16 * (2 + 4) / 16
    assert rec.decode_context_tokens == 3 * 12 + 2 * 3
    rec.record(0, 7.0, [1.0, 1.0], 2.0, schedule, StepOutcome((), (2, np.array([32.0]), None)))
    assert rec.kv_slot_seconds == 16 * 7 + 16 * 6 + 16 * 2 + 32 * 1
    assert rec.take_durations().tolist() == [1.0, 2.0, 4.0, 1.0, 1.0]


# ------------------------------------------------------------------ determinism

def _write(scenario, tmp_path, name):
    out = tmp_path / name
    write_outputs(simulate(scenario), out)
    return {f: (out / f).read_bytes() for f in ("requests.csv", "steps.csv", "summary.json")}


def test_the_csv_writer_keeps_every_value_and_dtype():
    """requests.csv and steps.csv are written by pyarrow (sim/simulate.write_csv): reading them
    back gives exactly the frames pandas would have written, float64 bit for bit (NaN, -0.0, 1e-05,
    0.1 + 0.2, 1e20 included) and int64; the header is plain."""
    import io

    import pandas as pd

    from sim.simulate import write_csv

    r = simulate(make_scenario(cost_model="roofline", workload={**CHAT, "num_requests": 60},
                               scheduler="chunked", max_num_seqs=8))
    odd = pd.DataFrame({"x": [0.0, np.nan, 1e-05, -0.0, 0.1 + 0.2, 1e20, np.inf, 2.5],
                        "n": np.arange(8, dtype=np.int64) - 3})
    for frame in (r.requests, r.steps, odd):
        f = io.BytesIO()
        write_csv(frame, f)
        text = f.getvalue().decode()
        assert text.splitlines()[0] == ",".join(frame.columns)
        ours = pd.read_csv(io.StringIO(text), dtype=frame.dtypes.to_dict())
        theirs = pd.read_csv(io.StringIO(frame.to_csv(index=False)), dtype=frame.dtypes.to_dict())
        pd.testing.assert_frame_equal(ours, theirs, check_exact=True)
        # r.requests is a metrics.Frame (a DataFrame answering last release's names); what a CSV
        # reads back is a plain DataFrame, so compare the values as one
        pd.testing.assert_frame_equal(ours, pd.DataFrame(frame).reset_index(drop=True), check_exact=True)
        assert np.array_equal(np.signbit(ours.select_dtypes("float").to_numpy()),
                              np.signbit(frame.select_dtypes("float").to_numpy()))
    # written a few rows at a time (a big run's frames go into Arrow in slices): one header, every row
    f = io.BytesIO()
    write_csv(odd, f, rows=3)
    back = pd.read_csv(io.BytesIO(f.getvalue()), dtype=odd.dtypes.to_dict())
    pd.testing.assert_frame_equal(back, odd, check_exact=True)
    assert f.getvalue().decode().count("x,n") == 1


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_same_seed_gives_byte_identical_outputs(scheduler, tmp_path):
    small = {**CHAT, "num_requests": 80}

    def scenario(seed):
        return make_scenario(cost_model="roofline", workload=small, seed=seed, scheduler=scheduler,
                             max_num_seqs=16, max_num_batched_tokens=4096)

    first, again = _write(scenario(7), tmp_path, "a"), _write(scenario(7), tmp_path, "b")
    assert first == again
    other = _write(scenario(8), tmp_path, "c")
    for name in first:
        assert other[name] != first[name], name
    summary = json.loads(first["summary.json"])
    assert summary["completed"] == 80
