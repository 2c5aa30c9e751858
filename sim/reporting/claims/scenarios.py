"""The audit's scenarios (`scenarios/claims/`): simulating one with `--set`-style overrides, reading
a fixture trace."""
from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np

from sim.scenario import load_scenario
from sim.simulate import SimResult, simulate

SCENARIOS = Path(__file__).resolve().parents[3] / "scenarios" / "claims"


@cache
def run(name: str, *overrides: str) -> SimResult:
    """Simulate scenarios/claims/<name>.yaml with `--set`-style overrides (cached per call)."""
    return simulate(load_scenario(SCENARIOS / f"{name}.yaml", overrides=list(overrides)))


def trace_lengths(name: str) -> np.ndarray:
    """Output lengths of a claims fixture trace (toy8.csv, toy20.csv)."""
    return np.loadtxt(SCENARIOS / name, delimiter=",", skiprows=1, dtype=np.int64, ndmin=2)[:, 2]
