"""The measured profile's scalar path (plain Python, compiled) gives the very floats of its numpy
path and of numpy.interp, and decode_times the very floats of step_times, on fresh random inputs."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sim.cost.batch import BatchStats, WindowedBatchStats
from sim.cost.measured import PROFILES, load_table_profile
from sim.cost.overheads import EngineOverheads
from sim.cost.registry import load_profile
from sim.cost.step_cost import ScaledCost, WindowedCost
from sim.cost.table_cost import Curve, Grid, TableProfileCost

PROFILE = PROFILES / "h100-sxm" / "llama-3-8b-tp1.yaml"


def test_curve_at_is_numpy_interp_to_the_bit():
    rng = np.random.default_rng(7)
    x = np.cumsum(rng.uniform(0.5, 40, 12))
    y = rng.uniform(1e-5, 3e-3, 12)
    c = Curve(x, y)
    queries = np.concatenate([rng.uniform(-5, x[-1] * 1.5, 2000), x, [x[0] - 1, x[-1]]])
    for q in queries:
        want = y[-1] * q / x[-1] if q > x[-1] else np.interp(q, x, y)
        assert c.at(float(q)) == want
    # the array path equals the scalar path element by element
    assert c(queries).tolist() == [c.at(float(q)) for q in queries]


def test_grid_at_is_its_array_path_to_the_bit():
    rng = np.random.default_rng(11)
    a = np.array([1.0, 4.0, 16.0, 64.0, 256.0])
    b = np.cumsum(rng.uniform(10, 500, 9))
    rows = tuple(Curve(b, rng.uniform(1e-5, 1e-3, len(b))) for _ in a)
    g = Grid(a, rows)
    for va in [0.5, 1.0, 3.0, 4.0, 17.5, 256.0, 300.0, *rng.uniform(0.5, 400, 50)]:
        vb = rng.uniform(0, b[-1] * 1.3, 40)
        assert g(va, vb).tolist() == [g.at(float(va), float(v)) for v in vb]


def _stats(rng, n: int, mean: int, windowed: bool = False):
    if windowed:
        return WindowedBatchStats(num_decodes=n, decode_context_sum=n * mean, decode_window_sum=n * min(mean, 300),
                                  decode_capped=n // 3)
    return BatchStats(num_decodes=n, decode_context_sum=n * mean + int(rng.integers(0, n)))


@pytest.mark.parametrize("overheads", [None, EngineOverheads(host_per_iteration_s=4e-3, per_iteration_s=2.5e-4)])
def test_decode_times_are_step_times_to_the_bit(overheads):
    rng = np.random.default_rng(3)
    profile = load_profile(PROFILE)
    cost = TableProfileCost(profile, overheads=overheads)
    for n, mean in [(1, 10), (3, 900), (37, 4100), (256, 1500), (300, 20000), *zip(
            rng.integers(1, 400, 30).tolist(), rng.integers(1, 30000, 30).tolist())]:
        stats = _stats(rng, n, mean)
        steps = int(rng.integers(1, 70))
        assert cost.decode_times(stats, steps) == cost.step_times(stats, steps).tolist()
        assert cost.step_time(stats) == cost.step_times(stats, 1)[0]
    # through the wrappers that pass it on: a sliding window's layer average, a scale
    for wrapped in (WindowedCost(cost, 0.5, 256), ScaledCost(cost, 1.0648493238206793)):
        for n, mean in [(4, 100), (64, 2000), (200, 9000)]:
            stats = _stats(rng, n, mean, windowed=isinstance(wrapped, WindowedCost))
            assert wrapped.decode_times(stats, 40) == wrapped.step_times(stats, 40).tolist()


def test_a_profile_pickles_to_the_same_prices():
    import pickle

    profile = load_table_profile(Path(PROFILE), __import__("yaml").safe_load(PROFILE.read_text()), b"")
    cost = TableProfileCost(profile)
    again = pickle.loads(pickle.dumps(cost))
    stats = BatchStats(prefill_lens=np.array([700, 64]), prefill_contexts=np.array([0, 512]), num_decodes=20,
                       decode_context_sum=20 * 800)
    assert again.step_time(stats) == cost.step_time(stats)
    assert again.decode_times(BatchStats(num_decodes=9, decode_context_sum=9000), 5) == \
        cost.decode_times(BatchStats(num_decodes=9, decode_context_sum=9000), 5)
