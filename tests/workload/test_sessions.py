"""Multi-turn sessions of closed-loop users (sim/workload/sessions.py): a user's next prompt is its whole
previous conversation plus a new message, and prefix caching hits what the last turn left behind,
generated tokens included. Unit cost: every iteration lasts 1 s, so timelines are written by hand."""
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from sim.config.errors import ScenarioError
from sim.simulate import simulate
from sim.workload.generators import Users, Workload, parse_workload
from simhelpers import assert_same_run, make_scenario

ENGINE = {"scheduler": "chunked", "max_num_seqs": 4, "max_num_batched_tokens": 64, "block_size": 16}


def sessions(turns=3, n=4, users=1, message=20, output=10, **arrival):
    return {"arrival": {"process": "closed_loop", "users": users, "think_time": 0, "turns": turns, **arrival},
            "prompt_tokens": {"dist": "fixed", "value": message},
            "output_tokens": {"dist": "fixed", "value": output}, "num_requests": n}


def columns(r, *names):
    return [r.requests[c].tolist() for c in names]


# ------------------------------------------------------------------ exact timelines

@pytest.mark.parametrize("ff", [True, False])
def test_each_turn_hits_the_blocks_the_last_turn_filled(ff):
    """One user, 3 turns of a 20-token message and 10 output tokens, 16-token blocks.
    Turn 1 (prompt 20) ends with 20 + 10 - 1 = 29 tokens of KV: 1 full block. Turn 2's prompt is
    20 + 10 + 20 = 50: it hits that block (16 tokens), computes 34 in one iteration, and ends with
    59 tokens of KV: 3 full blocks, two of them filled while decoding. Turn 3 (60 + 20 = 80) hits
    all 3 (48 tokens) and computes 32 in one iteration. Request 3 starts a new conversation."""
    r = simulate(make_scenario(workload=sessions(), **ENGINE), fast_forward=ff)
    assert columns(r, "arrival_s", "prompt_tokens", "first_token_s", "finish_s") == [
        [0.0, 10.0, 20.0, 30.0], [20, 50, 80, 20], [1.0, 11.0, 21.0, 31.0], [10.0, 20.0, 30.0, 40.0]]
    assert columns(r, "conversation", "turn", "cached_tokens") == [
        [0, 0, 0, 1], [1, 2, 3, 1], [0, 16, 48, 0]]
    assert r.summary["prefix_cache_hit_rate"] == (16 + 48) / (20 + 50 + 80 + 20)
    assert r.summary["sessions"] == {"conversations": 2, "turns_mean": 2.0, "ended_at_context_limit": 0}


def test_without_caching_prompts_still_grow_and_turn_3_takes_two_chunks():
    """Same conversation, caching off: turn 3's 80 tokens exceed the 64-token budget, so its
    prefill takes [20, 21] and [21, 22]: first token at 22, one iteration later than with caching."""
    r = simulate(make_scenario(workload=sessions(), enable_prefix_caching=False, **ENGINE))
    assert columns(r, "prompt_tokens", "first_token_s", "finish_s") == [
        [20, 50, 80, 20], [1.0, 11.0, 22.0, 32.0], [10.0, 20.0, 31.0, 41.0]]
    assert "cached_tokens" not in r.requests and "prefix_cache_hit_rate" not in r.summary


@pytest.mark.parametrize("limit", [{"max_context": 60}, {"num_gpu_blocks": 5}])
def test_a_conversation_that_would_not_fit_starts_over(limit):
    """Turn 2 (50 + 10 = 60 tokens; 59 of KV = 4 blocks of 16) fits both limits; turn 3 would be
    80 + 10 = 90 tokens (89 of KV = 6 blocks > 5), so request 2 starts conversation 1 instead."""
    arrival = {"max_context": limit["max_context"]} if "max_context" in limit else {}
    engine = dict(ENGINE, **{k: v for k, v in limit.items() if k != "max_context"})
    r = simulate(make_scenario(workload=sessions(**arrival), **engine))
    assert columns(r, "prompt_tokens", "conversation", "turn", "cached_tokens") == [
        [20, 50, 20, 50], [0, 0, 1, 1], [1, 2, 1, 2], [0, 16, 0, 16]]
    assert r.summary["sessions"]["ended_at_context_limit"] == 1


def test_a_system_prompt_is_shared_across_conversations():
    """Two users, every conversation opening with the same 32-token system prompt (2 blocks).
    User 0: request 0 at 0 (40 tokens, 9 out: 48 of KV = 3 full blocks), its turn 2 at 9 with
    40 + 9 + 40 = 89 tokens hits 3 blocks, then user 0 thinks for 100 s. User 1 starts at 20: its
    first request hits the two system-prompt blocks user 0 left (32 tokens), its turn 2 hits its
    own 3 blocks."""
    n = 4
    w = Workload(arrival_s=np.full(n, np.nan), prompt_tokens=np.full(n, 40), output_tokens=np.full(n, 9),
                 priority=np.zeros(n, np.int64), prefix=[((("system",),), 32)] * n,
                 users=Users(np.array([0.0, 20.0]), np.array([0.0, 100.0, 0.0, 0.0]), turns=np.full(n, 2)))
    r = simulate(make_scenario(**dict(ENGINE, max_num_batched_tokens=128)), workload=w)
    assert columns(r, "arrival_s", "user", "prompt_tokens", "cached_tokens", "finish_s") == [
        [0.0, 9.0, 20.0, 29.0], [0, 0, 1, 1], [40, 89, 40, 89], [0, 48, 32, 48], [9.0, 18.0, 29.0, 38.0]]
    assert r.summary["prefix_cache_hit_rate"] == 128 / 258


@pytest.mark.parametrize("router, replicas, cached", [
    # round robin alternates: turn 2 lands where nothing is cached, turn 3 finds turn 1's single
    # block, turn 4 turn 2's three
    ("round_robin", [0, 1, 0, 1], [0, 0, 16, 48]),
    # prefix-aware keeps the conversation where its blocks are: 1, 3, then 89 // 16 = 5 blocks
    ("prefix_aware", [0, 0, 0, 0], [0, 16, 48, 80])])
def test_prefix_aware_routing_keeps_a_conversation_on_its_replica(router, replicas, cached):
    sc = make_scenario(workload=sessions(turns=4), replicas=2, router=router, **ENGINE)
    r = simulate(sc)
    assert columns(r, "prompt_tokens", "replica", "cached_tokens") == [[20, 50, 80, 110], replicas, cached]
    assert r.summary["prefix_cache_hit_rate"] == sum(cached) / 260


def test_static_batching_grows_prompts_without_caching():
    r = simulate(make_scenario(workload=sessions(n=3), scheduler="static", max_num_seqs=4))
    assert columns(r, "prompt_tokens", "turn") == [[20, 50, 80], [1, 2, 3]]
    assert "cached_tokens" not in r.requests


def test_one_turn_each_is_the_plain_closed_loop():
    """turns: 1 makes every request a conversation of its own: the same run as no turns at all
    (under preemptions too, where a request's resumption hits its own blocks either way)."""
    w = sessions(turns=1, n=40, users=12, message=60, output=40)
    w["prompt_tokens"] = {"dist": "uniform", "low": 10, "high": 90}
    engine = dict(ENGINE, num_gpu_blocks=20, max_num_seqs=8)
    with_turns = simulate(make_scenario(workload=w, **engine))
    del w["arrival"]["turns"]
    plain = simulate(make_scenario(workload=w, **engine))
    assert plain.summary["preemptions"] > 0
    cols = ["arrival_s", "prompt_tokens", "first_token_s", "finish_s", "preemptions", "user"]
    assert with_turns.requests[cols].equals(plain.requests[cols])
    assert with_turns.summary["sessions"]["turns_mean"] == 1.0


def test_the_callers_workload_is_not_changed():
    """Planners simulate one drawn workload many times: prompts grow in the run's copy only."""
    sc = make_scenario(workload=sessions(), **ENGINE)
    from sim.workload.generators import build_workload
    w = build_workload(sc.workload, np.random.default_rng(0))
    first = simulate(sc, workload=w)
    assert w.prompt_tokens.tolist() == [20] * 4
    again = simulate(sc, workload=w)
    assert first.requests.equals(again.requests)


# ------------------------------------------------------------------ invariants

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    phases=[Phase.explicit, Phase.reuse, Phase.generate])


@SETTINGS
@given(n=st.integers(1, 30), users=st.integers(1, 5), turns=st.integers(1, 5),
       blocks=st.integers(18, 40), replicas=st.integers(1, 2),
       router=st.sampled_from(["round_robin", "least_loaded", "prefix_aware"]),
       scheduler=st.sampled_from(["continuous", "chunked"]), seed=st.integers(0, 10**6))
def test_invariants_and_fast_forward(n, users, turns, blocks, replicas, router, scheduler, seed):
    """Every request finishes once; a follow-up's prompt is the last turn's prompt + output +
    its own message; blocks stay within capacity; a hit never reaches an admission's last token;
    fast-forward changes nothing."""
    w = sessions(turns=turns, n=n, users=users)
    w["prompt_tokens"] = {"dist": "uniform", "low": 1, "high": 40}
    w["output_tokens"] = {"dist": "uniform", "low": 1, "high": 30}
    w["arrival"]["think_time"] = 0.5
    sc = make_scenario(workload=w, seed=seed, scheduler=scheduler, max_num_seqs=4, block_size=4,
                       num_gpu_blocks=blocks, max_num_batched_tokens=200, replicas=replicas, router=router)
    r = simulate(sc)
    assert_same_run(r, simulate(sc, fast_forward=False))
    rq = r.requests
    assert r.summary["completed"] == n and rq["finish_s"].notna().all()
    assert (r.steps["kv_blocks_used"] <= r.steps["kv_blocks_total"]).all()
    # each admission hits at most its tokens so far less one (a resumption: prompt + generated)
    most = rq["prompt_tokens"] - 1 + rq["preemptions"] * (rq["prompt_tokens"] + rq["output_tokens"] - 2)
    assert (rq["cached_tokens"] <= most).all()
    from sim.workload.generators import build_workload
    message = build_workload(sc.workload, np.random.default_rng(seed)).prompt_tokens
    for _, mine in rq.sort_values("request_id").groupby("conversation"):
        assert mine["turn"].tolist() == list(range(1, len(mine) + 1))
        assert mine["user"].nunique() == 1 and len(mine) <= turns
        prompt, output, rid = (mine[c].to_numpy() for c in ("prompt_tokens", "output_tokens", "request_id"))
        assert prompt[0] == message[rid[0]]
        assert (prompt[1:] == prompt[:-1] + output[:-1] + message[rid[1:]]).all()
        assert (mine["arrival_s"].to_numpy()[1:] >= mine["finish_s"].to_numpy()[:-1]).all()


# ------------------------------------------------------------------ the YAML keys

def test_turns_as_a_distribution_and_the_errors():
    ok = parse_workload(sessions(turns={"dist": "uniform", "low": 2, "high": 6}, max_context=4096), "s.yaml", ".")
    assert ok.arrival.max_context == 4096 and ok.arrival.turns.high == 6
    bad = [({"turns": 0}, "workload.arrival.turns: 0 is not an integer >= 1"),
           ({"turns": {"dist": "empirical"}}, "workload.arrival.turns.dist: 'empirical' is not one of fixed, uniform, lognormal"),
           ({"turns": None, "max_context": 100}, "workload.arrival.max_context: only with workload.arrival.turns")]
    for arrival, message in bad:
        raw = sessions(**arrival)
        if arrival.get("turns", 1) is None:
            del raw["arrival"]["turns"]
        with pytest.raises(ScenarioError, match=message.replace(".", r"\.").replace("(", r"\(")):
            parse_workload(raw, "s.yaml", ".")


def test_servesim_run_prints_the_hit_rate_and_the_conversations(tmp_path):
    import yaml
    from typer.testing import CliRunner

    from cli import app

    raw = {"name": "mt", "model": "llama-3-8b", "hardware": "h100-sxm", "cost_model": "unit",
           "engine": ENGINE, "workload": sessions()}
    (tmp_path / "mt.yaml").write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(app, ["run", str(tmp_path / "mt.yaml"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    # hand timeline above: 64 of 170 looked-up tokens hit; 2 conversations of 3 and 1 turns
    assert "prefix cache hit rate" in result.output and "37.6%" in result.output
    assert "conversations (mean turns)" in result.output and "2 (2.00)" in result.output
