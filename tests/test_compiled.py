"""The mypyc-compiled simulator (setup.py) against its pure-Python source, the reference.

Every run below is simulated twice, here with the compiled modules and in a child process under
SERVESIM_PURE_PYTHON=1, and its requests.csv, steps.csv and summary.json must be the same bytes:
the compiled code keeps Python's arithmetic, order of operations and numpy calls, so not one float
may differ. The runs reach every compiled path: chunked and continuous batching with preemption
and prefix caching, static batching, live and closed-loop routing over several replicas, multi-turn
sessions, speculative decoding, disaggregated pools, a sliding-window model, stepping without
fast-forward, an autoscaled fleet.

    python tests/test_compiled.py OUT   # (the child: writes each run's files under OUT)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
S = ROOT / "scenarios"

RUNS = {
    # chunked, prefix caching on its own blocks, a cache small enough to preempt
    "chunked-preempting": ("chat-llama3-8b-h100.yaml", ["workload.num_requests=400", "engine.num_gpu_blocks=700"]),
    "continuous": ("chat-continuous.yaml", ["workload.num_requests=300"]),
    "static": ("chat-static.yaml", ["workload.num_requests=200"]),
    "three-replicas-prefix-aware": ("chat-2x-least-loaded.yaml", [
        "workload.num_requests=600", "engine.replicas=3", "engine.router=prefix_aware"]),
    "closed-loop": ("closed-loop-llama3-8b-h100.yaml", []),
    "multi-turn-preempting": ("multi-turn-chat-llama3-8b-h100.yaml", ["engine.num_gpu_blocks=600"]),
    "speculative": ("chat-chunked.yaml", [
        "workload.num_requests=300",
        "engine.speculative={method: eagle, num_speculative_tokens: 3, acceptance_rate: 0.7}"]),
    "disaggregated": ("chat-chunked.yaml", [
        "workload.num_requests=300", "engine.disaggregation={prefill_replicas: 1, decode_replicas: 2}"]),
    "sliding-window": ("chat-chunked.yaml", ["workload.num_requests=300", "model=mistral-7b",
                                             "engine.num_gpu_blocks=2000"]),
    "sjf-stepped": ("chat-chunked.yaml", ["workload.num_requests=150", "engine.policy=sjf"]),
    # replicas started and drained during the run, routed live among those serving
    "autoscaled": ("chat-chunked.yaml", [
        "workload.num_requests=400", "engine.router=least_loaded", "workload.arrival.rate=12",
        "engine.autoscaling={max_replicas: 3, target_in_flight: 6, interval_s: 2, cold_start_s: 3, "
        "scale_down_delay_s: 4}"]),
}
NO_FAST_FORWARD = {"sjf-stepped"}

# `SERVESIM_PURE_PYTHON=1 pytest` runs the whole suite on the source: nothing compiled to test here
pytestmark = pytest.mark.skipif(bool(os.environ.get("SERVESIM_PURE_PYTHON")),
                                reason="SERVESIM_PURE_PYTHON=1: the compiled simulator is not in use")


def write_runs(out: Path) -> None:
    """Simulate every run and write its files under out/NAME (both processes call this)."""
    from sim.scenario import load_scenario
    from sim.simulate import simulate, write_outputs

    for name, (path, overrides) in RUNS.items():
        scenario = load_scenario(S / path, overrides=overrides)
        result = simulate(scenario, fast_forward=name not in NO_FAST_FORWARD)
        write_outputs(result, out / name)


def test_the_install_compiled_the_simulator():
    import sim

    assert sim.compiled(), (
        "the simulator runs as pure Python: `pip install -e .` compiles it (setup.py; it needs a C "
        "compiler), and must run again after a compiled module is edited")


def test_compiled_and_pure_python_write_the_same_bytes(tmp_path):
    import sim

    assert sim.compiled()
    write_runs(tmp_path / "compiled")
    env = {**os.environ, "SERVESIM_PURE_PYTHON": "1"}
    child = subprocess.run([sys.executable, __file__, str(tmp_path / "pure")], cwd=ROOT, env=env,
                           capture_output=True, text=True)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "pure Python"
    for name in RUNS:
        for f in ("requests.csv", "steps.csv", "summary.json"):
            compiled = (tmp_path / "compiled" / name / f).read_bytes()
            assert compiled == (tmp_path / "pure" / name / f).read_bytes(), f"{name}/{f}"
    # the paths meant to be reached were: preemption, prefix hits, runs fast-forwarded and not
    summary = {name: json.loads((tmp_path / "compiled" / name / "summary.json").read_text()) for name in RUNS}
    assert summary["chunked-preempting"]["preemptions"] > 0
    assert summary["multi-turn-preempting"]["preemptions"] > 0
    assert summary["multi-turn-preempting"]["prefix_cache_hit_rate"] > 0
    actions = {e["action"] for e in summary["autoscaled"]["autoscaling"]["events"]}
    assert {"started", "draining"} <= actions
    rows = {name: (tmp_path / "compiled" / name / "steps.csv").read_text().count("\n") - 1 for name in RUNS}
    assert rows["sjf-stepped"] == summary["sjf-stepped"]["iterations"]
    assert rows["chunked-preempting"] < summary["chunked-preempting"]["iterations"] / 5


def test_pure_python_mode_imports_no_extension():
    code = ("import sys, sim, sim.simulate; "
            "print(sorted(m for m, mod in sys.modules.items() if m.startswith('sim') "
            "and not getattr(mod, '__file__', '.py').endswith('.py')))")
    env = {**os.environ, "SERVESIM_PURE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_an_edited_compiled_module_is_found_by_its_digest(tmp_path):
    import hashlib

    from sim import _edited

    source = tmp_path / "sim" / "runtime" / "engine.py"
    source.parent.mkdir(parents=True)
    source.write_text("x = 1\n")
    digests = {"sim/runtime/engine.py": hashlib.sha256(b"x = 1\n").hexdigest()}
    assert _edited(tmp_path, digests) is None
    source.write_text("x = 2\n")  # edited since the build: its extension would be stale
    assert _edited(tmp_path, digests) == "sim/runtime/engine.py"
    source.unlink()
    assert _edited(tmp_path, digests) == "sim/runtime/engine.py"


def test_the_installed_digests_match_the_sources():
    """What made the compiled simulator run here: setup.py's record equals the sources."""
    from sim import _edited
    from sim._compiled_sources import SHA256

    assert {"sim/runtime/engine.py", "sim/schedulers/iteration_level.py", "sim/cost/step_cost.py"} <= set(SHA256) \
        and _edited() is None


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    import sim

    write_runs(Path(sys.argv[1]))
    print("compiled" if sim.compiled() else "pure Python")
