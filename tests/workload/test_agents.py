"""workload.arrival: agents (open-loop agent sessions of LLM calls separated by tool runs): a
timeline by hand, invariants over random sessions, and the mistakes refused."""
from __future__ import annotations

import numpy as np
import pytest

from sim.config.errors import ScenarioError
from sim.simulate import simulate
from simhelpers import make_scenario

FIXED = lambda v: {"dist": "fixed", "value": v}  # noqa: E731


def agents(**arrival):
    return {"arrival": {"process": "agents", "rate": 1.0, "sessions": 1, "steps": 3, "tool_time": 2.0,
                        "tool_dist": "fixed", **arrival},
            "prompt_tokens": FIXED(4), "output_tokens": FIXED(3)}


@pytest.mark.parametrize("ff", [True, False])
def test_one_session_by_hand(ff):
    """Unit costs (1 s an iteration), 4-token messages, 3-token answers, 2 s tools. Call 1 at 0:
    prefill [0, 1] (token 1 at 1), tokens 2, 3 at 2, 3. The tool runs 3-5; call 2 at 5 carries the
    session so far, 4 + 3 + 4 = 11 tokens: finish 8; call 3 at 10, 11 + 3 + 4 = 18 tokens: finish
    13. The session takes 13 s."""
    r = simulate(make_scenario(workload=agents(), scheduler="chunked", max_num_seqs=8,
                               max_num_batched_tokens=64), fast_forward=ff)
    rq = r.requests
    assert rq["arrival_s"].tolist() == [0.0, 5.0, 10.0]
    assert rq["prompt_tokens"].tolist() == [4, 11, 18]
    assert rq["finish_s"].tolist() == [3.0, 8.0, 13.0]
    assert rq["user"].tolist() == [0, 0, 0] and rq["turn"].tolist() == [1, 2, 3]
    assert r.summary["agents"]["sessions"] == 1 and r.summary["agents"]["calls_mean"] == 3
    assert r.summary["agents"]["session_s"]["p50"] == 13.0
    from sim.reporting.html_report import _run_rows
    assert ("agent sessions", "1, 3.00 calls each; session p50 / p99 13.0 / 13.0 s") in _run_rows(r.summary)


def test_sessions_make_their_own_calls_and_no_more():
    """40 sessions at 0.5/s, 2-7 calls each, exponential tools: every session sends exactly its
    calls; each call after the first arrives when the last one finished plus its tool time, and
    carries the session so far (prompt = last prompt + last output + its own new tokens)."""
    w = {"arrival": {"process": "agents", "rate": 0.5, "sessions": 40, "steps": {"dist": "uniform", "low": 2, "high": 7},
                     "tool_time": 1.5},
         "prompt_tokens": {"dist": "uniform", "low": 50, "high": 400}, "output_tokens": {"dist": "uniform", "low": 10, "high": 200}}
    sc = make_scenario(workload=w, cost_model="roofline", scheduler="chunked", replicas=2, router="least_loaded")
    from sim.workload.generators import build_workload

    plan = build_workload(sc.workload, np.random.default_rng(sc.seed))
    r = simulate(sc)
    rq = r.requests
    assert len(rq) == int(plan.users.calls.sum()) == r.summary["completed"]
    counts = rq.groupby("user").size()
    assert counts.tolist() == plan.users.calls.tolist()   # user u: session u, in start order
    starts = rq.groupby("user")["arrival_s"].min().to_numpy()
    assert np.allclose(starts, plan.users.start_s) and starts[0] == 0
    think = plan.users.think_s
    for _, calls in rq.groupby("user"):
        calls = calls.sort_values("arrival_s")
        ids = calls["request_id"].to_numpy()
        arrive, finish = calls["arrival_s"].to_numpy(), calls["finish_s"].to_numpy()
        assert np.allclose(arrive[1:], finish[:-1] + think[ids[:-1]])
        prompt, out = calls["prompt_tokens"].to_numpy(), calls["output_tokens"].to_numpy()
        assert (prompt[1:] > prompt[:-1] + out[:-1]).all()  # + its own new tokens (>= 50)
    assert r.summary["sessions"]["ended_at_context_limit"] == 0


@pytest.mark.parametrize("workload, message", [
    ({**agents(), "num_requests": 10}, "workload.num_requests: not with agents"),
    (agents(steps=0), "workload.arrival.steps"),
    (agents(sessions=0), "workload.arrival.sessions"),
    ({**agents(), "arrival": {"process": "agents", "rate": 1.0, "steps": 3, "tool_time": 1}}, "workload.arrival.sessions: missing"),
    (agents(users=3), "workload.arrival.users: unknown key"),
])
def test_agent_mistakes_are_refused(workload, message):
    with pytest.raises(ScenarioError, match=message):
        make_scenario(workload=workload)


def test_the_load_search_over_agents_varies_the_session_rate_and_scales_the_sessions(tmp_path):
    """An agents workload's load is sessions starting per second (--target-rate in that unit). A run
    at a load spans the horizon (120 s by default), its sessions scaled with the rate: a fixed count
    of sessions, each a chain of calls, would cap the concurrency at any rate. The request bounds hold
    on requests: 3 calls a session, so at least 200 / 3 -> 67 sessions, at most 20,000 / 3 -> 6,666."""
    import yaml

    import servesim
    from sim.planning.evaluator import PlanOptions
    from sim.planning.load_search import load_knob
    from sim.scenario import load_scenario

    raw = {"name": "a", "model": "llama-3-8b", "hardware": "h100-sxm", "cost_model": "roofline", "workload": agents(),
           "slo": {"ttft_ms": 500}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    knob = load_knob(load_scenario(tmp_path / "s.yaml"), PlanOptions(min_requests=200, max_requests=20_000))
    assert (knob.key, knob.unit, knob.base, knob.per_count) == ("workload.arrival.rate", "sessions/s", 1.0, 3.0)
    # a p99 needs 2,223 requests per run (20 judged past it): 741 sessions of 3 calls, more than 120 s
    # at 2 sessions/s (240 sessions)
    assert knob.percentile_requests == 2223 and knob.overrides(2.0, PlanOptions(min_requests=200))[1] == \
        "workload.arrival.sessions=741"
    knob = load_knob(load_scenario(tmp_path / "s.yaml"), PlanOptions(tail_requests=0))  # (the bounds alone below)
    o = PlanOptions(min_requests=200, max_requests=20_000)
    assert knob.overrides(2.0, o) == ("workload.arrival.rate=2.0", "workload.arrival.sessions=240")
    assert knob.overrides(0.1, o) == ("workload.arrival.rate=0.1", "workload.arrival.sessions=67")
    assert knob.overrides(500.0, o) == ("workload.arrival.rate=500.0", "workload.arrival.sessions=6666")
    with pytest.raises(ScenarioError, match="--target-users: .* use --target-rate"):
        servesim.plan(str(tmp_path / "s.yaml"), target_users=10)


def test_more_calls_than_a_run_holds_are_refused_before_any_is_drawn():
    with pytest.raises(ScenarioError, match="workload.arrival.sessions: 1,000,000 sessions of 1000 calls"):
        make_scenario(workload=agents(sessions=1_000_000, steps=1000))
    lognormal = agents(sessions=1000, steps={"dist": "lognormal", "mean": 1e6, "std": 1e6})
    with pytest.raises(ScenarioError, match="workload.arrival.sessions"):
        make_scenario(workload=lognormal)


@pytest.mark.parametrize("ff", [True, False])
def test_fan_out_sends_a_steps_calls_together_and_waits_for_all(ff):
    """fan_out 2, two steps, 4-token messages, 2-token answers, 1 s tools, 4-token blocks. Step 1: both
    calls at 0, prefilled together [0, 1] (8 tokens), decoded [1, 2]; the tool runs after the last
    answer, 2-3. Step 2 at 3: its first call's prompt is step 1's first prompt and both answers plus
    its new tokens, 4 + 2 + 2 + 4 = 12; the second call shares that context (8 tokens) and adds its
    own 4: 12. Both find step 1's first block (4 tokens: its first call's message) cached; the
    block of the context's next 4 tokens is being computed by the first call in the same iteration."""
    r = simulate(make_scenario(workload=agents(steps=2, tool_time=1.0, fan_out=2) | {"output_tokens": FIXED(2)},
                               scheduler="chunked", block_size=4, max_num_seqs=8, max_num_batched_tokens=64),
                 fast_forward=ff)
    rq = r.requests
    assert rq["arrival_s"].tolist() == [0.0, 0.0, 3.0, 3.0]
    assert rq["prompt_tokens"].tolist() == [4, 4, 12, 12] and rq["turn"].tolist() == [1, 1, 2, 2]
    assert rq["finish_s"].tolist() == [2.0, 2.0, 5.0, 5.0] and rq["cached_tokens"].tolist() == [0, 0, 4, 4]
    assert r.summary["agents"]["calls_mean"] == 4


def test_a_fan_out_of_one_is_the_plain_session():
    plain = simulate(make_scenario(workload=agents(sessions=6, rate=0.5), scheduler="chunked"))
    fan = simulate(make_scenario(workload=agents(sessions=6, rate=0.5, fan_out=1), scheduler="chunked"))
    assert plain.requests.equals(fan.requests)


def test_fan_out_counts_in_the_expected_calls():
    from sim.scenario import scenario_from_dict

    w = agents(sessions=10, steps={"dist": "uniform", "low": 2, "high": 4}, fan_out={"dist": "fixed", "value": 3})
    sc = scenario_from_dict({"model": "llama-3-8b", "hardware": "h100-sxm", "workload": w})
    assert sc.workload.arrival.expected_requests() == 10 * 3 * 3
