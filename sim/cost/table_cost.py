"""The step cost of a measured (v2) profile: table lookups, compiled with the engine (setup.py).

A profile's terms are piecewise-linear curves and bilinear grids (sim/cost/measured.py reads and
checks them); this module prices one iteration from them, ~1e5-1e6 times a run. The scalar path is
plain Python on lists (bisect + the interpolation formula), compiled by mypyc: the same doubles as
`numpy.interp`, which computes, for xp[j] <= x < xp[j + 1], (fp[j+1] - fp[j]) / (xp[j+1] - xp[j]) x
(x - xp[j]) + fp[j] (fp[j] itself where x == xp[j], the end values outside the knots), without the
~2 us numpy spends on a scalar. Arrays (a decode run's `steps` iterations at once) go through numpy.
tests/cost/test_table_cost.py holds the two paths to the same floats.
"""
from __future__ import annotations

import math
from bisect import bisect_right
from typing import Any

import numpy as np

from sim.cost.batch import BatchStats
from sim.cost.step_cost import StepCost, _context_sum


class Curve:
    """y(x) piecewise-linear over increasing knots; past the last knot, y scales in proportion to x."""

    def __init__(self, x: Any, y: Any):
        self.x, self.y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        self.xs: list[float] = self.x.tolist()
        self.ys: list[float] = self.y.tolist()
        self.last: float = self.xs[-1]

    def at(self, x: float) -> float:
        """y(x) for one x: numpy.interp's arithmetic on doubles (module docstring)."""
        xs, ys = self.xs, self.ys
        if x > self.last:
            return ys[-1] * x / self.last
        j = bisect_right(xs, x) - 1
        if j < 0:
            return ys[0]
        if j == len(xs) - 1 or xs[j] == x:
            return ys[j]
        slope = (ys[j + 1] - ys[j]) / (xs[j + 1] - xs[j])
        return slope * (x - xs[j]) + ys[j]

    def __call__(self, x: Any) -> Any:
        if np.ndim(x) == 0:
            return self.at(float(x))
        return np.where(x > self.last, self.y[-1] * x / self.last, np.interp(x, self.x, self.y))

    def __reduce__(self) -> tuple:  # (compiled classes pickle through their constructor)
        return Curve, (self.x, self.y)


class Grid:
    """z(a, b) over a grid: linear in a between rows, each row a Curve in b; past the last row
    (or before the first), the nearest row scaled by a / its a."""

    def __init__(self, a: Any, rows: tuple):
        self.a = np.asarray(a, dtype=np.float64)
        self.rows: tuple = tuple(rows)
        self.curves: list[Curve] = list(rows)
        self.av: list[float] = self.a.tolist()

    def at(self, va: float, vb: float) -> float:
        """z(va, vb) for one point, in __call__'s operations on doubles."""
        av, curves = self.av, self.curves
        if va >= av[-1]:
            return curves[-1].at(vb) * (va / av[-1])
        if va <= av[0]:
            return curves[0].at(vb) * (va / av[0])
        i = bisect_right(av, va)  # av[i - 1] <= va < av[i]
        lo, hi = av[i - 1], av[i]
        zl = curves[i - 1].at(vb)
        if va == lo:
            return zl
        return zl + (va - lo) / (hi - lo) * (curves[i].at(vb) - zl)

    def __call__(self, va: float, vb: Any) -> Any:
        if np.ndim(vb) == 0:
            return self.at(float(va), float(vb))
        a, rows = self.av, self.rows
        if va >= a[-1]:
            return rows[-1](vb) * (va / a[-1])
        if va <= a[0]:
            return rows[0](vb) * (va / a[0])
        i = bisect_right(a, va)
        lo, hi = a[i - 1], a[i]
        zl = rows[i - 1](vb)
        if va == lo:
            return zl
        return zl + (va - lo) / (hi - lo) * (rows[i](vb) - zl)

    def __reduce__(self) -> tuple:
        return Grid, (self.a, self.rows)


def prefill_equivalent(lens: list, contexts: list) -> tuple[int, float]:
    """(chunks, length of a fresh prompt with the chunks' mean causal pairs): a chunk of c tokens
    after p cached ones has c x p + c^2 / 2 (query, key) pairs, a fresh prompt of s tokens s^2 / 2."""
    pairs: Any = 0.0  # (contexts are floats under a sliding window's layer average, else ints)
    for c, p in zip(lens, contexts):
        pairs += c * p + c * c / 2
    return len(lens), math.sqrt(2 * pairs / len(lens))


class TableProfileCost(StepCost):
    """The step-cost model of a v2 profile (sim/cost/measured.TableProfile); `cpu_overhead_s` /
    `cpu_overhead_per_seq_s` replace the profile's CPU term when given (a scenario's tuning);
    `kv_cache_dtype` (the engine's) picks the attention grids; `overheads`
    (sim/cost/overheads.py) turns the kernel time g of an iteration into max(g, host) +
    per-iteration adders, at `tensor_parallel_size`."""

    def __init__(self, profile: Any, cpu_overhead_s: float | None = None,
                 cpu_overhead_per_seq_s: float | None = None, kv_cache_dtype: str = "auto",
                 overheads: Any = None, tensor_parallel_size: int = 1):
        self.profile = p = profile
        self._args = (profile, cpu_overhead_s, cpu_overhead_per_seq_s, kv_cache_dtype, overheads,
                      tensor_parallel_size)
        decode, prefill = p.attention(kv_cache_dtype)
        self._decode: Grid = decode
        self._prefill: Grid = prefill
        self._token_curve: Curve = p.tokens
        self._seq_curve: Curve = p.sequences
        self._cpu: float = float(p.cpu_per_iteration if cpu_overhead_s is None else cpu_overhead_s)
        self._cpu_seq: float = float(p.cpu_per_sequence if cpu_overhead_per_seq_s is None else cpu_overhead_per_seq_s)
        floor, adder = (0.0, 0.0) if overheads is None else overheads.step_floor_and_adder(tensor_parallel_size)
        self._floor: float = float(floor)
        self._adder: float = float(adder)
        self._tokens: dict[int, float] = {}     # T -> tokens(T), cached: T repeats a lot
        self._sequences: dict[int, float] = {}  # S -> sequences(S)

    def __reduce__(self) -> tuple:
        return TableProfileCost, self._args

    def _fixed(self, tokens: int, seqs: int) -> float:
        t = self._tokens.get(tokens)
        if t is None:
            t = self._tokens[tokens] = self._token_curve.at(tokens)
        s = self._sequences.get(seqs)
        if s is None:
            s = self._sequences[seqs] = self._seq_curve.at(seqs)
        return self._cpu + self._cpu_seq * seqs + t + s

    def _finish(self, t: float) -> float:
        """The engine's host floor and per-iteration adders on a kernel time (step_times' order)."""
        if self._floor:
            t = max(t, self._floor)
        return t + self._adder if self._adder else t

    def step_time(self, stats: BatchStats) -> float:
        """step_times(stats, 1)[0] in Python floats: the same operations on the same doubles
        (tests/cost/test_sim_cost.py holds them equal)."""
        t = self._without_decodes(stats)
        n = stats.num_decodes
        if n:
            t = t + self._decode.at(n, _context_sum(stats) / n)
        return self._finish(t)

    def decode_times(self, stats: BatchStats, steps: int) -> list[float] | None:
        """step_times(stats, steps) as a list, priced in Python (the engine walks a run's first
        iterations up to the next arrival with these)."""
        n = stats.num_decodes
        t = self._without_decodes(stats)
        if n == 0:
            one = self._finish(t)
            return [one] * steps
        mean = _context_sum(stats) / n
        g = stats.decode_context_growth
        per: float = 1.0 if g is None else g / n
        decode = self._decode
        out: list[float] = []
        for j in range(steps):
            step: float = float(j) if g is None else float(j) * per
            out.append(self._finish(t + decode.at(n, mean + step)))
        return out

    def step_times(self, stats: BatchStats, steps: int = 1) -> np.ndarray:
        times = self._gpu_times(stats, steps)
        if self._floor:
            times = np.maximum(times, self._floor)
        return times + self._adder if self._adder else times

    def _without_decodes(self, stats: BatchStats) -> float:
        """An iteration's kernel time but its decodes' attention: the per-token and per-sequence
        terms, and the prefill chunks' attention."""
        chunks = len(stats.prefill_lens)
        t = self._fixed(stats.total_tokens, chunks + stats.num_decodes)
        if chunks:
            b, s = prefill_equivalent(stats.prefill_lens.tolist(), stats.prefill_contexts.tolist())
            t += self._prefill.at(b, s)
        return t

    def _gpu_times(self, stats: BatchStats, steps: int) -> np.ndarray:
        n = stats.num_decodes
        t = self._without_decodes(stats)
        if n == 0:
            return np.full(steps, t)
        mean = _context_sum(stats) / n
        if steps == 1:
            return np.array([t + self._decode.at(n, mean)])
        # iteration j: every decode one token further, so the mean context grows by j
        growth = np.arange(steps, dtype=np.float64)
        if stats.decode_context_growth is not None:  # (a sliding window's layer average)
            growth *= stats.decode_context_growth / n
        return t + self._decode(n, mean + growth)
