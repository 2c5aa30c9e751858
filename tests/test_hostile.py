"""Hostile and extreme inputs (issue 14): every case ends, within its time (and, where memory is
the attack, memory) limit, in a clean result or in exit 2 with one `error:` line, no traceback,
and nothing written."""
from __future__ import annotations

import json
import re
import resource
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cli import app
from sim.config.errors import ScenarioError
from sim.scenario import load_scenario
from sim.workload.traces import read_trace

ROOT = Path(__file__).resolve().parents[1]
QUICK = {"name": "h", "model": "llama-3-8b", "hardware": "h100-sxm", "cost_model": "roofline",
         "engine": {"scheduler": "chunked", "max_num_seqs": 16, "max_num_batched_tokens": 2048},
         "workload": {"arrival": {"process": "poisson", "rate": 5}, "num_requests": 20,
                      "prompt_tokens": {"dist": "fixed", "value": 64},
                      "output_tokens": {"dist": "fixed", "value": 8}}}
TIMEOUT_S = 60


MEMORY_HEADROOM = 3 << 30  # bytes of address space a case may add to what the process holds


@contextmanager
def time_limit(seconds: int):
    """A wall-clock limit (SIGALRM) and a memory limit (RLIMIT_AS: the address space in use now
    plus MEMORY_HEADROOM) around one in-process case; both are lifted afterwards."""
    def fire(*_):
        raise TimeoutError(f"no result within {seconds} s: a hang")
    old = signal.signal(signal.SIGALRM, fire)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (_address_space() + MEMORY_HEADROOM, hard))
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        signal.signal(signal.SIGALRM, old)


def _address_space() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 16 << 30


def with_(**changes) -> dict:
    raw = json.loads(json.dumps(QUICK))
    for path, value in changes.items():
        node, keys = raw, path.split("__")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return raw


def scenario_file(tmp: Path, raw=None, text: str | None = None) -> Path:
    p = tmp / "s.yaml"
    p.write_text(text if text is not None else yaml.safe_dump(raw))
    return p


def trace(tmp: Path, text: str, name: str = "t.csv") -> dict:
    p = tmp / name
    p.write_text(text)
    return {"trace": str(p)}


def assert_clean(result, out: Path | None, ok: bool) -> None:
    text = result.output
    assert "Traceback" not in text and "Error:" not in text.replace("error:", ""), text[-2000:]
    if ok:
        assert result.exit_code == 0, text[-2000:]
        return
    assert result.exit_code == 2, (result.exit_code, text[-2000:])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-2000:]
    if out is not None:
        assert not out.exists() or not any(out.iterdir()), list(out.iterdir())


# ---------------------------------------------------------------- run: scenario values

BIG = 10**5000  # (PyYAML refuses to build it: more than 4300 digits)
SCENARIO_CASES = {
    "fixed length 1e20": with_(workload__prompt_tokens={"dist": "fixed", "value": 10**20}),
    "lognormal std 1e300": with_(workload__prompt_tokens={"dist": "lognormal", "mean": 500, "std": 1e300}),
    "lognormal mean 1e300": with_(workload__output_tokens={"dist": "lognormal", "mean": 1e300, "std": 5}),
    "uniform high 1e12": with_(workload__prompt_tokens={"dist": "uniform", "low": 1, "high": 10**12}),
    "gamma cv 1e-200": with_(workload__arrival={"process": "gamma", "rate": 5, "cv": 1e-200}),
    "gamma cv 1e200": with_(workload__arrival={"process": "gamma", "rate": 5, "cv": 1e200}),
    "rate 5e-324": with_(workload__arrival={"process": "poisson", "rate": 5e-324}),
    "rate 1e300": with_(workload__arrival={"process": "poisson", "rate": 1e300}),
    "rate x requests span 1e12 s": with_(workload__arrival={"process": "constant", "rate": 1e-5},
                                         workload__num_requests=10**8),
    "num_requests 1e20": with_(workload__num_requests=10**20),
    "time_scale 1e-300": with_(workload__time_scale=1e-300),
    "time_scale 1e300": with_(workload__time_scale=1e300),
    "burst at 1e300": with_(workload__arrival={"process": "burst", "at": 1e300}),
    "closed loop think 1e300": with_(workload__arrival={"process": "closed_loop", "users": 4,
                                                        "think_time": 1e300}),
    "closed loop users 1e12": with_(workload__arrival={"process": "closed_loop", "users": 10**12,
                                                       "think_time": 1}),
    "num_gpu_blocks 1e20": with_(engine__num_gpu_blocks=10**20),
    "max_num_seqs 1e20": with_(engine__max_num_seqs=10**20),
    "max_num_batched_tokens 1e15": with_(engine__max_num_batched_tokens=10**15),
    "replicas 1e7": with_(engine__replicas=10**7),
    "replicas 1e6": with_(engine__replicas=10**6),
    "tensor_parallel_size 1e7": with_(engine__tensor_parallel_size=10**7),
    "block_size 0": with_(engine__block_size=0),
    "batch_timeout_s 1e300": with_(engine__batch_timeout_s=1e300),
    "gpu_memory_utilization nan": with_(engine__gpu_memory_utilization=float("nan")),
    "memory_bytes inf": with_(hardware={"memory_bytes": float("inf"), "hbm_bandwidth": 3e12,
                                        "bf16_flops": 1e15}),
    "memory_bytes 1e300": with_(hardware={"memory_bytes": 1e300, "hbm_bandwidth": 3e12, "bf16_flops": 1e15}),
    "bf16_flops inf": with_(hardware={"memory_bytes": 8e10, "hbm_bandwidth": 3e12, "bf16_flops": float("inf")}),
    "num_layers 1e9": with_(model={"num_layers": 10**9, "hidden_size": 64, "num_attention_heads": 4,
                                   "intermediate_size": 128, "vocab_size": 256}),
    "vocab 1e12": with_(model={"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                               "intermediate_size": 128, "vocab_size": 10**12}),
    "overhead_s 1e308": with_(cost_model={"roofline": {"overhead_s": 1e308}}),
    "overhead_s -1": with_(cost_model={"roofline": {"overhead_s": -1}}),
    "cpu_overhead_s 1e9": with_(cost_model={"measured": {"cpu_overhead_s": 1e9}}),
    "slo ttft 1e308": with_(slo={"ttft_ms": 1e308}),
    "link bandwidth 1e-300": with_(engine__disaggregation={"prefill_replicas": 1, "decode_replicas": 1,
                                                           "link": {"bandwidth_gbps": 1e-300}}),
    "slo percentile nan": with_(slo={"ttft_ms": 5, "percentile": float("nan")}),
    "name with path traversal": with_(name="../../etc"),
    "name unicode": with_(name="ünïcødé"),
    "top-level list": [1, 2, 3],
    "model as a number": with_(model=7),
}


@pytest.mark.parametrize("raw", SCENARIO_CASES.values(), ids=SCENARIO_CASES.keys())
def test_run_refuses_extreme_values(tmp_path, raw):
    out = tmp_path / "out"
    with time_limit(TIMEOUT_S):
        r = CliRunner().invoke(app, ["run", str(scenario_file(tmp_path, raw)), "--out", str(out), "-q"])
    assert_clean(r, out, ok=False)


TEXT_CASES = {
    "YAML alias bomb": "a: &a [x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
                       "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
                       "model: llama-3-8b\n",
    "5000-digit integer": "seed: " + "9" * 5000 + "\n",
    "5000-deep nesting": "a: " + "[" * 5000 + "]" * 5000 + "\n",
    "python tag": "model: !!python/object/apply:os.system ['true']\n",
    "duplicate key": yaml.safe_dump(QUICK) + "seed: 3\nseed: 4\n",
    "binary bytes": "\x00\x01\x02garbage",
    "malformed": "model: [llama\n",
    "empty": "",
}


@pytest.mark.parametrize("text", TEXT_CASES.values(), ids=TEXT_CASES.keys())
def test_run_refuses_hostile_yaml(tmp_path, text):
    out = tmp_path / "out"
    with time_limit(TIMEOUT_S):
        r = CliRunner().invoke(app, ["run", str(scenario_file(tmp_path, text=text)), "--out", str(out)])
    assert_clean(r, out, ok=False)


def _trace_case(text, name="t.csv", ok=False):
    return lambda tmp: (with_(workload=trace(tmp, text, name)), ok)


TRACE_CASES = {
    "prompt 1e20": _trace_case("arrival_s,prompt_tokens,output_tokens\n0,100000000000000000000,5\n"),
    "output 1e20": _trace_case("arrival_s,prompt_tokens,output_tokens\n0,5,1e20\n"),
    "arrival 1e300": _trace_case("arrival_s,prompt_tokens,output_tokens\n0,5,5\n1e300,5,5\n"),
    "arrival -1": _trace_case("arrival_s,prompt_tokens,output_tokens\n-1,5,5\n"),
    "arrival inf": _trace_case("arrival_s,prompt_tokens,output_tokens\ninf,5,5\n"),
    "no rows": _trace_case("arrival_s,prompt_tokens,output_tokens\n"),
    "mooncake deep nesting": _trace_case('{"timestamp": 0, "input_length": 5, "output_length": 5, "x": '
                                         + "[" * 5000 + "]" * 5000 + "}\n", "t.jsonl"),
    "mooncake timestamp 1e300": _trace_case('{"timestamp": 1e300, "input_length": 5, "output_length": 5}\n',
                                            "t.jsonl"),
    "azure mixed time zones": _trace_case(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68+00:00,10,5\n"
        "2023-11-16 18:15:47.00+05:00,10,5\n2023-11-16 18:15:48.00,10,5\n"),
    "BOM, CRLF, unsorted (fine)": _trace_case(
        "\ufeffarrival_s,prompt_tokens,output_tokens\r\n1.5,30,4\r\n0.5,20,3\r\n", ok=True),
    # a vLLM log line of repeated logger fragments (no max_tokens): one regex with two lazy `.*?`
    # took minutes on it; and a max_tokens of 5000 digits
    "vLLM log: 120 KB line of fragments": _trace_case(
        "INFO 11-24 06:48:39 Received request r: params: SamplingParams(" * 1900 + "\n", "v.log"),
    "vLLM log: 5000-digit max_tokens": _trace_case(
        "INFO 11-24 06:48:39 Received request r: params: SamplingParams(n=1, max_tokens=" + "9" * 5000 + ")\n",
        "v.log"),
    "5000-digit int in a Mooncake trace": _trace_case(
        '{"timestamp": 0, "input_length": ' + "9" * 5000 + ', "output_length": 5}\n', "t.jsonl"),
    # bounds on the times the simulation uses, after time_scale (each within its own bound before)
    "time_scale 1e-6 of a 1e4 s trace": lambda tmp: (
        with_(workload={**trace(tmp, "arrival_s,prompt_tokens,output_tokens\n0,5,5\n10000,5,5\n"),
                        "time_scale": 1e-6}), False),
    **{f"vllm bench {what}": (lambda doc: lambda tmp: (with_(workload=trace(
        tmp, json.dumps({"input_lens": [5, 6], "output_lens": [3, 3], **doc}), "b.json")), False))(doc)  # noqa: B023
       for what, doc in (("request_rate 0", {"request_rate": 0}), ("request_rate -3", {"request_rate": -3}),
                         ("request_rate 1e300", {"request_rate": 1e300}),
                         ("request_rate true", {"request_rate": True}),
                         ("burstiness text", {"request_rate": 2, "burstiness": "lots"}),
                         ("burstiness -1", {"request_rate": 2, "burstiness": -1}))},
}


@pytest.mark.parametrize("case", TRACE_CASES.values(), ids=TRACE_CASES.keys())
def test_run_refuses_hostile_traces(tmp_path, case):
    raw, ok = case(tmp_path)
    out = tmp_path / "out"
    with time_limit(TIMEOUT_S):
        r = CliRunner().invoke(app, ["run", str(scenario_file(tmp_path, raw)), "--out", str(out), "-q"])
    assert_clean(r, None if ok else out, ok=ok)


def test_hf_config_with_a_list_dtype_and_a_binary_profile_are_refused(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                               "intermediate_size": 128, "vocab_size": 256, "torch_dtype": ["bf16"]}))
    prof = tmp_path / "p.yaml"
    prof.write_bytes(b"\x00\xff\xfe binary")
    for raw in (with_(model={"hf_config": str(cfg)}), with_(cost_model={"profile": str(prof)})):
        r = CliRunner().invoke(app, ["run", str(scenario_file(tmp_path, raw)), "--out", str(tmp_path / "o")])
        assert_clean(r, tmp_path / "o", ok=False)


def test_a_warning_about_an_input_later_found_bad_is_not_printed_before_its_error(tmp_path):
    """A Qwen3.5 config warns that its vision encoder is not counted; with a bad field further on,
    loading it raises the one error and shows no warning. Valid, the warning is shown."""
    import warnings

    cfg = json.loads((ROOT / "tests/fixtures/hf_configs/Qwen--Qwen3.5-27B.json").read_text())
    (tmp_path / "good.json").write_text(json.dumps(cfg))
    cfg["text_config"]["linear_num_key_heads"] = 0
    (tmp_path / "bad.json").write_text(json.dumps(cfg))
    for name, bad in (("bad", True), ("good", False)):
        path = scenario_file(tmp_path, with_(model={"hf_config": str(tmp_path / f"{name}.json")},
                                             engine__tensor_parallel_size=2))
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            if bad:
                with pytest.raises(ScenarioError, match="linear_num_key_heads: 0 is not an integer >= 1"):
                    load_scenario(path)
            else:
                load_scenario(path)
        shown = [str(w.message) for w in seen]
        assert shown == ([] if bad else [f"{tmp_path / 'good.json'}: qwen3_5: the text decoder is sized and "
                                         "priced; the vision encoder (vision_config: about 1% of Llama 4's and "
                                         "Qwen3.5's weights, 0.4 B parameters in Gemma 3's) is not counted"])


# ---------------------------------------------------------------- other commands

def _sweep(tmp, *extra):
    return ["sweep", str(scenario_file(tmp, QUICK)), "--out", str(tmp / "out"), *extra]


OTHER_CASES = {
    "sweep --repeats 1e8": lambda t: _sweep(t, "--grid", "engine.max_num_seqs=8", "--repeats", "1e8"),
    "sweep --repeats 100000000": lambda t: _sweep(t, "--grid", "engine.max_num_seqs=8", "--repeats", "100000000"),
    "sweep 40,000-point grid": lambda t: _sweep(t, "--grid", "engine.max_num_seqs=" + ",".join(map(str, range(1, 201))),
                                                "--grid", "workload.arrival.rate=" + ",".join(map(str, range(1, 201)))),
    "sweep grid alias": lambda t: _sweep(t, "--grid", "engine.max_num_seqs=*a"),
    "sweep --workers 0": lambda t: _sweep(t, "--grid", "engine.max_num_seqs=8", "--workers", "0"),
    "sweep --set 5000 digits": lambda t: _sweep(t, "--grid", "engine.max_num_seqs=8", "--set", "seed=" + "9" * 5000),
    "sweep --grid 5000 digits": lambda t: _sweep(t, "--grid", "engine.max_num_seqs=" + "9" * 5000),
    "plan --slo inf": lambda t: ["plan", str(scenario_file(t, QUICK)), "--slo", "ttft_ms=inf", "--out", str(t / "out")],
    "plan --slo 5000 digits": lambda t: ["plan", str(scenario_file(t, QUICK)), "--slo", "ttft_ms=" + "9" * 5000,
                                         "--out", str(t / "out")],
    "plan --target-rate 1e308": lambda t: ["plan", str(scenario_file(t, QUICK)), "--slo", "ttft_ms=500",
                                           "--target-rate", "1e308", "--out", str(t / "out")],
    "capacity --tp 1e9": lambda t: ["capacity", "--model", "llama-3-8b", "--gpu", "h100-sxm", "--tp", "1000000000"],
    "capacity --seq-len 1e12": lambda t: ["capacity", "--model", "llama-3-8b", "--gpu", "h100-sxm",
                                          "--seq-len", "1000000000000"],
    "capacity --gpu-memory-utilization nan": lambda t: ["capacity", "--model", "llama-3-8b", "--gpu", "h100-sxm",
                                                        "--gpu-memory-utilization", "nan"],
    "run --set alias": lambda t: ["run", str(scenario_file(t, QUICK)), "--set", "seed=*a", "--out", str(t / "out")],
    "run --seed -1": lambda t: ["run", str(scenario_file(t, QUICK)), "--seed", "-1", "--out", str(t / "out")],
    "run scenario is a folder": lambda t: ["run", str(t), "--out", str(t / "out")],
    "run scenario /dev/zero": lambda t: ["run", "/dev/zero", "--out", str(t / "out")],
    "calibrate --from-tables missing": lambda t: ["calibrate", "--from-tables", str(t / "nope"), "--model",
                                                  "llama-3-8b", "--gpu", "h100-sxm", "--out", str(t / "p.yaml")],
    "calibrate --from-tables tp 3": lambda t: ["calibrate", "--from-tables", str(ROOT / "sim/tables/h100_sxm"),
                                               "--model", "llama-3-8b", "--gpu", "h100-sxm", "--tp", "3",
                                               "--out", str(t / "p.yaml")],
    "calibrate --from-tables config /dev/zero": lambda t: [
        "calibrate", "--from-tables", str(ROOT / "sim/tables/h100_sxm"), "--model", "/dev/zero",
        "--gpu", "h100-sxm", "--out", str(t / "p.yaml")],
}


@pytest.mark.parametrize("args", OTHER_CASES.values(), ids=OTHER_CASES.keys())
def test_other_commands_refuse_hostile_options(tmp_path, args):
    argv = args(tmp_path)
    with time_limit(TIMEOUT_S):
        r = _invoke_entry(argv)
    assert_clean(r, tmp_path / "out", ok=False)


class _Result:
    def __init__(self, code, out, err):
        self.exit_code, self.stdout, self.stderr, self.output = code, out, err, out + err


def _invoke_entry(argv):
    """The console command itself (main_entry: usage errors in one line), in this process."""
    import contextlib
    import io

    from cli import main_entry

    out, err = io.StringIO(), io.StringIO()
    old = sys.argv
    sys.argv = ["servesim", *argv]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main_entry()
                code = 0
            except SystemExit as e:
                code = e.code
    finally:
        sys.argv = old
    return _Result(code, out.getvalue(), err.getvalue())


def _damaged(tmp: Path, what: str) -> Path:
    run = tmp / "run"
    r = CliRunner().invoke(app, ["run", str(scenario_file(tmp, QUICK)), "--out", str(run), "-q"])
    assert r.exit_code == 0
    if what == "truncated summary":
        (run / "summary.json").write_text('{"completed": 3, ')
    elif what == "no steps.csv":
        (run / "steps.csv").unlink()
    elif what == "binary requests.csv":
        (run / "requests.csv").write_bytes(b"\x00\x01\x02" * 100)
    elif what == "summary is a list":
        (run / "summary.json").write_text("[1, 2]")
    elif what in ("header-only requests.csv", "header-only steps.csv"):
        name = what.split()[1]
        (run / name).write_text((run / name).read_text().splitlines()[0] + "\n")
    elif what == "summary nested 100k deep":
        (run / "summary.json").write_text('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}")
    elif what == "text in requests.csv":
        (run / "requests.csv").write_text("hello world\n")
    elif what == "a string where a number belongs":
        lines = (run / "requests.csv").read_text().splitlines()
        cells = lines[2].split(",")
        cells[6] = "abc"
        lines[2] = ",".join(cells)
        (run / "requests.csv").write_text("\n".join(lines) + "\n")
    return run


DAMAGED = ["truncated summary", "no steps.csv", "binary requests.csv", "summary is a list",
           "header-only requests.csv", "header-only steps.csv", "text in requests.csv",
           "a string where a number belongs", "summary nested 100k deep"]


@pytest.mark.parametrize("command", ["plot", "report", "export"])
@pytest.mark.parametrize("what", DAMAGED)
def test_a_damaged_run_folder_is_one_error_line(tmp_path, what, command):
    run = _damaged(tmp_path, what)
    args = {"plot": ["plot", str(run), "--out", str(tmp_path / "out")], "report": ["report", str(run)],
            "export": ["export", str(run), "--to", "vllm-bench", "--out", str(tmp_path / "out" / "b.json")]}
    with time_limit(TIMEOUT_S):
        r = _invoke_entry(args[command])
    assert_clean(r, tmp_path / "out", ok=False)


@pytest.fixture(scope="module")
def written_plans(tmp_path_factory) -> dict[str, Path]:
    """A plan folder and a configuration search folder, as servesim writes them (small: the
    200-request trace replay, one GPU)."""
    tmp = tmp_path_factory.mktemp("plans")
    short = ROOT / "scenarios" / "short-trace-replay.yaml"
    folders = {"plan": tmp / "plan", "search": tmp / "search"}
    for kind, extra in (("plan", ["--target-rate", "5"]), ("search", ["--gpus", "h100-sxm", "--target-rate", "5"])):
        r = CliRunner().invoke(app, ["plan", str(short), "--slo", "ttft_ms=2000,tpot_ms=50", "--no-band",
                                     "--resolution", "0.1", "--out", str(folders[kind]), "-q", *extra])
        assert r.exit_code == 0, r.output
    return folders


EDITS = {  # a hand edit of plan.json / search.json, as a user might leave one
    ("plan", "a section replaced by text"): lambda r: r.update(load_search="x"),
    ("plan", "the answer's key gone"): lambda r: r.pop("recommendation"),
    ("plan", "a curve point without its numbers"): lambda r: r["load_search"].update(curve=[{"load": "a"}]),
    ("plan", "the slo a number"): lambda r: r.update(slo=7),
    ("search", "a candidate without its gpu"): lambda r: r["candidates"][0].pop("gpu"),
    ("search", "candidates a string"): lambda r: r.update(candidates="x"),
    ("search", "the target text"): lambda r: r.update(target="abc"),
    ("search", "slo targets without a percentile"): lambda r: r.update(slo_targets={"ttft_ms": "x"}),
}


@pytest.mark.parametrize("command", ["plot", "report"])
@pytest.mark.parametrize("kind, edit", list(EDITS))
def test_an_edited_plan_or_search_is_one_error_line_naming_the_file(tmp_path, written_plans, kind, edit, command):
    """Figures and tables read a plan's JSON as servesim wrote it: edited, they ended in tracebacks
    (KeyError, TypeError deep in a figure); now one line naming the file, exit 2."""
    import shutil

    folder = tmp_path / kind
    shutil.copytree(written_plans[kind], folder)
    doc = folder / f"{kind}.json"
    r = json.loads(doc.read_text())
    EDITS[kind, edit](r)
    doc.write_text(json.dumps(r))
    args = ["plot", str(folder), "--out", str(tmp_path / "out")] if command == "plot" else ["report", str(folder)]
    with time_limit(TIMEOUT_S):
        res = _invoke_entry(args)
    if (command, edit) == ("plot", "the answer's key gone"):  # (the figures never read the answer)
        assert_clean(res, None, ok=True)
        return
    assert_clean(res, tmp_path / "out", ok=False)
    assert res.stderr.startswith(f"error: {doc}: not a ") and "as servesim writes it" in res.stderr, res.stderr
    assert not (folder / "report.html").exists()


# ---------------------------------------------------------------- outputs

def test_summary_is_strict_json_and_counts_are_never_negative(tmp_path):
    out = tmp_path / "out"
    raw = with_(engine__num_gpu_blocks=10**8)  # large but allowed
    r = CliRunner().invoke(app, ["run", str(scenario_file(tmp_path, raw)), "--out", str(out), "-q"])
    assert r.exit_code == 0, r.output
    text = (out / "summary.json").read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    import pandas as pd

    steps = pd.read_csv(out / "steps.csv")
    assert (steps[["kv_blocks_used", "kv_blocks_total", "num_seqs", "count"]] >= 0).all().all()
    rq = pd.read_csv(out / "requests.csv")
    assert (rq.loc[rq["output_tokens"] > 1, "e2el_s"] > 0).all()


# ---------------------------------------------------------------- resources (subprocesses)

def _limited(argv, *, mem_bytes=3 << 30, timeout=TIMEOUT_S):
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
    code = "import sys; from cli import main_entry; sys.argv = ['servesim'] + sys.argv[1:]; main_entry()"
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                       timeout=timeout, preexec_fn=limit, cwd=ROOT)
    return _Result(p.returncode, p.stdout, p.stderr), time.monotonic() - t0


RESOURCE_CASES = {
    "1e8 requests (memory estimate)": lambda t: ["run", str(scenario_file(t, with_(workload__num_requests=10**8))),
                                                 "--out", str(t / "out")],
    "alias bomb": lambda t: ["run", str(scenario_file(t, text=TEXT_CASES["YAML alias bomb"])), "--out", str(t / "out")],
    "/dev/zero scenario": lambda t: ["run", "/dev/zero", "--out", str(t / "out")],
    "/dev/zero HF config": lambda t: ["run", str(scenario_file(t, with_(model={"hf_config": "/dev/zero"}))),
                                      "--out", str(t / "out")],
    "/dev/zero profile": lambda t: ["run", str(scenario_file(t, with_(cost_model={"profile": "/dev/zero"}))),
                                    "--out", str(t / "out")],
    "/dev/zero trace": lambda t: ["run", str(scenario_file(t, with_(workload={"trace": "/dev/zero"}))),
                                  "--out", str(t / "out")],
}


@pytest.mark.parametrize("args", RESOURCE_CASES.values(), ids=RESOURCE_CASES.keys())
def test_resource_attacks_are_refused_up_front(tmp_path, args):
    r, took = _limited(args(tmp_path))
    assert_clean(r, tmp_path / "out", ok=False)
    assert took < 30


def test_sigkill_of_a_sweep_leaves_no_worker(tmp_path):
    sc = scenario_file(tmp_path, with_(workload__num_requests=3000))
    code = "import sys; from cli import main_entry; sys.argv = ['servesim'] + sys.argv[1:]; main_entry()"
    p = subprocess.Popen([sys.executable, "-c", code, "sweep", str(sc), "--grid",
                          "engine.max_num_seqs=8,16,32,64,128,256", "--workers", "2", "--out",
                          str(tmp_path / "out"), "-q"], cwd=ROOT, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    children: set[int] = set()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(children) < 2:
        children = _children(p.pid)
        time.sleep(0.1)
    assert len(children) >= 2, "the sweep never started its workers"
    p.send_signal(signal.SIGKILL)
    p.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(c) for c in children):
        time.sleep(0.1)
    assert not any(_alive(c) for c in children), "a worker outlived its killed parent"


def _children(pid: int) -> set[int]:
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.add(int(d.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# ---------------------------------------------------------------- fuzzing

VALID = yaml.safe_dump(QUICK)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_fuzz_scenario_loader(tmp_path, data):
    """Random edits of a valid scenario: a Scenario or a ScenarioError, nothing else."""
    text = VALID
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(text)))
        j = data.draw(st.integers(i, min(len(text), i + 8)))
        text = text[:i] + data.draw(st.text(alphabet=st.sampled_from(list("0123456789.e-+:[]{}&*!,# \n\tabx\"'")),
                                            max_size=8)) + text[j:]
    path = tmp_path / "f.yaml"
    path.write_text(text)
    with time_limit(20):
        try:
            load_scenario(path)
        except ScenarioError as e:
            assert "\n" not in str(e)


CSV = "arrival_s,prompt_tokens,output_tokens\n0,10,5\n0.5,200,30\n1.25,31,2\n"
JSONL = '{"timestamp": 0, "input_length": 10, "output_length": 5}\n{"timestamp": 20, "input_length": 7, "output_length": 9}\n'


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from([("t.csv", CSV), ("t.jsonl", JSONL)]), st.data())
def test_fuzz_trace_readers(tmp_path, source, data):
    name, text = source
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(text)))
        j = data.draw(st.integers(i, min(len(text), i + 6)))
        text = text[:i] + data.draw(st.text(alphabet=st.sampled_from(list('0123456789.e-+,{}[]":nulaINF \n')),
                                            max_size=8)) + text[j:]
    path = tmp_path / name
    path.write_text(text)
    with time_limit(20):
        try:
            table = read_trace(path)
        except ScenarioError as e:
            assert "\n" not in str(e)
            return
    assert (table["prompt_tokens"] >= 1).all() and (table["output_tokens"] >= 1).all()
    assert (table["arrival_s"] >= 0).all()


def test_signals_wait_for_the_renames_and_then_act_even_from_another_thread():
    """A SIGTERM sent while a run's files are renamed into place acts after the last rename, also
    when another thread of the process takes it (as pyarrow's and OpenBLAS's workers may)."""
    import threading

    from sim.files import signals_held
    seen: list[str] = []
    old = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append("handled"))
    go, done = threading.Event(), threading.Event()

    def worker():  # started before the renames, like a pool's thread: SIGTERM not blocked in it
        go.wait()
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # the C handler runs here
        done.set()
    t = threading.Thread(target=worker)
    t.start()
    try:
        with signals_held():
            go.set()
            done.wait()
            for _ in range(10000):  # bytecodes run: an unheld Python handler would have run by now
                pass
            seen.append("renamed")
        assert seen == ["renamed", "handled"]
    finally:
        t.join()
        signal.signal(signal.SIGTERM, old)


# The child CLI signals itself at a chosen moment, a given point in the run rather than after a
# sleep: a timed signal raced the run on a faster machine (it finished, wrote, then was signalled).
_SELF_SIGNAL = """
import os, sys
import cli, sim.simulate
from sim.reporting import progress
SIG, AT = int(sys.argv[1]), sys.argv[2]
if AT == "mid-run":  # once 1000 requests are done (the progress hook is called even under -q)
    shown = progress.Progress.__call__
    def call(self, done, total=None, phase=None):
        if done >= 1000:
            os.kill(os.getpid(), SIG)
        return shown(self, done, total, phase)
    progress.Progress.__call__ = call
else:  # "renaming": as the first of the run's files is renamed into place
    rename = os.replace
    def replace(src, dst):
        os.kill(os.getpid(), SIG)
        return rename(src, dst)
    sim.simulate.os = type(os)("os_with_signal")
    sim.simulate.os.__dict__.update(os.__dict__, replace=replace)
sys.argv = ["servesim"] + sys.argv[3:]
cli.main_entry()
"""


def _default_signals() -> None:
    """In the child: SIGINT and SIGTERM handled as a terminal's Ctrl-C and a kill would be. A job
    started with `&` by a non-interactive shell (`nohup pytest &`) ignores SIGINT, and its children
    inherit that: Python then never raises KeyboardInterrupt, and these tests would test nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _signalled_run(sig: int, at: str, args: list[str]) -> tuple[int, str]:
    p = subprocess.run([sys.executable, "-c", _SELF_SIGNAL, str(int(sig)), at, *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=120, preexec_fn=_default_signals)
    return p.returncode, p.stderr


def _an_earlier_run(tmp_path: Path) -> tuple[Path, Path, dict[str, bytes]]:
    """A small run written to tmp_path/out: (that folder, its scenario, its files' bytes)."""
    out = tmp_path / "out"
    small = scenario_file(tmp_path, QUICK)
    r, _ = _limited(["run", str(small), "--out", str(out), "-q"])
    assert r.exit_code == 0
    return out, small, {p.name: p.read_bytes() for p in out.iterdir()}


def test_an_agent_fan_out_beyond_the_ulimit_is_refused_up_front_naming_fan_out(tmp_path):
    """10 sessions x 3 steps x fan_out 100,000 = 3,000,000 calls (~3.2 GB, 1 KB each measured) under
    a 2 GB address-space limit: one line naming workload.arrival.fan_out and the ulimit, before any
    simulating (it used to run for minutes, then die of MemoryError)."""
    sc = with_(workload={"arrival": {"process": "agents", "rate": 0.5, "sessions": 10, "steps": 3,
                                     "tool_time": 1.0, "fan_out": 100_000},
                         "prompt_tokens": {"dist": "fixed", "value": 100},
                         "output_tokens": {"dist": "fixed", "value": 10}})
    sc["workload"].pop("num_requests", None)
    r, took = _limited(["run", str(scenario_file(tmp_path, sc)), "--out", str(tmp_path / "out")],
                       mem_bytes=2 << 30)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.exit_code == 2 and len(lines) == 1, r.stderr
    assert "workload.arrival.fan_out: 10 sessions' calls, 3,000,000 requests on average" in lines[0]
    assert "ulimit -v" in lines[0] and took < 60
    assert not (tmp_path / "out").exists()


def test_a_long_trace_with_a_bad_last_line_is_one_error_line(tmp_path):
    """300,000 good rows, then a bad one: pandas read such a file in chunks and printed a
    DtypeWarning (two more stderr lines) before servesim's error; one line, naming the line."""
    rows = "".join(f"{i * 0.01:g},{100 + i % 50},20\n" for i in range(300_000))
    t = tmp_path / "long.csv"
    t.write_text("arrival_s,prompt_tokens,output_tokens\n" + rows + "abc,1,2\n")
    r, _ = _limited(["run", str(scenario_file(tmp_path, with_(workload={"trace": str(t)}))),
                     "--out", str(tmp_path / "out")])
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.exit_code == 2 and lines == [f"error: {t}:300002: arrival_s 'abc' is not a non-negative number"], r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_mid_run_writes_nothing_and_keeps_the_earlier_run(tmp_path, sig, code):
    out, _, before = _an_earlier_run(tmp_path)
    big = tmp_path / "big.yaml"
    big.write_text(yaml.safe_dump(with_(workload__num_requests=20_000)))
    returncode, stderr = _signalled_run(sig, "mid-run", ["run", str(big), "--out", str(out), "-q"])
    assert returncode == code, (returncode, stderr)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines == [f"error: interrupted; nothing was written to {out} (an earlier run there is untouched)"]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # untouched, no temporaries


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_during_the_renames_waits_for_them_and_says_the_run_was_written(tmp_path, sig, code):
    out, small, before = _an_earlier_run(tmp_path)
    again = tmp_path / "again"
    returncode, stderr = _signalled_run(sig, "renaming", ["run", str(small), "--out", str(out), "-q",
                                                          "--seed", "7", "--trace"])
    assert returncode == code, (returncode, stderr)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines == [f"error: interrupted, after the run was written in full to {out}; trace.json was not written"]
    r, _ = _limited(["run", str(small), "--out", str(again), "-q", "--seed", "7"])
    assert r.exit_code == 0
    after = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(after) == sorted(before)  # the four files, no temporaries, no trace.json
    assert after == {p.name: p.read_bytes() for p in again.iterdir()} != before  # the seed-7 run, whole


def _peak_rss_kb(argv, tmp: Path) -> tuple[int, int, str]:
    """A CLI run in a child process: its exit code, its own peak RSS (KB: VmHWM, read by the child
    at exit; wait4's ru_maxrss would carry the forking test process's peak across exec) and its
    stderr."""
    hwm = tmp / "hwm.txt"
    code = ("import atexit, sys\n"
            "def hwm():\n"
            "    line = next(x for x in open('/proc/self/status') if x.startswith('VmHWM'))\n"
            f"    open({str(hwm)!r}, 'w').write(line.split()[1])\n"
            "atexit.register(hwm)\n"
            "from cli import main_entry; sys.argv = ['servesim'] + sys.argv[1:]; main_entry()")
    p = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)
    return p.returncode, int(hwm.read_text()) if hwm.exists() else -1, p.stderr


def test_one_very_long_request_finishes_in_seconds(tmp_path):
    """10M output tokens (the stated limit) on a tiny model: a long decode run's block counts were
    taken with numpy's take(mode="wrap"), quadratic in the run's length (3M tokens: 105 s)."""
    sc = scenario_file(tmp_path, with_(model="tiny", engine={"scheduler": "chunked"},
                                       workload__num_requests=1, workload__output_tokens={"dist": "fixed",
                                                                                          "value": 10_000_000}))
    t0 = time.monotonic()
    code, _, err = _peak_rss_kb(["run", str(sc), "--out", str(tmp_path / "out"), "-q"], tmp_path)
    assert code == 0, err
    assert time.monotonic() - t0 < 60, err


def test_a_tiny_model_on_a_big_gpu_does_not_allocate_per_block(tmp_path):
    """A 125M-parameter model on an H100 has ~19M KV blocks; prefix caching kept a list entry and a
    count per block (30 requests peaked at 921 MB). Now its bookkeeping grows with blocks in use."""
    sc = scenario_file(tmp_path, with_(model="tiny", engine={"scheduler": "chunked", "enable_prefix_caching": True},
                                       workload__num_requests=30))
    code, peak_kb, err = _peak_rss_kb(["run", str(sc), "--out", str(tmp_path / "out"), "-q"], tmp_path)
    assert code == 0, err
    assert peak_kb < 400_000, (peak_kb, err)


def test_the_resolved_scenario_repeats_the_run_whatever_its_path_and_set_text_hold(tmp_path):
    """scenario.yaml's header names the source path and the --set strings: a newline in either
    ended the comment and broke the file that promises to repeat the run."""
    folder = tmp_path / "new\nline"
    folder.mkdir()
    src = scenario_file(folder, QUICK)
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["run", str(src), "--set", "slo={ttft_ms: 500}\n", "--out", str(out), "-q"])
    assert r.exit_code == 0, r.output
    text = (out / "scenario.yaml").read_text()
    assert [line for line in text.splitlines() if line.startswith("#")] == text.splitlines()[:2]
    again = tmp_path / "again"
    r = CliRunner().invoke(app, ["run", str(out / "scenario.yaml"), "--out", str(again), "-q"])
    assert r.exit_code == 0, r.output
    assert (again / "requests.csv").read_bytes() == (out / "requests.csv").read_bytes()


@pytest.mark.parametrize("command", ["plot", "report", "sweep"])
def test_an_edited_sweep_table_is_one_error_line(tmp_path, command):
    """A results.csv whose metric holds text (edited by hand, or damaged): sweep's resume table,
    plot and report named the cell instead of a pandas TypeError."""
    sc = scenario_file(tmp_path, QUICK)
    out = tmp_path / "sweep"
    r = CliRunner().invoke(app, ["sweep", str(sc), "--grid", "engine.max_num_seqs=4,8", "--out", str(out), "-q"])
    assert r.exit_code == 0, r.output
    rows = (out / "results.csv").read_text().splitlines()
    col = rows[0].split(",").index("ttft_ms.p99")
    cells = rows[1].split(",")
    cells[col] = "oops"
    rows[1] = ",".join(cells)
    (out / "results.csv").write_text("\n".join(rows) + "\n")
    args = {"plot": ["plot", str(out)], "report": ["report", str(out)],
            "sweep": ["sweep", str(sc), "--grid", "engine.max_num_seqs=4,8", "--out", str(out)]}[command]
    r = _invoke_entry(args)
    assert_clean(r, None, ok=False)
    assert "results.csv: line 2, column ttft_ms.p99: 'oops' is not a number" in r.stderr


def test_a_profile_with_a_heldout_mape_of_100_percent_or_more_is_refused(tmp_path):
    """heldout_mape is a fraction: 5.0 (a percent written as one, or a fit 500% off) would make the
    plan's band steps 1 - 5.0 as long (none; it divided by zero); refused naming the key."""
    from sim.cost.registry import load_profile

    text = (ROOT / "tests/fixtures/vllm_bench_cpu/steps-profile.yaml").read_text()
    assert "heldout_mape: 0.166" in text
    (tmp_path / "ok.yaml").write_text(text)
    load_profile(tmp_path / "ok.yaml")
    (tmp_path / "bad.yaml").write_text(text.replace("heldout_mape: 0.166", "heldout_mape: 5.0"))
    with pytest.raises(ScenarioError, match=r"metadata\.heldout_mape: 5 is a fraction of the step time"):
        load_profile(tmp_path / "bad.yaml")


def test_running_out_of_memory_is_one_line_and_writes_nothing(tmp_path, monkeypatch):
    """A MemoryError anywhere in a command (here the simulation itself) ends in one line and exit 1,
    not a traceback; the run folder is not written."""
    import signal

    import sim.simulate

    def no_memory(*_a, **_k):
        raise MemoryError()
    monkeypatch.setattr(sim.simulate, "simulate", no_memory)
    before = signal.getsignal(signal.SIGTERM)
    try:
        r = _invoke_entry(["run", str(ROOT / "scenarios/quickstart.yaml"), "--out", str(tmp_path / "o"), "-q"])
    finally:
        signal.signal(signal.SIGTERM, before)
    assert r.exit_code == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == ["error: out of memory: this command needs more than the machine (or its "
                                             "ulimit) gives; fewer requests (workload.num_requests), a shorter trace "
                                             "or a smaller fan-out fit"]
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("key", ["hbm_bandwidth", "bf16_flops", "interconnect_bandwidth", "host_bandwidth",
                                 "network_bandwidth", "fp8_flops"])
def test_a_hardware_rate_far_below_any_processor_is_refused(tmp_path, key):
    """1e-300 bytes/s (or FLOP/s) ran to a clock of ~1e305 s with null latencies and exit 0; a
    rate under 1e3 per second is refused naming the key (0 stays: none or unknown, where optional)."""
    hw = {"name": "x", "memory_bytes": 80e9, "hbm_bandwidth": 3.35e12, "bf16_flops": 989e12, key: 1e-300}
    out = tmp_path / "o"
    r = CliRunner().invoke(app, ["run", str(scenario_file(tmp_path, with_(hardware=hw))), "--out", str(out), "-q"])
    assert_clean(r, out, ok=False)
    assert f"hardware.{key}: 1e-300 is below 1000 per second" in r.stderr


def test_a_run_whose_clock_runs_off_the_scale_is_refused_not_summarised(tmp_path):
    """A profile whose per-sequence term is 1e300 s (real: 5.6e-5 s) gave a duration of ~1e305 s and
    null percentiles with exit 0; the run stops with one line naming the likely cause, nothing written."""
    text = (ROOT / "tests/fixtures/vllm_bench_cpu/steps-profile.yaml").read_text()
    assert "  num_seqs: 5.550831503137811e-05" in text
    prof = tmp_path / "p.yaml"
    prof.write_text(text.replace("  num_seqs: 5.550831503137811e-05", "  num_seqs: 1.0e+300"))
    raw = with_(model={"hf_config": str(ROOT / "tests/fixtures/vllm_bench_cpu/config.json")},
                cost_model={"profile": str(prof)})
    out = tmp_path / "o"
    r = CliRunner().invoke(app, ["run", str(scenario_file(tmp_path, raw)), "--out", str(out), "-q"])
    assert_clean(r, out, ok=False)
    assert "the simulated clock reached" in r.stderr and "past 1e+12 s" in r.stderr


def test_lora_slots_too_big_for_the_gpu_blame_engine_lora(tmp_path):
    """1,000 adapter slots of rank 512 on Llama-3-8B take ~2.7 TB per GPU: refused naming
    engine.lora (it blamed the activation reserve); 20 slots fit beside the weights but leave the
    cache too small for the longest request: that refusal says engine.lora holds the memory."""
    out = tmp_path / "o"
    lora = {"max_loras": 1000, "max_lora_rank": 512}
    raw = with_(engine__lora=lora, workload__adapters={"count": 4, "share": 0.5})
    r = CliRunner().invoke(app, ["run", str(scenario_file(tmp_path, raw)), "--out", str(out), "-q"])
    assert_clean(r, out, ok=False)
    assert re.search(r"engine\.lora: 1000 adapter slots of rank 512 take [0-9,.]+ GB per GPU, more than the 72\.0 GB "
                     r"usable on h100-sxm; lower max_loras or max_lora_rank", r.stderr), r.stderr
    raw = with_(engine__lora={"max_loras": 20, "max_lora_rank": 512}, engine__max_num_batched_tokens=8192,
                workload__adapters={"count": 4, "share": 0.5}, workload__prompt_tokens={"dist": "fixed", "value": 4000})
    r = CliRunner().invoke(app, ["run", str(scenario_file(tmp_path, raw)), "--out", str(out), "-q"])
    assert_clean(r, out, ok=False)
    assert "engine.lora's adapter slots hold GPU memory beside the weights" in r.stderr


def test_a_binary_profile_names_cost_model_and_a_huge_resolution_names_itself(tmp_path):
    prof = tmp_path / "p.yaml"
    prof.write_bytes(b"\x00\xff\xfe binary")
    out = tmp_path / "o"
    r = CliRunner().invoke(app, ["run", str(scenario_file(tmp_path, with_(cost_model={"profile": str(prof)}))),
                                 "--out", str(out), "-q"])
    assert_clean(r, out, ok=False)
    assert f"cost_model.profile: {prof}: not a readable YAML file" in r.stderr
    r = CliRunner().invoke(app, ["plan", str(scenario_file(tmp_path, QUICK)), "--slo", "ttft_ms=500",
                                 "--resolution", "1e9", "--out", str(out)])
    assert_clean(r, out, ok=False)
    assert "--resolution: 1e+09 is not a fraction under 1" in r.stderr


@pytest.mark.parametrize("column, cell, says", [
    ("send_time_us", "abc", "blis.csv:2: send_time_us 'abc' is not a non-negative number (microseconds)"),
    ("first_chunk_time_us", "-5", "blis.csv:2: first_chunk_time_us '-5' is not a non-negative number"),
    ("last_chunk_time_us", "1732431234000000", "blis.csv:2: last_chunk_time_us '1732431234000000' is not at "
                                               "or after first_chunk_time_us"),
    ("output_tokens", "1.5", "blis.csv:2: output_tokens '1.5' is not a non-negative integer")])
def test_compare_with_a_damaged_blis_v2_trace_names_the_line(tmp_path, column, cell, says):
    """A BLIS trace v2 whose measured times hold text (or times out of order) was a ValueError
    traceback in `compare`; now the trace reader's own checks, naming the line and column, and
    the run folder is left as it was (no compare.json)."""
    rows = (ROOT / "scenarios" / "traces" / "blis_trace_v2.csv").read_text().splitlines()
    header = rows[0].split(",")
    first = rows[1].split(",")
    first[header.index(column)] = cell
    bad = tmp_path / "blis.csv"
    bad.write_text("\n".join([rows[0], ",".join(first), *rows[2:]]) + "\n")
    run = tmp_path / "run"
    assert CliRunner().invoke(app, ["run", str(scenario_file(tmp_path, QUICK)), "--out", str(run), "-q"]).exit_code == 0
    before = sorted(p.name for p in run.iterdir())
    r = CliRunner().invoke(app, ["compare", str(bad), str(run)])
    assert_clean(r, None, ok=False)
    assert says in r.stderr
    assert sorted(p.name for p in run.iterdir()) == before


@pytest.mark.parametrize("kind, breaks", [("plan", "sim.planning.plan_report.markdown"),
                                          ("search", "sim.planning.search_report.markdown")])
def test_a_plan_the_disk_cannot_hold_leaves_the_earlier_one_whole(tmp_path, written_plans, monkeypatch, kind, breaks):
    """A full disk while a plan's files were written left a new plan.json beside the earlier
    plan.md, and said only 'No space left on device'. Now the files land whole or not at all: the
    earlier plan stays as it was, no staging folder is left, and the line names the folder and
    what was kept (here the second file's write fails as a full disk's does: ENOSPC, no file named)."""
    import errno
    import shutil

    out = tmp_path / kind
    shutil.copytree(written_plans[kind], out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(breaks, full)
    short = ROOT / "scenarios" / "short-trace-replay.yaml"
    extra = ["--target-rate", "5"] if kind == "plan" else ["--gpus", "h100-sxm", "--target-rate", "5"]
    r = CliRunner().invoke(app, ["plan", str(short), "--slo", "ttft_ms=2000,tpot_ms=50", "--no-band",
                                 "--resolution", "0.1", "--out", str(out), "-q", *extra])
    assert r.exit_code == 1, r.output
    lines = [line for line in r.stderr.splitlines() if line.strip() and not line.startswith("note:")]
    assert lines == [f"error: {out}: No space left on device; no plan written: the simulations done are kept in "
                     f"{out / 'simulations.jsonl'}, and the same command resumes from them"], r.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # (the journal: every simulation was read back)


def test_a_run_or_sweep_the_disk_cannot_hold_names_its_folder(tmp_path, monkeypatch):
    """'error: No space left on device' named nothing (a write on a full disk names no file). A run
    names its folder and says the earlier run there is untouched; a sweep names its folder and
    says its finished runs are kept for the same command to resume."""
    import errno

    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    scn = scenario_file(tmp_path, QUICK)
    out = tmp_path / "run"
    assert CliRunner().invoke(app, ["run", str(scn), "--out", str(out), "-q"]).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with monkeypatch.context() as m:
        m.setattr("sim.simulate.write_csv", full)
        r = CliRunner().invoke(app, ["run", str(scn), "--out", str(out), "-q"])
    assert r.exit_code == 1 and r.stderr.splitlines() == [
        f"error: {out}: No space left on device; nothing was written (an earlier run there is untouched)"], r.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    sweep = tmp_path / "sweep"
    from sim.planning.sweep import ResultsTable
    real, calls = ResultsTable.append, []

    def full_after_one(self, row):
        calls.append(row)
        if len(calls) > 1:
            full()
        return real(self, row)
    monkeypatch.setattr("sim.planning.sweep.ResultsTable.append", full_after_one)
    r = CliRunner().invoke(app, ["sweep", str(scn), "--grid", "engine.max_num_seqs=8,16,32", "--out", str(sweep),
                                 "-q", "--workers", "1"])
    assert r.exit_code == 1 and r.stderr.splitlines() == [
        f"error: {sweep}: No space left on device; finished runs are kept in its results.csv: rerun the same "
        "command to resume"], r.stderr
    assert not (sweep / ".servesim.lock").exists()
