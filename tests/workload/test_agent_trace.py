"""Recorded agent sessions replayed closed loop (workload.format agent_sessions; sim/workload/sessions.py):
a hand timeline with the unit cost model, a session whose context was reset, time_scale on the tools'
times, and the reader's one-line errors."""
from __future__ import annotations

from pathlib import Path

import pytest

from sim.config.errors import ScenarioError
from sim.scenario import scenario_from_dict
from sim.simulate import simulate
from sim.workload.traces import read_trace

HEADER = "session_id,start_s,prompt_tokens,output_tokens,tool_s\n"


def _run(tmp_path: Path, rows: str, **workload):
    (tmp_path / "agents.csv").write_text(HEADER + rows)
    sc = scenario_from_dict({"model": "llama-3-8b", "hardware": "h100-sxm", "cost_model": "unit",
                             "engine": {"scheduler": "chunked", "block_size": 4},
                             "workload": {"trace": "agents.csv", **workload}}, base_dir=tmp_path)
    return simulate(sc)


def test_a_recorded_session_waits_for_its_call_and_its_tool(tmp_path):
    """A starts at 0: 8-token prompt, 2 out, then a 3 s tool; its second call's prompt is the first's
    8 + 2 and 4 new tokens. B starts at 1: 5 tokens, 1 out. [0,1] A prefills; [1,2] A decodes and B
    prefills (B done at 2); A's last token at 2, its tool until 5: A's second call arrives at 5, finds
    its first 8 tokens cached (two 4-token blocks), prefills 6 in [5,6], decodes in [6,7]."""
    r = _run(tmp_path, "A,0,8,2,3\nB,1,5,1,0\nA,,14,2,0\n")
    rq = r.requests
    assert rq[["arrival_s", "prompt_tokens", "output_tokens", "first_token_s", "finish_s"]].values.tolist() == \
        [[0, 8, 2, 1, 2], [1, 5, 1, 2, 2], [5, 14, 2, 6, 7]]
    assert rq["user"].tolist() == [0, 1, 0] and rq["turn"].tolist() == [1, 1, 2]
    assert rq["cached_tokens"].tolist() == [0, 0, 8]
    assert r.steps[["start_s", "prefill_tokens", "decode_tokens"]].values.tolist() == \
        [[0, 8, 0], [1, 5, 1], [5, 6, 0], [6, 0, 1]]


def test_a_shorter_prompt_starts_a_new_conversation_and_time_scale_shortens_the_tools(tmp_path):
    """A's second call (6 tokens) is shorter than its first call's 8 + 2: the agent reset its context, so
    it is a new conversation with nothing cached. time_scale 2: the 3 s tool takes 1.5 s, so it arrives
    at 2 + 1.5 = 3.5."""
    r = _run(tmp_path, "A,0,8,2,3\nA,,6,1,0\n", time_scale=2)
    rq = r.requests
    assert rq["arrival_s"].tolist() == [0.0, 3.5] and rq["conversation"].tolist() == [0, 1]
    assert rq["cached_tokens"].tolist() == [0, 0] and rq["turn"].tolist() == [1, 1]


def test_the_reader_says_what_is_wrong_on_which_line(tmp_path):
    for rows, message in (("A,0,8,2,-1\n", "agents.csv:2: tool_s '-1' is not a non-negative number"),
                          (",0,8,2,0\n", "agents.csv:2: session_id is missing"),
                          ("A,0,0,2,0\n", "agents.csv:2: prompt_tokens '0' is not a positive integer"),
                          ("A,,8,2,0\n", "agents.csv:2: start_s is missing"),
                          # another start on a later row would be that call's own arrival: refused
                          ("A,1,8,2,0\nB,2,5,1,0\nA,3,14,2,0\n",
                           "agents.csv:4: start_s 3 differs from the start of session 'A', 1 s on line 2")):
        (tmp_path / "agents.csv").write_text(HEADER + rows)
        with pytest.raises(ScenarioError, match=message.replace("(", r"\(")):
            read_trace(tmp_path / "agents.csv")
    with pytest.raises(ScenarioError, match="workload.num_requests: not with agent sessions"):
        _run(tmp_path, "A,0,8,2,0\n", num_requests=1)
    # a session's start is read on its first row; later rows may repeat it or leave it out
    (tmp_path / "agents.csv").write_text("session_id,prompt_tokens,output_tokens\nx,3,1\ny,4,1\nx,9,1\n")
    table = read_trace(tmp_path / "agents.csv")
    assert table["session"].tolist() == [0, 1, 0] and table["start_s"].tolist() == [0.0, 0.0, 0.0]
    (tmp_path / "agents.csv").write_text(HEADER + "A,1,8,2,0\nB,2,5,1,0\nA,1.0,14,2,0\nB,,5,1,0\n")
    assert read_trace(tmp_path / "agents.csv")["start_s"].tolist() == [1.0, 2.0, 1.0, 2.0]


def test_the_planner_says_recorded_sessions_have_no_rate_to_vary(tmp_path):
    from sim.planning.load_search import replay_stats

    (tmp_path / "agents.csv").write_text(HEADER + "A,0,8,2,3\nA,,14,2,0\n")
    sc = scenario_from_dict({"model": "llama-3-8b", "hardware": "h100-sxm", "workload": {"trace": "agents.csv"}},
                            base_dir=tmp_path)
    with pytest.raises(ScenarioError, match="recorded agent sessions arrive as their calls finish"):
        replay_stats(sc.workload)


def test_ids_are_text_never_numbers(tmp_path):
    """Session ids 007, 7 and 0007 are three sessions, True and true two (pandas read them as one
    number, or one bool); LoRA adapters named 01, 1 and 1.0 are three adapters."""
    sessions = tmp_path / "s.csv"
    sessions.write_text("session_id,prompt_tokens,output_tokens\n007,10,2\n7,10,2\n0007,10,2\nTrue,10,2\n"
                        "true,10,2\n007,30,2\n")
    t = read_trace(sessions)
    assert t["session"].tolist() == [0, 1, 2, 3, 4, 0]
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens,adapter\n0,10,2,01\n1,10,2,1\n2,10,2,1.0\n3,10,2,\n"
                     "4,10,2,01\n")
    t = read_trace(trace)
    assert t["adapter"].tolist() == [0, 1, 2, -1, 0] and t.attrs["adapters"] == ["01", "1", "1.0"]


def test_more_block_ids_than_the_prompt_has_blocks_are_refused_naming_the_line(tmp_path):
    """A 1,000-token prompt has ceil(1000 / 512) = 2 Mooncake blocks: a cell of a million ids (it ran
    the machine out of memory) or of three is refused naming the line; two are read."""
    trace = tmp_path / "t.csv"
    many = " ".join(str(i) for i in range(1_000_000))
    trace.write_text(f"arrival_s,prompt_tokens,output_tokens,hash_ids\n0,100,2,7\n1,1000,2,{many}\n")
    with pytest.raises(ScenarioError, match=r"t.csv:3: hash_ids names 1,000,000 blocks of 512 tokens, more than its "
                                            r"1,000-token prompt has \(2\)"):
        read_trace(trace)
    trace.write_text("arrival_s,prompt_tokens,output_tokens,hash_ids\n0,1000,2,1 2 3\n")
    with pytest.raises(ScenarioError, match=r"t.csv:2: hash_ids names 3 blocks"):
        read_trace(trace)
    trace.write_text("arrival_s,prompt_tokens,output_tokens,hash_ids\n0,1000,2,1 2\n")
    assert read_trace(trace)["prefix"].tolist() == [((1, 2), 512)]
