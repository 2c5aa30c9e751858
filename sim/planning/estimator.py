"""How the planner reads seeds: a load's SLO percentiles as an estimate with an interval, and the
chance that a fresh run meets the SLO.

    ratios = seed_ratios(runs, slo)             # per seed, per target: observed / target
    v = steady(ratios, ladder_done=False)        # "met" | "failed" | "undecided", with means and bounds
    b = bettable(ratios, confidence=0.9)         # a fresh run meets every target with P >= 0.9?
    e = boundary(answer_point, next_point)       # the sustained load between two grid loads, 90% interval

Each simulation (a seed) gives, per SLO target, the target's percentile over its judged requests
(sim/planning/slo.simulate_point). Two questions are asked of a load's seeds:

- **steady**: is the percentile itself (its mean over seeds: the run-length-independent quantity a
  long window of traffic shows) within every target? Decided at 90% confidence from the spread of
  the seeds (Student's t over seeds, each seed an independent replication: the standard
  replication method of simulation output analysis): "met" when every target's upper bound is
  <= 1, "failed" when some target's lower bound is > 1, else "undecided" (more seeds, or, at the
  most seeds allowed, the mean decides and the point says so). The load search uses it.
- **bettable**: does a fresh run of the same length meet every target with probability >=
  `confidence`? From the seeds' worst ratio per run w (the run meets iff w <= 1): the one-sided
  Student-t prediction bound mean(w) + t(confidence; k - 1) x sd(w) x sqrt(1 + 1/k) <= 1 (for
  normally distributed w, a fresh run falls below that bound with probability exactly
  `confidence`). Clusters are confirmed with it before a plan is chosen: "9 of 10 fresh seeds
  meet it" is what it predicts.

A seed that an early stop cut (its verdict certain: some percentile already past clear_fail x its
target, sim/planning/slo.EarlyStop) counts as that ratio on its target (a lower bound) and no
point with such a seed is met.

Why scipy: Student's t quantiles (scipy.special.stdtrit) are exact where a normal approximation
would flatter 2-4 seeds; scipy.special imports in ~0.15 s (scipy.stats in ~0.7 s).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

TWO_SIDED_90 = 0.95  # the t quantile of a two-sided 90% interval


def t_quantile(q: float, dof: int) -> float:
    """Student's t quantile (scipy's exact one; dof >= 1)."""
    from scipy.special import stdtrit

    return float(stdtrit(dof, q))


def seed_ratios(runs: list[dict], targets: dict[str, float]) -> list[dict[str, float | None]]:
    """Per run: observed SLO percentile / target for each target (None: nothing observed, e.g. no
    request finished; a stopped run: its stopping target's lower bound, the others None)."""
    out = []
    for r in runs:
        row: dict[str, float | None] = {}
        for k, t in targets.items():
            v = r[k]["slo"]
            row[k] = None if v is None else v / t
        out.append(row)
    return out


def _censored(run: dict) -> bool:
    return bool(run.get("stopped"))


@dataclass(frozen=True)
class Steady:
    verdict: str                # met | failed | undecided
    binding: str                # the target with the largest mean ratio
    mean: dict                  # target -> mean ratio over seeds
    upper: dict                 # target -> upper 90% bound of the mean ratio (None: one seed)
    lower: dict                 # target -> lower 90% bound
    seeds: int

    def as_dict(self) -> dict:
        return {"verdict": self.verdict, "binding": self.binding, "mean_ratio": self.mean,
                "upper_90": self.upper, "lower_90": self.lower, "seeds": self.seeds}


def steady(runs: list[dict], targets: dict[str, float]) -> Steady:
    """The mean SLO percentile over the seeds against each target, with 90% bounds (module docstring)."""
    ratios = seed_ratios(runs, targets)
    k = len(runs)
    mean: dict[str, float] = {}
    upper: dict[str, float | None] = {}
    lower: dict[str, float | None] = {}
    for key in targets:
        values = np.array([r[key] for r in ratios if r[key] is not None], dtype=np.float64)
        if not len(values):  # nothing observed (no request finished): no latency to hold against it
            mean[key], upper[key], lower[key] = 0.0, 0.0, 0.0
            continue
        m = float(values.mean())
        mean[key] = m
        if len(values) > 1:
            half = t_quantile(TWO_SIDED_90, len(values) - 1) * float(values.std(ddof=1)) / math.sqrt(len(values))
            upper[key], lower[key] = m + half, m - half
        else:
            upper[key] = lower[key] = None
    binding = max(mean, key=lambda key: mean[key])
    if k == 1:  # one seed (a deterministic workload): its value is the whole truth
        verdict = "met" if mean[binding] <= 1 and not _censored(runs[0]) else "failed"
    elif any(v is not None and v > 1 for v in lower.values()):
        verdict = "failed"
    elif any(_censored(r) for r in runs):
        verdict = "failed" if mean[binding] > 1 else "undecided"
    elif all(v is not None and v <= 1 for v in upper.values()):
        verdict = "met"
    else:
        verdict = "undecided"
    return Steady(verdict, binding, mean, upper, lower, k)


def worst(runs: list[dict], targets: dict[str, float]) -> list[float]:
    """Each run's worst observed / target: a run meets the SLO iff it is <= 1."""
    out = []
    for row in seed_ratios(runs, targets):
        out.append(max((v for v in row.values() if v is not None), default=0.0))
    return out


def bettable(runs: list[dict], targets: dict[str, float], confidence: float) -> dict:
    """Does a fresh run meet every target with probability >= `confidence`? (module docstring).
    `verdict`: met, failed (not even with many more seeds: mean + z x sd > 1), or undecided (more
    seeds could show it); `probability`: the estimated chance that a fresh run meets the SLO."""
    w = np.array(worst(runs, targets), dtype=np.float64)
    k = len(w)
    if k == 1:
        ok = bool(w[0] <= 1) and not _censored(runs[0])
        return {"verdict": "met" if ok else "failed", "probability": float(ok), "bound": float(w[0]), "seeds": 1,
                "worst_mean": float(w[0]), "worst_sd": 0.0}
    mean, sd = float(w.mean()), float(w.std(ddof=1))
    scale = sd * math.sqrt(1 + 1 / k)
    bound = mean + t_quantile(confidence, k - 1) * scale
    from scipy.special import ndtri, stdtr

    probability = float(stdtr(k - 1, (1 - mean) / scale)) if scale > 0 else float(mean <= 1)
    if bound <= 1 and not any(_censored(r) for r in runs):
        verdict = "met"
    elif mean + float(ndtri(confidence)) * sd > 1:  # the bound's limit with many seeds: more will not help
        verdict = "failed"
    else:
        verdict = "undecided"
    return {"verdict": verdict, "probability": probability, "bound": bound, "seeds": k, "worst_mean": mean,
            "worst_sd": sd}


def boundary(answer: dict, above: dict, unit_step: bool = False) -> dict | None:
    """The sustained load between a met grid load (`answer`) and the failed one above it, where the
    binding target's mean ratio crosses 1 (log ratio linear in log load between the two), with a
    90% interval from the seeds' spread at both (the delta method); None where the two do not
    bracket a rise (noise) or a point has one seed. Loads in the knob's unit."""
    sa, sn = answer.get("steady"), above.get("steady")
    if not sa or not sn or sa["seeds"] < 2 or sn["seeds"] < 2:
        return None
    key = sn["binding"]
    ra, rn = sa["mean_ratio"].get(key), sn["mean_ratio"].get(key)
    if not ra or not rn or ra <= 0 or rn <= ra or answer["load"] <= 0 or above["load"] <= answer["load"]:
        return None
    xa, xn = math.log(answer["load"]), math.log(above["load"])
    ya, yn = math.log(ra), math.log(rn)
    slope = (yn - ya) / (xn - xa)
    x = min(max(xa - ya / slope, xa), xn)  # where log ratio = 0, within the bracket
    w = (x - xa) / (xn - xa)

    def se_log(s: dict) -> float:  # the standard error of log(mean ratio), from its 90% half-width
        half = (s["upper_90"][key] - s["mean_ratio"][key]) if s["upper_90"].get(key) is not None else 0.0
        return half / t_quantile(TWO_SIDED_90, s["seeds"] - 1) / s["mean_ratio"][key]
    se = math.hypot((1 - w) * se_log(sa), w * se_log(sn))
    half = 1.645 * se / slope  # (90%: a normal quantile, the two ends' standard errors combined)
    load = math.exp(x)
    return {"load": load, "interval_90": [math.exp(x - half), math.exp(x + half)], "binding": key,
            "method": "the binding target's mean percentile / target, log-linear in log load between the two "
                      "grid loads, crossing 1; 90% interval from the seeds' standard errors (delta method)"}
