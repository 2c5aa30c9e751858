"""sim/workload/generators.py and sim/workload/traces.py: the `workload:` section, generators and trace readers."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config.errors import ScenarioError
from sim.workload.generators import (
    Burst,
    Constant,
    Empirical,
    Fixed,
    Gamma,
    Lognormal,
    Poisson,
    Uniform,
    WorkloadConfig,
    build_workload,
    parse_workload,
)
from sim.workload.traces import read_trace

REPO = Path(__file__).parents[2]
FIXTURES = REPO / "scenarios" / "traces"
SHARED = Path(__file__).parents[3] / "shared" / "data" / "traces"
GENERATOR = {"arrival": {"process": "poisson", "rate": 8.0},
             "prompt_tokens": {"dist": "lognormal", "mean": 1000, "std": 600, "max": 8192},
             "output_tokens": {"dist": "fixed", "value": 200},
             "num_requests": 2000}


def parse(raw: dict) -> WorkloadConfig:
    return parse_workload(raw, "scenarios/chat.yaml", REPO / "scenarios")


def build(cfg: WorkloadConfig, seed: int = 0):
    return build_workload(cfg, np.random.default_rng(seed))


def write(tmp_path: Path, name: str, text: str) -> Path:
    (tmp_path / name).write_text(text)
    return tmp_path / name


# ---- fixtures replay exactly ----

def test_toy8_exact():
    w = build(parse({"trace": "traces/toy8.csv"}))
    assert w.arrival_s.tolist() == [0.0] * 8
    assert w.prompt_tokens.tolist() == [16] * 8
    assert w.output_tokens.tolist() == [444, 480, 91, 315, 573, 547, 464, 360]
    assert w.priority.tolist() == [0] * 8
    assert (w.arrival_s.dtype, w.prompt_tokens.dtype, w.output_tokens.dtype, w.priority.dtype) == (
        np.float64, np.int64, np.int64, np.int64)


@pytest.mark.parametrize("name, rows, head, sums", [
    # head: first 5 (arrival_s, prompt, output); sums: prompt, output, priority, last arrival
    ("generic_code.csv", 150, [(0.0, 4808, 10), (0.052, 3180, 8), (0.098189, 110, 27),
                               (0.140684, 7433, 14), (0.444994, 34, 12)], (335004, 3969, 19, 196.957472)),
    ("azure_conv.csv", 120, [(0.0, 374, 44), (4.314579, 396, 109), (4.541877, 879, 55),
                             (4.710427, 91, 16), (5.892655, 91, 16)], (97473, 23054, 0, 45.502752)),
    ("mooncake_conv.jsonl", 100, [(0.0, 6758, 500), (0.0, 7322, 490), (0.0, 7236, 794),
                                  (0.0, 2290, 316), (0.0, 6760, 3)], (1524742, 36758, 0, 33.0)),
])
def test_fixture_traces_exact(name, rows, head, sums):
    t = read_trace(FIXTURES / name)
    assert len(t) == rows
    assert list(zip(t.arrival_s[:5], t.prompt_tokens[:5], t.output_tokens[:5])) == head
    assert (t.prompt_tokens.sum(), t.output_tokens.sum(), t.priority.sum(), t.arrival_s.iloc[-1]) == sums
    assert np.all(np.diff(t.arrival_s) >= 0)


def test_azure_keeps_seven_fractional_digits_and_offsets_from_earliest(tmp_path):
    p = write(tmp_path, "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                 "2023-11-16 18:15:47.0000001,5,6\n"
                                 "2023-11-16 18:15:46.6805900,3,4\n")
    t = read_trace(p)
    assert t.arrival_s.tolist() == [0.0, 0.3194101]  # sorted; 100 ns resolution kept
    assert t.prompt_tokens.tolist() == [3, 5]


def test_unsorted_trace_is_sorted_stably(tmp_path):
    p = write(tmp_path, "u.csv", "arrival_s,prompt_tokens,output_tokens,priority\n"
                                 "2.5,1,1,0\n1.0,2,2,1\n2.5,3,3,2\n0,4,4,-1\n")
    t = read_trace(p)
    assert t.arrival_s.tolist() == [0.0, 1.0, 2.5, 2.5]
    assert t.prompt_tokens.tolist() == [4, 2, 1, 3]
    assert t.priority.tolist() == [-1, 1, 0, 2]


def test_many_ties_keep_file_order(tmp_path):
    arrivals = [(7 * i) % 3 for i in range(60)]  # 0, 1, 2, 0, ... out of order, 20 rows per time
    p = write(tmp_path, "ties.csv", "arrival_s,prompt_tokens,output_tokens\n"
              + "".join(f"{a},{i + 1},1\n" for i, a in enumerate(arrivals)))
    expected = [i + 1 for a in (0, 1, 2) for i in range(60) if arrivals[i] == a]
    assert read_trace(p).prompt_tokens.tolist() == expected


def test_zero_output_tokens_become_one(tmp_path):
    p = write(tmp_path, "z.csv", "arrival_s,prompt_tokens,output_tokens\n0,10,0\n1,20,5\n")
    assert read_trace(p).output_tokens.tolist() == [1, 5]


def test_blank_lines_and_extra_columns_are_ignored(tmp_path):
    p = write(tmp_path, "m.jsonl", '{"timestamp": 1500, "input_length": 7, "output_length": 2, "x": 1}\n'
                                   '\n{"timestamp": 0, "input_length": 9, "output_length": 3}\n')
    t = read_trace(p)
    assert (t.arrival_s.tolist(), t.prompt_tokens.tolist()) == ([0.0, 1.5], [9, 7])


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e6), st.integers(1, 10**6), st.integers(1, 10**5)),
                min_size=1, max_size=40))
def test_generic_csv_round_trips(tmp_path_factory, rows):
    rows = sorted(rows, key=lambda r: r[0])
    text = "arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{a!r},{p},{o}\n" for a, p, o in rows)
    p = write(tmp_path_factory.mktemp("rt"), "t.csv", text)
    t = read_trace(p)
    assert list(zip(t.arrival_s, t.prompt_tokens, t.output_tokens)) == rows


# ---- trace errors: one line, file:line, the column and the value ----

CSV = "arrival_s,prompt_tokens,output_tokens\n0,5,5\n1,5,5\n"


@pytest.mark.parametrize("name, text, message", [
    ("bad.csv", CSV + "2,5,5\n\n3,5,5\n4,abc,5\n", "bad.csv:7: prompt_tokens 'abc' is not a positive integer"),
    ("bad.csv", CSV + "2,0,5\n", "bad.csv:4: prompt_tokens '0' is not a positive integer"),
    ("bad.csv", CSV + "2,5,-3\n", "bad.csv:4: output_tokens '-3' is not a non-negative integer"),
    ("bad.csv", CSV + "2,5.5,3\n", "bad.csv:4: prompt_tokens '5.5' is not a positive integer"),
    ("bad.csv", CSV + "-1,5,3\n", "bad.csv:4: arrival_s '-1' is not a non-negative number"),
    ("bad.csv", CSV + "nan,5,3\n", "bad.csv:4: arrival_s 'nan' is not a non-negative number"),
    ("bad.csv", CSV + "3,5\n", "bad.csv:4: output_tokens is missing (expected a non-negative integer)"),
    ("bad.csv", CSV + "3,5,5,9\n", "bad.csv:4: expected 3 fields, saw 4"),
    ("bad.csv", "arrival_s,prompt_tokens,output_tokens,priority\n0,1,1,high\n",
     "bad.csv:2: priority 'high' is not an integer"),
    ("az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,3,4\nyesterday,3,4\n",
     "az.csv:3: TIMESTAMP 'yesterday' is not a timestamp like '2023-11-16 18:15:46.6805900'"),
    ("az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,0,4\n",
     "az.csv:2: ContextTokens '0' is not a positive integer"),
    ("m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 5}\n\n{"timestamp": 1, "input_length"\n',
     "m.jsonl:3: not valid JSON (Expecting ':' delimiter)"),
    ("m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 5}\n[1, 2]\n',
     "m.jsonl:2: expected a JSON object with keys timestamp, input_length, output_length"),
    ("m.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 5}\n{"timestamp": 9, "input_length": 5}\n',
     "m.jsonl:2: output_length is missing (expected a non-negative integer)"),
    ("m.jsonl", '{"timestamp": -5, "input_length": 5, "output_length": 5}\n',
     "m.jsonl:1: timestamp '-5' is not a non-negative number"),
    ("empty.csv", "", "empty.csv: the trace is empty"),
    ("header.csv", "arrival_s,prompt_tokens,output_tokens\n", "header.csv: the trace has no requests"),
])
def test_trace_errors(tmp_path, monkeypatch, name, text, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ScenarioError) as e:
        read_trace(write(tmp_path, name, text))
    assert str(e.value) == message


def test_unknown_format_lists_the_three_headers(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ScenarioError) as e:
        read_trace(write(tmp_path, "x.csv", "time,in,out\n0,1,1\n"))
    msg = str(e.value)
    assert msg.startswith("x.csv: unknown trace format (header 'time,in,out')") and "\n" not in msg
    for header in ("arrival_s,prompt_tokens,output_tokens", "TIMESTAMP,ContextTokens,GeneratedTokens",
                   "timestamp,input_length,output_length"):
        assert header in msg


# ---- building from a trace ----

def test_trace_num_requests_and_time_scale():
    w = build(parse({"trace": "traces/azure_conv.csv", "num_requests": 3, "time_scale": 2.0}))
    assert w.arrival_s.tolist() == [0.0, 4.314579 / 2, 4.541877 / 2]
    assert w.prompt_tokens.tolist() == [374, 396, 879]


def test_trace_shorter_than_num_requests():
    with pytest.raises(ScenarioError, match=r"toy8.csv: has 8 requests, fewer than workload.num_requests = 9$"):
        build(parse({"trace": "traces/toy8.csv", "num_requests": 9}))


def test_priority_from_trace_column_or_generated():
    assert build(parse({"trace": "traces/generic_code.csv"})).priority.sum() == 19
    w = build(parse({"trace": "traces/toy8.csv", "priority": {"dist": "uniform", "low": 0, "high": 3}}))
    assert set(w.priority.tolist()) <= {0, 1, 2, 3} and len(w.priority) == 8


# ---- generators: determinism and moments ----

def test_same_seed_same_arrays_different_seed_different():
    cfg = parse({**GENERATOR, "priority": {"dist": "uniform", "low": 0, "high": 3}})
    a, b, c = build(cfg, 7), build(cfg, 7), build(cfg, 8)
    for field in ("arrival_s", "prompt_tokens", "output_tokens", "priority"):
        assert np.array_equal(getattr(a, field), getattr(b, field))
    assert not np.array_equal(a.arrival_s, c.arrival_s)
    assert not np.array_equal(a.prompt_tokens, c.prompt_tokens)


def test_generated_workload_shape():
    w = build(parse(GENERATOR))
    assert len(w) == 2000 and w.arrival_s[0] == 0.0 and np.all(np.diff(w.arrival_s) >= 0)
    assert w.output_tokens.tolist() == [200] * 2000 and w.priority.tolist() == [0] * 2000
    assert w.prompt_tokens.min() >= 1 and w.prompt_tokens.max() <= 8192
    assert w.prompt_tokens.dtype == np.int64 and w.arrival_s.dtype == np.float64


N = 200_000


def sample(dist, seed=1):
    return dist.sample(np.random.default_rng(seed), N)


def gaps(process, seed=1):
    return np.diff(process.times(np.random.default_rng(seed), N))


def test_lognormal_mean_and_std_within_2_percent():
    x = sample(Lognormal(mean=1000, std=600))
    assert abs(x.mean() / 1000 - 1) < 0.02 and abs(x.std() / 600 - 1) < 0.02


def test_lognormal_clips_after_rounding():
    x = sample(Lognormal(mean=100, std=300, min=5, max=200))
    assert x.min() == 5 and x.max() == 200


def test_uniform_is_inclusive_and_flat():
    x = sample(Uniform(3, 6))
    counts = np.bincount(x, minlength=7)[3:]
    assert x.min() == 3 and x.max() == 6 and np.all(np.abs(counts / N - 0.25) < 0.01)


def test_poisson_rate_within_1_percent_and_exponential_gaps():
    g = gaps(Poisson(rate=8.0))
    assert abs(1 / g.mean() / 8.0 - 1) < 0.01 and abs(g.std() / g.mean() - 1) < 0.01


@pytest.mark.parametrize("cv", [0.5, 1.0, 3.0])
def test_gamma_rate_and_cv_within_3_percent(cv):
    g = gaps(Gamma(rate=4.0, cv=cv))
    assert abs(1 / g.mean() / 4.0 - 1) < 0.03 and abs(g.std() / g.mean() / cv - 1) < 0.03


def test_constant_and_burst_are_exact():
    assert Constant(rate=4.0).times(np.random.default_rng(0), 5).tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert Burst(at=2.0).times(np.random.default_rng(0), 3).tolist() == [2.0, 2.0, 2.0]


def test_empirical_resamples_the_right_column():
    cfg = parse({**GENERATOR, "prompt_tokens": {"dist": "empirical", "trace": "traces/toy8.csv"},
                 "output_tokens": {"dist": "empirical", "trace": "traces/toy8.csv"}})
    assert cfg.prompt_tokens == Empirical(FIXTURES.resolve() / "toy8.csv", "prompt")
    assert cfg.output_tokens.column == "output"
    w = build(cfg)
    assert set(w.prompt_tokens.tolist()) == {16}
    assert set(w.output_tokens.tolist()) == {444, 480, 91, 315, 573, 547, 464, 360}


def test_empirical_reads_any_csvs_own_columns(tmp_path):
    """columns: as workload.columns names them, with no arrival column needed: lengths only."""
    csv = write(tmp_path, "lens.csv", "request,in_len,out_len\na,100,7\nb,250,9\nc,100,11\n")
    cfg = parse({**GENERATOR, "prompt_tokens": {"dist": "empirical", "trace": str(csv),
                                                "columns": {"prompt_tokens": "in_len", "output_tokens": "out_len"}},
                 "output_tokens": {"dist": "empirical", "trace": str(csv), "columns": {"output_tokens": "out_len"}}})
    w = build(cfg)
    assert set(w.prompt_tokens.tolist()) == {100, 250} and set(w.output_tokens.tolist()) == {7, 9, 11}
    assert 0.55 < float(np.mean(w.prompt_tokens == 100)) < 0.78  # 2 of the 3 rows, drawn 2000 times
    for spec, says in (({"columns": {"output_tokens": "out_len"}}, "prompt_tokens.columns.prompt_tokens: missing"),
                       ({"columns": {"prompt_tokens": "in_len"}, "format": "generic"}, "give format or columns"),
                       ({"columns": {"arrival": "x"}}, "unknown key")):
        with pytest.raises(ScenarioError, match=says):
            parse({**GENERATOR, "prompt_tokens": {"dist": "empirical", "trace": str(csv), **spec}})
    wrong = parse({**GENERATOR, "prompt_tokens": {"dist": "empirical", "trace": str(csv),
                                                  "columns": {"prompt_tokens": "input"}}})
    with pytest.raises(ScenarioError, match="lens.csv: no column 'input'"):
        build(wrong)


def test_time_scale_divides_generated_arrivals():
    cfg = parse({**GENERATOR, "arrival": {"process": "constant", "rate": 2.0}, "num_requests": 3})
    assert build(replace(cfg, time_scale=4.0)).arrival_s.tolist() == [0.0, 0.125, 0.25]


# ---- parsing ----

def test_parse_generator():
    cfg = parse({**GENERATOR, "time_scale": 2, "arrival": {"process": "gamma", "rate": 8, "cv": 2}})
    assert cfg == WorkloadConfig(arrival=Gamma(8.0, 2.0), prompt_tokens=Lognormal(1000.0, 600.0, 1, 8192),
                                 output_tokens=Fixed(200), num_requests=2000, time_scale=2.0)
    assert parse({**GENERATOR, "arrival": {"process": "burst"}}).arrival == Burst(0.0)


def test_parse_trace_resolves_against_base_dir():
    cfg = parse({"trace": "traces/toy8.csv"})
    assert cfg.trace == (FIXTURES / "toy8.csv").resolve() and cfg.trace.is_absolute()
    assert (cfg.num_requests, cfg.time_scale, cfg.arrival) == (None, 1.0, None)


W = "scenarios/chat.yaml: workload"


@pytest.mark.parametrize("patch, message", [
    ({"prompt_tokens": {"dist": "gauss"}},
     f"{W}.prompt_tokens.dist: 'gauss' is not one of fixed, uniform, lognormal, empirical"),
    ({"prompt_tokens": {"dist": "lognormal", "mean": 5, "sd": 2}},
     f"{W}.prompt_tokens.sd: unknown key (did you mean 'std'?); allowed: dist, mean, std, min, max"),
    ({"prompt_tokens": {"dist": "lognormal", "mean": 5}}, f"{W}.prompt_tokens.std: missing (expected a number > 0)"),
    ({"prompt_tokens": {"dist": "lognormal", "mean": 5, "std": 1, "min": 10, "max": 4}},
     f"{W}.prompt_tokens.max: 4 is not an integer >= 10"),
    ({"prompt_tokens": {"dist": "uniform", "low": 5, "high": 4}}, f"{W}.prompt_tokens.high: 4 is not an integer >= 5"),
    ({"output_tokens": {"dist": "fixed", "value": 0}}, f"{W}.output_tokens.value: 0 is not an integer >= 1"),
    ({"output_tokens": {"dist": "fixed", "value": True}}, f"{W}.output_tokens.value: true is not an integer >= 1"),
    ({"output_tokens": {"dist": "fixed", "value": 2.5}}, f"{W}.output_tokens.value: 2.5 is not an integer >= 1"),
    ({"output_tokens": 200}, f"{W}.output_tokens: 200 is not a mapping; allowed keys: dist"),
    ({"output_tokens": {"dist": "empirical", "trace": "traces/nope.csv"}},
     f"{W}.output_tokens.trace: no such file 'traces/nope.csv' (looked in "),
    ({"output_tokens": {"dist": "empirical", "trace": "traces/toy8.csv", "column": "both"}},
     f"{W}.output_tokens.column: 'both' is not one of prompt, output"),
    ({"arrival": {"process": "poisson", "rate": "fast"}}, f"{W}.arrival.rate: 'fast' is not a number > 0"),
    ({"arrival": {"process": "poisson", "rate": 0}}, f"{W}.arrival.rate: 0 is not a number > 0"),
    ({"arrival": {"process": "poisson", "rate": float("inf")}}, f"{W}.arrival.rate: inf is not a number > 0"),
    ({"arrival": {"process": "gamma", "rate": 1}}, f"{W}.arrival.cv: missing (expected a number > 0)"),
    ({"arrival": {"process": "burst", "at": -1}}, f"{W}.arrival.at: -1 is not a number >= 0"),
    ({"arrival": {"process": "constant", "rate": 1, "cv": 2}}, f"{W}.arrival.cv: unknown key; allowed: process, rate"),
    ({"arrival": {"process": "weibull"}}, f"{W}.arrival.process: 'weibull' is not one of poisson, gamma, constant, burst"),
    ({"num_requests": 0}, f"{W}.num_requests: 0 is not an integer >= 1"),
    ({"time_scale": -2}, f"{W}.time_scale: -2 is not a number > 0"),
    ({"priority": {"dist": "lognormal", "mean": 1, "std": 1}},
     f"{W}.priority.dist: 'lognormal' is not one of fixed, uniform"),
    ({"priority": {"dist": "uniform", "low": -1, "high": 3}}, f"{W}.priority.low: -1 is not an integer >= 0"),
    ({"rate": 8}, f"{W}.rate: unknown key (did you mean 'trace'?); allowed: trace, format, columns, "
                  "time_unit, hash_block_tokens, time_scale, priority, prefix, arrival, prompt_tokens, output_tokens, "
                  "num_requests"),
    ({"trace": "traces/toy8.csv"}, f"{W}.arrival: not allowed with workload.trace"),
])
def test_parse_errors(patch, message):
    with pytest.raises(ScenarioError) as e:
        parse({**GENERATOR, **patch})
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


@pytest.mark.parametrize("raw, message", [
    ({}, f"{W}: needs either trace or all of arrival, prompt_tokens, output_tokens, num_requests "
         "(missing arrival, prompt_tokens, output_tokens, num_requests)"),
    ({"arrival": {"process": "burst"}, "prompt_tokens": {"dist": "fixed", "value": 1}},
     f"{W}: needs either trace or all of arrival, prompt_tokens, output_tokens, num_requests "
     "(missing output_tokens, num_requests)"),
    ({**GENERATOR, "num_requests": None}, f"{W}: needs either trace or all of arrival, prompt_tokens, "
                                          "output_tokens, num_requests (missing num_requests)"),
    ({"trace": "missing.csv"}, f"{W}.trace: no such file 'missing.csv' (looked in "),
    ({"trace": 3}, f"{W}.trace: 3 is not a file path"),
    (None, f"{W}: null is not a mapping; allowed keys: trace"),
])
def test_parse_section_errors(raw, message):
    with pytest.raises(ScenarioError) as e:
        parse(raw)
    assert str(e.value).startswith(message)


# ---- the real public traces (skipped where /work/shared/data is absent) ----

@pytest.mark.skipif(not SHARED.is_dir(), reason="shared traces not present")
@pytest.mark.parametrize("name, rows, span_s", [
    ("azure_llm_2023_conv.csv", 19_366, 3501.721937),
    ("azure_llm_2023_code.csv", 8_819, 3435.948056),
    ("mooncake_conversation.jsonl", 12_031, 3536.999),
])
def test_real_traces_load(name, rows, span_s):
    w = build_workload(WorkloadConfig(trace=SHARED / name), np.random.default_rng(0))
    assert len(w) == rows and w.arrival_s[0] == 0.0 and w.arrival_s[-1] == pytest.approx(span_s, abs=1e-6)
    assert np.all(np.diff(w.arrival_s) >= 0)
    assert w.prompt_tokens.min() >= 1 and w.output_tokens.min() >= 1



def test_a_mooncake_jsonls_block_ids_take_hash_block_tokens(tmp_path):
    """A JSONL's hash_ids are blocks of workload.hash_block_tokens tokens, as a CSV's are (they were
    read as 512-token blocks whatever it said); more ids than the prompt has blocks is refused."""
    big = write(tmp_path, "big.jsonl", '{"timestamp": 0, "input_length": 1100, "output_length": 2, '
                                       '"hash_ids": [7, 8, 9]}\n')
    assert read_trace(big)["prefix"].tolist() == [((7, 8, 9), 512)]  # ceil(1100 / 512) = 3 blocks
    p = write(tmp_path, "m.jsonl", '{"timestamp": 0, "input_length": 40, "output_length": 2, "hash_ids": [7, 8, 9]}\n'
                                   '{"timestamp": 5, "input_length": 33, "output_length": 2, "hash_ids": [7, 8]}\n')
    assert read_trace(p, hash_block_tokens=16)["prefix"].tolist() == [((7, 8, 9), 16), ((7, 8), 16)]
    with pytest.raises(ScenarioError, match=r"m\.jsonl:1: hash_ids names 3 blocks of 512 tokens"):
        read_trace(p)  # at Mooncake's 512, a 40-token prompt has one block
    # 40 tokens are ceil(40 / 16) = 3 blocks of 16, ceil(40 / 32) = 2 of 32: three ids are too many
    with pytest.raises(ScenarioError, match=r"m\.jsonl:1: hash_ids names 3 blocks of 32 tokens, more than its "
                                            r"40-token prompt has \(2\)"):
        read_trace(p, hash_block_tokens=32)
