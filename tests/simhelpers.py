"""Shared helpers for the simulator tests: tiny scenarios on explicit workloads.

`cost_model: unit` makes every iteration last exactly 1.0 s, so times count iterations and
expected timelines can be written down by hand.
"""
from __future__ import annotations

import numpy as np

from sim.config.scenario import Scenario, scenario_from_dict
from sim.simulate import SimResult, simulate
from sim.workload.generators import Workload

# The scenario needs a workload section to validate; tests replace it with an explicit Workload.
_PLACEHOLDER_WORKLOAD = {"arrival": {"process": "burst"}, "num_requests": 1,
                         "prompt_tokens": {"dist": "fixed", "value": 1},
                         "output_tokens": {"dist": "fixed", "value": 1}}


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
