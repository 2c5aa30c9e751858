"""Shared helpers for the simulator tests: tiny scenarios on explicit workloads.

`cost_model: unit` makes every iteration last exactly 1.0 s, so times count iterations and
expected timelines can be written down by hand.
"""
from __future__ import annotations

import numpy as np
import pytest

from sim.scenario import Scenario, scenario_from_dict
from sim.simulate import SimResult, simulate
from sim.workload.generators import Workload

# The scenario needs a workload section to validate; tests replace it with an explicit Workload.
_PLACEHOLDER_WORKLOAD = {"arrival": {"process": "burst"}, "num_requests": 1,
                         "prompt_tokens": {"dist": "fixed", "value": 1},
                         "output_tokens": {"dist": "fixed", "value": 1}}


def bench_script(name: str):
    """bench/NAME.py as a module (the scripts that write what the docs quote: readme_example,
    docs_figures), for the tests that hold the docs to their output."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "bench" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_scenario(cost_model="unit", slo=None, seed=0, workload=None, model="llama-3-8b",
                  **engine) -> Scenario:
    """`model` (default llama-3-8b) on h100-sxm with the given engine keys (e.g. scheduler="chunked")."""
    raw = {"name": "test", "seed": seed, "model": model, "hardware": "h100-sxm",
           "cost_model": cost_model, "engine": engine,
           "workload": workload if workload is not None else _PLACEHOLDER_WORKLOAD}
    if slo is not None:
        raw["slo"] = slo
    return scenario_from_dict(raw)


def make_workload(arrival, prompt, output, priority=None) -> Workload:
    n = len(arrival)
    prompt = np.broadcast_to(np.asarray(prompt, dtype=np.int64), (n,)).copy()
    output = np.broadcast_to(np.asarray(output, dtype=np.int64), (n,)).copy()
    return Workload(arrival_s=np.asarray(arrival, dtype=np.float64), prompt_tokens=prompt,
                    output_tokens=output,
                    priority=np.zeros(n, dtype=np.int64) if priority is None
                    else np.asarray(priority, dtype=np.int64))


def run(arrival, prompt, output, priority=None, *, cost_model="unit", slo=None,
        fast_forward=True, model="llama-3-8b", **engine) -> SimResult:
    """Simulate one explicit workload under a scenario built from `engine` keys."""
    scenario = make_scenario(cost_model=cost_model, slo=slo, model=model, **engine)
    return simulate(scenario, workload=make_workload(arrival, prompt, output, priority),
                    fast_forward=fast_forward)


def assert_one_line_error(result, *substrings: str) -> str:
    """A CLI result (typer CliRunner) that failed with exit code 2 and one `error: ...` line on
    stderr containing every substring; returns that line."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for s in substrings:
        assert s in lines[0], lines[0]
    return lines[0]


def _numbers(summary, prefix=""):
    for key, value in summary.items():
        if isinstance(value, dict):
            yield from _numbers(value, f"{prefix}{key}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield f"{prefix}{key}", value


def assert_same_run(a, b):
    """Fast-forwarded and stepped runs agree (up to float rounding of summed durations)."""
    assert list(a.requests.columns) == list(b.requests.columns)
    # Times agree to 1e-9 relative. Differences of two times (queue_s of a request admitted
    # microseconds after arriving) keep the times' absolute rounding error, ~1e-13 s over a
    # 70 s run, so they get an absolute tolerance of 1e-9 of the run's length as well.
    atol = 1e-9 * a.summary["duration_s"]
    assert np.allclose(a.requests.to_numpy(np.float64), b.requests.to_numpy(np.float64),
                       rtol=1e-9, atol=atol, equal_nan=True)
    first_scheduled = [(r.requests["arrival_s"] + r.requests["queue_s"]).to_numpy() for r in (a, b)]
    assert np.allclose(*first_scheduled, rtol=1e-9, atol=0, equal_nan=True)  # (NaN: shed, never scheduled)
    na, nb = dict(_numbers(a.summary)), dict(_numbers(b.summary))
    assert na.keys() == nb.keys()
    for key in na:
        assert na[key] == pytest.approx(nb[key], rel=1e-9, abs=0, nan_ok=True), key
    assert a.steps["count"].sum() == b.steps["count"].sum() == a.summary["iterations"]
    assert a.steps["duration_s"].sum() == pytest.approx(b.steps["duration_s"].sum(), rel=1e-9)
