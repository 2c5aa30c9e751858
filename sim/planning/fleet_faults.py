"""A fleet plan's policy under the scenario's faults (issue 51): its availability, and the headroom
an availability target needs.

The fleet plan (sim/planning/fleet_plan.py) searches the fault-free policy: its probes run with the
faults set aside. Then the chosen policy's whole day runs with the faults back, once per fault seed
(faults.seed = 0 .. seeds-1: the fault times vary, the requests do not), and its availability is
the fraction of faults.minute_s windows meeting the SLO (sim/features/faults/summary.minutes_met),
worst over the seeds. With a target, headroom is bought the way an operator would: min_replicas
raised one at a time (a floor that keeps spares warm) up to max_replicas (the static fleet for the
peak), each on every fault seed; the answer is the first whose worst seed meets the target.

With `faults.spot` the policy's replicas take spot capacity first (sim/features/faults/runtime.py),
and the same search runs beside it all on demand (the faults without the spot section: no
preemptions, every GPU-hour at the plan's price): the answer is the cheaper of the two that meets
the target (without one: the cheaper at the policy's own floor), and `spot_lowers_bill` says
whether spot capacity lowered the bill there.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from sim.config.errors import ScenarioError
from sim.scenario import SLOConfig, load_scenario


def judge(path: Path, base: tuple[str, ...], slo: SLOConfig, policy: tuple[str, ...], seeds: int,
          on_demand: bool = False) -> dict:
    """The policy's day under the faults on `seeds` fault seeds: availability min / median / max,
    GPU-hours (mean over the seeds) and requests lost. `on_demand`: without the spot section."""
    from sim.planning.spares import seeded_runs, spread

    sc = dataclasses.replace(load_scenario(path, base + policy), slo=slo)
    if on_demand:  # (the other faults stay; a section left with none runs as no fault at all)
        faults = dataclasses.replace(sc.features["faults"], spot=None)
        sc = dataclasses.replace(sc, features={**sc.features, "faults": faults})
    runs = seeded_runs(sc, seeds)
    fractions = [r["faults"]["availability"].get("fraction", float("nan")) for r in runs]
    hours = [r["autoscaling"]["gpu_hours"] if "autoscaling" in r else float("nan") for r in runs]
    # of them on spot capacity (faults.spot in an autoscaled fleet: spot first, else on demand)
    spot = [r["autoscaling"].get("gpu_hours_by_pool", {}).get("spot", 0.0) if "autoscaling" in r else 0.0
            for r in runs]
    return {**spread(fractions), "gpu_hours": float(np.mean(hours)), "spot_gpu_hours": float(np.mean(spot)),
            "requests_lost": sum(int(r["faults"].get("requests_lost", 0)) for r in runs),
            "minute_s": sc.features["faults"].minute_s}


def under_faults(path: Path, base: tuple[str, ...], slo: SLOConfig, low: int, high: int, target: float,
                 seeds: int, availability: float | None, price: float, policy) -> dict[str, Any]:
    """The chosen policy (min `low`, max `high`, `target` in flight) under the faults; with
    `availability`, min_replicas raised until the worst seed meets it. `policy(low, high, target)`:
    its overrides (fleet_plan._policy). GPU-hours cost `price` each, those on spot the spot price."""
    spot = load_scenario(path, base).features["faults"].spot
    spot_price = price if spot is None or spot.usd_per_gpu_hour is None else spot.usd_per_gpu_hour

    def search(on_demand: bool) -> tuple[list[dict], dict | None]:
        rows: list[dict] = []
        for floor in range(low, high + 1):
            row = judge(path, base, slo, policy(floor, high, target), seeds, on_demand)
            row.update(min_replicas=floor,
                       usd=(row["gpu_hours"] - row["spot_gpu_hours"]) * price + row["spot_gpu_hours"] * spot_price,
                       met=availability is None or row["availability_min"] >= availability)
            rows.append(row)
            if availability is None or row["met"]:
                break
        return rows, (next((r for r in rows if r["met"]), None) if availability is not None else rows[0])

    rule = ("the fault-free policy, then min_replicas raised one at a time until its worst seed meets the target"
            if availability is not None else "the fault-free policy under the faults")
    try:
        rows, answer = search(False)
        alone = search(True) if spot is not None else None
    except ScenarioError as e:  # (faults naming a replica the fleet cannot hold): said, not raised
        return {"refused": str(e), "seeds": seeds, "target": availability, "rows": [], "answer": None}
    out: dict[str, Any] = {"seeds": seeds, "target": availability, "rows": rows, "answer": answer, "rule": rule}
    if alone is not None:  # spot first, against all on demand: the cheaper that meets the target answers
        od_rows, od_answer = alone
        out["on_demand"] = {"rows": od_rows, "answer": od_answer}
        out["spot_first"] = answer
        met = [a for a in (answer, od_answer) if a is not None]
        out["spot_lowers_bill"] = (answer is not None and (od_answer is None or answer["usd"] < od_answer["usd"]))
        out["answer"] = min(met, key=lambda a: a["usd"]) if met else None
        if out["answer"] is not None:
            out["answer"] = {**out["answer"], "capacity": "spot first" if out["answer"] is answer else "on demand"}
        out["rule"] = rule + "; spot first and all on demand each, the cheaper that meets it answers"
    return out
