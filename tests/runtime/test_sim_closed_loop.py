"""Closed-loop workloads (`arrival: {process: closed_loop, users, think_time}`): each user sends a
request, waits for it to finish, thinks, sends the next. Unit cost: every iteration lasts 1 s."""
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from sim.config.errors import ScenarioError
from sim.scenario import load_scenario
from sim.simulate import simulate, write_outputs
from sim.workload.generators import ClosedLoop, Users, Workload, build_workload, parse_workload
from simhelpers import assert_same_run, make_scenario

REPO = Path(__file__).parents[2]
ENGINE = dict(scheduler="chunked", max_num_seqs=4, max_num_batched_tokens=16)


def closed(users, think_time, n, prompt=4, output=3, **arrival):
    return {"arrival": {"process": "closed_loop", "users": users, "think_time": think_time, **arrival},
            "prompt_tokens": {"dist": "fixed", "value": prompt},
            "output_tokens": {"dist": "fixed", "value": output}, "num_requests": n}


def explicit(start, think, prompt, output) -> Workload:
    """A closed-loop workload with given start offsets, think times (after request i) and lengths."""
    n = len(think)
    lengths = [np.broadcast_to(np.asarray(x, dtype=np.int64), (n,)).copy() for x in (prompt, output)]
    return Workload(arrival_s=np.full(n, np.nan), prompt_tokens=lengths[0], output_tokens=lengths[1],
                    priority=np.zeros(n, dtype=np.int64),
                    users=Users(np.asarray(start, dtype=np.float64), np.asarray(think, dtype=np.float64)))


def columns(r, *names):
    return [r.requests[c].tolist() for c in names]


def check_one_in_flight(rq, think_s=None):
    """Per user, in arrival order: each request arrives after the previous one finished (plus the
    think time drawn after it, when given), so a user never has two requests in flight."""
    for _, mine in rq.sort_values(["user", "arrival_s"]).groupby("user"):
        arrival, finish = mine["arrival_s"].to_numpy(), mine["finish_s"].to_numpy()
        assert (arrival[1:] >= finish[:-1]).all()
        if think_s is not None:
            gap = think_s[mine["request_id"].to_numpy()[:-1]]
            assert (arrival[1:] == finish[:-1] + gap).all()


# ------------------------------------------------------------------ exact timelines

@pytest.mark.parametrize("ff", [True, False])
def test_two_users_fixed_think_exact_timeline(ff):
    w = explicit(start=[0.0, 0.5], think=[2.0] * 6, prompt=4, output=3)
    r = simulate(make_scenario(**ENGINE), workload=w, fast_forward=ff)
    # user 0 at 0: [0,1] prefill -> tok 1 @ 1. User 1 at 0.5 joins at 1: [1,2] A decode + B
    # prefill, [2,3] A finishes, [3,4] B finishes. Their next requests: 3 + 2 = 5 and 4 + 2 = 6;
    # the one at 6 arrives exactly as [5,6] ends and joins [6,7]. Same again from 8 + 2 and 9 + 2.
    assert columns(r, "arrival_s", "first_token_s", "finish_s", "user") == [
        [0.0, 0.5, 5.0, 6.0, 10.0, 11.0], [1.0, 2.0, 6.0, 7.0, 11.0, 12.0],
        [3.0, 4.0, 8.0, 9.0, 13.0, 14.0], [0, 1, 0, 1, 0, 1]]
    assert r.summary["completed"] == 6
    check_one_in_flight(r.requests, w.users.think_s)


@pytest.mark.parametrize("ff", [True, False])
def test_zero_think_time_from_yaml_starts_everyone_at_zero(ff):
    r = simulate(make_scenario(workload=closed(2, 0.0, 6), **ENGINE), fast_forward=ff)
    # both at 0, finish at 3; their next requests arrive at 3 and join the iteration starting at 3
    assert columns(r, "arrival_s", "first_token_s", "finish_s", "user") == [
        [0.0, 0.0, 3.0, 3.0, 6.0, 6.0], [1.0, 1.0, 4.0, 4.0, 7.0, 7.0],
        [3.0, 3.0, 6.0, 6.0, 9.0, 9.0], [0, 1, 0, 1, 0, 1]]
    if ff:
        assert [tuple(x) for x in r.steps[["start_s", "count"]].itertuples(index=False)] == [
            (0.0, 1), (1.0, 2), (3.0, 1), (4.0, 2), (6.0, 1), (7.0, 2)]


def test_num_requests_below_users_and_requests_after_the_last_are_not_sent():
    r = simulate(make_scenario(workload=closed(5, 0.0, 3), **ENGINE))
    assert r.summary["completed"] == 3
    assert columns(r, "arrival_s", "user") == [[0.0, 0.0, 0.0], [0, 1, 2]]


@pytest.mark.parametrize("ff", [True, False])
def test_arrival_from_another_replica_cuts_a_decode_run(ff):
    # round robin, 2 replicas, think 0: request 0 (user 0, output 10) decodes on replica 0 from 1;
    # request 1 (user 1, output 2) finishes on replica 1 at 2, so user 1's next request (2) arrives
    # at 2 and goes to replica 0 mid-run: it joins at 2 (fast-forward cuts the run there), not at
    # 10. Request 3 arrives at 4 on replica 1.
    w = explicit(start=[0.0, 0.0], think=[0.0] * 4, prompt=4, output=[10, 2, 2, 1])
    r = simulate(make_scenario(replicas=2, router="round_robin", **ENGINE), workload=w,
                 fast_forward=ff)
    assert columns(r, "arrival_s", "replica", "first_token_s", "finish_s", "user") == [
        [0.0, 0.0, 2.0, 4.0], [0, 1, 0, 1], [1.0, 1.0, 3.0, 5.0], [10.0, 2.0, 4.0, 5.0],
        [0, 1, 1, 1]]
    if ff:
        rows = r.steps[r.steps["replica"] == 0][["start_s", "count"]].itertuples(index=False)
        assert [tuple(x) for x in rows] == [(0.0, 1), (1.0, 1), (2.0, 1), (3.0, 1), (4.0, 6)]


@pytest.mark.parametrize("ff", [True, False])
def test_least_loaded_routes_each_arrival_live(ff):
    # 3 users at 0 -> replicas 0, 1, 0 (loads 0,0 / 1,0 / 1,1). User 2's request (output 1) ends
    # at 1 on replica 0; its next one arrives at 1 + 0.5 when the loads are (1, 1): replica 0,
    # mid-iteration, so it joins at 2 and its prefill ends at 3.
    w = explicit(start=[0.0, 0.0, 0.0], think=[0.5] * 4, prompt=4, output=[6, 6, 1, 1])
    r = simulate(make_scenario(replicas=2, router="least_loaded", **ENGINE), workload=w,
                 fast_forward=ff)
    assert columns(r, "arrival_s", "replica", "user", "first_token_s") == [
        [0.0, 0.0, 0.0, 1.5], [0, 1, 0, 0], [0, 1, 2, 2], [1.0, 1.0, 1.0, 3.0]]


# ------------------------------------------------------------------ fast-forward and invariants

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    phases=[Phase.explicit, Phase.reuse, Phase.generate])


@st.composite
def cases(draw):
    n = draw(st.integers(1, 24))
    users = draw(st.integers(1, 6))
    # quarter seconds: integer times collide with iteration ends (unit cost), others fall inside
    # them, and every sum is exact, so fast-forward and stepping meet the same ties
    time = st.integers(0, 12).map(lambda k: k / 4)
    start = draw(st.lists(time, min_size=min(users, n), max_size=min(users, n)))
    think = draw(st.lists(time, min_size=n, max_size=n))
    prompt = draw(st.lists(st.integers(1, 24), min_size=n, max_size=n))
    output = draw(st.lists(st.integers(1, 24), min_size=n, max_size=n))
    scheduler = draw(st.sampled_from(["static", "continuous", "chunked"]))
    seqs = draw(st.integers(1, 6))
    longest = max(p + o for p, o in zip(prompt, output))
    engine = dict(scheduler=scheduler, max_num_seqs=seqs, block_size=draw(st.sampled_from([1, 4, 16])),
                  max_num_batched_tokens=max(seqs, longest) + draw(st.integers(0, 16)),
                  policy=draw(st.sampled_from(["fcfs", "sjf"])),
                  batch_timeout_s=draw(st.sampled_from([0.0, 1.5])),
                  replicas=draw(st.integers(1, 3)),
                  router=draw(st.sampled_from(["round_robin", "least_loaded"])))
    return explicit(start, think, prompt, output), engine


@SETTINGS
@given(case=cases())
def test_fast_forward_equals_stepping_and_users_wait_for_their_responses(case):
    w, engine = case
    fast = simulate(make_scenario(**engine), workload=w, fast_forward=True)
    stepped = simulate(make_scenario(**engine), workload=w, fast_forward=False)
    assert_same_run(fast, stepped)
    rq = fast.requests
    assert fast.summary["completed"] == len(w)
    assert (np.diff(rq["arrival_s"]) >= 0).all()  # request ids in arrival order
    assert (rq["first_token_s"] >= rq["arrival_s"] + 1).all()
    # a user's first request is sent at its start offset (unless num_requests ran out before)
    assert set(rq.groupby("user")["arrival_s"].min().tolist()) <= set(w.users.start_s.tolist())
    check_one_in_flight(rq, w.users.think_s)
    assert np.isnan(w.arrival_s).all()  # the run fills in its own copy


CHAT = {"prompt_tokens": {"dist": "lognormal", "mean": 400, "std": 300, "max": 2048},
        "output_tokens": {"dist": "lognormal", "mean": 150, "std": 100, "max": 1024},
        "num_requests": 300}
FF_CASES = {
    "chunked": (32, 2.0, dict(scheduler="chunked", max_num_seqs=64, max_num_batched_tokens=512)),
    "chunked-think-0": (32, 0.0, dict(scheduler="chunked", max_num_seqs=16,
                                      max_num_batched_tokens=512)),
    "continuous-preempting": (48, 1.0, dict(scheduler="continuous", max_num_seqs=64,
                                            max_num_batched_tokens=4096, num_gpu_blocks=300)),
    "static": (16, 1.0, dict(scheduler="static", max_num_seqs=8, batch_timeout_s=0.3)),
    "chunked-2x-least-loaded": (40, 1.0, dict(scheduler="chunked", max_num_seqs=64,
                                              max_num_batched_tokens=512, replicas=2,
                                              router="least_loaded")),
    "chunked-3x-round-robin": (40, 1.0, dict(scheduler="chunked", max_num_seqs=64,
                                             max_num_batched_tokens=512, replicas=3)),
}


@pytest.mark.parametrize("name", list(FF_CASES))
def test_fast_forward_equals_stepping_roofline(name):
    users, think, engine = FF_CASES[name]
    work = {**CHAT, "arrival": {"process": "closed_loop", "users": users, "think_time": think}}
    scenario = make_scenario(cost_model="roofline", workload=work, seed=3, **engine)
    fast, stepped = simulate(scenario), simulate(scenario, fast_forward=False)
    assert fast.summary["completed"] == 300
    if "preempting" in name:
        assert fast.summary["preemptions"] > 0
    assert len(fast.steps) < len(stepped.steps)
    assert_same_run(fast, stepped)
    users_think = build_workload(scenario.workload, np.random.default_rng(3)).users.think_s
    check_one_in_flight(fast.requests, users_think)
    # never more requests in flight than users
    events = np.concatenate([np.stack([fast.requests["arrival_s"], np.ones(300)], 1),
                             np.stack([fast.requests["finish_s"], -np.ones(300)], 1)])
    events = events[np.lexsort((events[:, 1], events[:, 0]))]  # finishes first at a tie
    assert np.cumsum(events[:, 1]).max() <= users


# ------------------------------------------------------------------ determinism

def _write(scenario, out):
    write_outputs(simulate(scenario), out)
    return {f: (out / f).read_bytes() for f in ("requests.csv", "steps.csv", "summary.json")}


def test_same_seed_gives_byte_identical_outputs(tmp_path):
    work = {**CHAT, "num_requests": 80,
            "arrival": {"process": "closed_loop", "users": 8, "think_time": 1.0}}

    def scenario(seed):
        return make_scenario(cost_model="roofline", workload=work, seed=seed, scheduler="chunked",
                             max_num_seqs=16, max_num_batched_tokens=512)

    first, again = _write(scenario(7), tmp_path / "a"), _write(scenario(7), tmp_path / "b")
    assert first == again
    other = _write(scenario(8), tmp_path / "c")
    for name in first:
        assert other[name] != first[name], name
    assert json.loads(first["summary.json"])["completed"] == 80
    assert first["requests.csv"].splitlines()[0].endswith(b",replica,user")


# ------------------------------------------------------------------ the workload section

W = "scenarios/chat.yaml: workload"


def parse(arrival, **extra):
    raw = {**closed(4, 1.0, 10), "arrival": arrival, **extra}
    return parse_workload(raw, "scenarios/chat.yaml", REPO / "scenarios")


def test_parse_and_build():
    cfg = parse({"process": "closed_loop", "users": 3, "think_time": 2.0, "think_dist": "fixed"},
                time_scale=2.0)
    assert cfg.arrival == ClosedLoop(users=3, think_time=2.0, think_dist="fixed")
    w = build_workload(cfg, np.random.default_rng(0))
    assert np.isnan(w.arrival_s).all() and len(w) == 10
    assert (w.users.think_s == 1.0).all()  # time_scale 2 halves the think times
    assert ((w.users.start_s >= 0) & (w.users.start_s < 1.0)).all() and len(w.users.start_s) == 3
    again = build_workload(cfg, np.random.default_rng(0))
    assert (again.users.start_s == w.users.start_s).all()
    exp = build_workload(parse({"process": "closed_loop", "users": 3, "think_time": 2.0}),
                         np.random.default_rng(0))
    assert len(set(exp.users.think_s.tolist())) == 10  # exponential by default


@pytest.mark.parametrize("arrival, message", [
    ({"process": "closed_loop", "think_time": 1}, f"{W}.arrival.users: missing (expected an integer >= 1)"),
    ({"process": "closed_loop", "users": 0, "think_time": 1}, f"{W}.arrival.users: 0 is not an integer >= 1"),
    ({"process": "closed_loop", "users": 2.5, "think_time": 1}, f"{W}.arrival.users: 2.5 is not an integer >= 1"),
    ({"process": "closed_loop", "users": 4}, f"{W}.arrival.think_time: missing (expected a number >= 0)"),
    ({"process": "closed_loop", "users": 4, "think_time": -1}, f"{W}.arrival.think_time: -1 is not a number >= 0"),
    ({"process": "closed_loop", "users": 4, "think_time": 1, "think_dist": "gauss"},
     f"{W}.arrival.think_dist: 'gauss' is not one of exponential, fixed"),
    ({"process": "closed_loop", "users": 4, "think_time": 1, "rate": 2},
     f"{W}.arrival.rate: unknown key; allowed: process, users, think_time, think_dist, turns, max_context"),
])
def test_parse_errors(arrival, message):
    with pytest.raises(ScenarioError) as e:
        parse(arrival)
    assert str(e.value) == message


def test_closed_loop_with_a_trace_is_rejected():
    with pytest.raises(ScenarioError, match=f"^{W}.arrival: not allowed with workload.trace"):
        parse_workload({"trace": "traces/toy8.csv",
                        "arrival": {"process": "closed_loop", "users": 2, "think_time": 1}},
                       "scenarios/chat.yaml", REPO / "scenarios")


# ------------------------------------------------------------------ the bundled scenario

def test_bundled_scenario_runs():
    sc = load_scenario(REPO / "scenarios" / "closed-loop-llama3-8b-h100.yaml")
    assert sc.workload.arrival == ClosedLoop(users=64, think_time=3.0)
    r = simulate(sc)
    s, rq = r.summary, r.requests
    assert s["completed"] == sc.workload.num_requests == len(rq)
    assert s["request_throughput"] > 0 and s["output_throughput"] > 0
    assert rq["user"].nunique() == 64
    # the default cost model adds request handling after the engine (frontend, scheduling lag,
    # stalls: sim/cost/overheads.py), and a user's think time starts from the engine's finish
    # (docs/validation.md, known limits): one in flight on the engine's timeline, exactly
    check_one_in_flight(rq.assign(finish_s=rq["engine_finish_s"]))
    assert (rq["finish_s"] > rq["engine_finish_s"]).all()
    assert s["goodput"]["ttft_ms"]["target"] == 500 and s["goodput"]["tpot_ms"]["target"] == 20
    check_one_in_flight(simulate(load_scenario(REPO / "scenarios" / "closed-loop-llama3-8b-h100.yaml",
                                               ["cost_model=roofline", "workload.num_requests=300"])).requests)
