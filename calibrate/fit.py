"""Measured step times -> the step-cost model of a profile YAML (`servesim-step-profile/v1`).

    t = intercept + f(total_tokens) + a x decode_context_sum + b x prefill_attention_work + c x num_seqs

f is piecewise linear between knots with a non-negative slope on every segment (a "ramp" basis:
segment k contributes slope_k x clip(tokens - knot_k, 0, knot_{k+1} - knot_k), the last segment
unclipped so that it continues past the last knot, as sim/cost/step_cost.py extrapolates). Every coefficient
is >= 0, so more work is never predicted to be cheaper; f may be convex or concave. The fit is
least squares on relative error (each row weighted by 1 / measured time) with bounds, through
`scipy.optimize.lsq_linear`. Predictions use sim.cost.registry's own `StepProfile`, so the held-out error is
the error the simulator will make on those shapes.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from sim.cost.registry import PROFILE_FORMAT, StepProfile
from sim.files import write_file

FEATURES = ("total_tokens", "decode_context_sum", "prefill_attention_work", "num_seqs")
KNOT_CANDIDATES = (0, 8, 32, 128, 512, 2048, 8192, 32768, 131072)
MIN_TOKEN_VALUES_PER_SEGMENT = 2  # distinct measured token counts that pin a segment's slope


@dataclass(frozen=True)
class StepFit:
    knots: np.ndarray                # total tokens, strictly increasing, knots[0] = 0
    seconds: np.ndarray              # f at each knot (seconds[0] = 0: the constant is `intercept`)
    intercept: float                 # s per iteration
    decode_context_sum: float        # s per decode context token
    prefill_attention_work: float    # s per unit of sim.cost.registry.prefill_attention_work
    num_seqs: float                  # s per sequence

    def profile(self, metadata: dict | None = None) -> StepProfile:
        return StepProfile(knots=self.knots, seconds=self.seconds, intercept=self.intercept,
                           decode_context_sum=self.decode_context_sum,
                           prefill_attention_work=self.prefill_attention_work,
                           num_seqs=self.num_seqs, metadata=metadata or {}, source=Path("<fit>"))

    def predict(self, rows: pd.DataFrame) -> np.ndarray:
        """Seconds per iteration for rows holding FEATURES, evaluated as sim/cost/step_cost.py does."""
        p = self.profile()
        curve = np.array([p.tokens_time(t) for t in rows["total_tokens"]])
        return (p.intercept + curve + p.decode_context_sum * rows["decode_context_sum"].to_numpy()
                + p.prefill_attention_work * rows["prefill_attention_work"].to_numpy()
                + p.num_seqs * rows["num_seqs"].to_numpy())

    def model_mapping(self) -> dict:
        """The profile YAML's `model:` mapping (plain Python numbers)."""
        return {
            "intercept": float(self.intercept),
            "total_tokens": {"knots": [int(k) for k in self.knots],
                             "seconds": [float(s) for s in self.seconds]},
            "decode_context_sum": float(self.decode_context_sum),
            "prefill_attention_work": float(self.prefill_attention_work),
            "num_seqs": float(self.num_seqs),
        }


def choose_knots(tokens: np.ndarray) -> list[int]:
    """Knots from KNOT_CANDIDATES (factor-4 spacing) up to the largest measured token count,
    dropping interior knots until each segment holds MIN_TOKEN_VALUES_PER_SEGMENT distinct
    measured counts (a segment without data has no slope to fit). The last knot is the largest
    count measured; beyond it the last segment's slope continues."""
    values = np.unique(np.asarray(tokens, dtype=np.int64))
    top = int(values.max())
    knots = [k for k in KNOT_CANDIDATES if k < top] + [top]
    i = 1
    while i < len(knots) - 1:  # merge a thin segment into the next one
        inside = np.count_nonzero((values > knots[i - 1]) & (values <= knots[i]))
        if inside < MIN_TOKEN_VALUES_PER_SEGMENT:
            del knots[i]
        else:
            i += 1
    if len(knots) > 2:  # the last segment too: merge it into the previous one
        inside = np.count_nonzero((values > knots[-2]) & (values <= knots[-1]))
        if inside < MIN_TOKEN_VALUES_PER_SEGMENT:
            del knots[-2]
    return knots


def _design(rows: pd.DataFrame, knots: list[int]) -> np.ndarray:
    """Columns: intercept, one ramp per segment, decode_context_sum, prefill_attention_work, num_seqs."""
    t = rows["total_tokens"].to_numpy(dtype=np.float64)
    cols = [np.ones_like(t)]
    for k, (lo, hi) in enumerate(itertools.pairwise(knots)):
        last = k == len(knots) - 2
        cols.append(np.maximum(t - lo, 0.0) if last else np.clip(t - lo, 0.0, hi - lo))
    cols += [rows[f].to_numpy(dtype=np.float64) for f in FEATURES[1:]]
    return np.column_stack(cols)


def fit_step_model(rows: pd.DataFrame, knots: list[int] | None = None,
                   time_column: str = "median_ms", reweight: int = 0) -> StepFit:
    """Fit the profile's model to measured rows (FEATURES + `time_column` in milliseconds).

    Least squares on relative error weights each row by 1 / its measured time. On single noisy
    samples (one engine iteration each, `reweight` > 0) that weight favours the rows that happened
    to run fast, and the fit lands below the mean: `reweight` more passes weight each row by
    1 / the previous fit's prediction instead, which does not depend on the row's own noise
    (relative error around the mean, not around each sample)."""
    from scipy.optimize import lsq_linear

    y = rows[time_column].to_numpy(dtype=np.float64) / 1e3  # seconds
    if len(y) == 0 or np.any(~np.isfinite(y)) or np.any(y <= 0):
        raise ValueError(f"need positive, finite {time_column} values to fit, got {y.tolist()}")
    knots = list(knots) if knots is not None else choose_knots(rows["total_tokens"].to_numpy())
    design = _design(rows, knots)
    weight = 1.0 / y                            # least squares on relative error
    for _ in range(reweight + 1):
        a = design * weight[:, None]
        scale = np.abs(a).max(axis=0)
        scale[scale == 0] = 1.0                 # an all-zero feature (e.g. no decodes) stays 0
        sol = lsq_linear(a / scale, y * weight, bounds=(0.0, np.inf), method="bvls",
                         lsq_solver="exact")
        coef = sol.x / scale
        predicted = design @ coef
        weight = 1.0 / np.maximum(predicted, y.min() * 1e-3)
    slopes = coef[1:len(knots)]
    seconds = np.concatenate([[0.0], np.cumsum(slopes * np.diff(knots))])
    return StepFit(knots=np.array(knots, dtype=np.int64), seconds=seconds, intercept=coef[0],
                   decode_context_sum=coef[-3], prefill_attention_work=coef[-2], num_seqs=coef[-1])


def relative_errors(fit: StepFit, rows: pd.DataFrame, time_column: str = "median_ms") -> np.ndarray:
    """(predicted - measured) / measured per row."""
    measured = rows[time_column].to_numpy(dtype=np.float64) / 1e3
    return (fit.predict(rows) - measured) / measured


def heldout_error(fit: StepFit, rows: pd.DataFrame, time_column: str = "median_ms") -> tuple[float, float]:
    """(MAPE, max |relative error|) over `rows`, as fractions (0.05 = 5%)."""
    err = np.abs(relative_errors(fit, rows, time_column))
    return float(err.mean()), float(err.max())


def profile_document(fit: StepFit, metadata: dict) -> dict:
    return {"format": PROFILE_FORMAT, "metadata": metadata, "model": fit.model_mapping()}


def write_profile(path: Path, fit: StepFit, metadata: dict) -> None:
    """Write the profile YAML (read back by sim.cost.registry.load_profile)."""
    text = yaml.safe_dump(profile_document(fit, metadata), sort_keys=False, width=100)
    write_file(path, text)  # written whole, then renamed: never half a profile (sim/files.py)
