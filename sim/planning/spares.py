"""N+k: the spares a fleet needs to meet an availability target under its faults (issue 51).

    N  = engine.replicas, the fleet sized for the load without faults (what `servesim plan` answers)
    for k = 0, 1, ... max_spares: N + k replicas run the scenario's workload under its faults,
    once per fault seed (faults.seed = 0 .. seeds-1: the fault times vary, the requests do not);
    the answer is the least k whose worst seed meets the target (the fraction of windows of
    faults.minute_s in which the SLO held: sim/features/faults/summary.minutes_met).

With a `faults.spot` section a second fleet is searched beside the on-demand one: the scenario's
spot replicas plus every spare on spot capacity (at spot.usd_per_gpu_hour), and the cheaper of the
two that meets the target is the answer. Every figure is the simulation's; the costs are GPU-hours
at the hardware's price (spot: the spot price) over an hour.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import numpy as np

from sim.config.errors import ScenarioError
from sim.features.faults.summary import minutes_met


def _fleet(scenario, replicas: int, faults):
    engine = dataclasses.replace(scenario.engine, replicas=replicas)
    features = dict(scenario.features)
    features["faults"] = faults
    return dataclasses.replace(scenario, engine=engine, features=features)


def _spot_faults(config, extra: int):
    """The scenario's faults with `extra` more replicas on spot (the last ones), notices moved along."""
    s = config.spot
    notices = tuple(dataclasses.replace(o, replica=o.replica + extra) for o in s.notices)
    return dataclasses.replace(config, spot=dataclasses.replace(s, replicas=s.replicas + extra, notices=notices))


def seeded_runs(scenario, seeds: int, workload=None, tick: Callable[[], None] | None = None) -> list[dict]:
    """The scenario run once per fault seed (faults.seed = 0 .. seeds-1: the fault times vary, the
    requests do not): each run's summary. `tick()` after each."""
    from sim.simulate import simulate

    out = []
    for seed in range(seeds):
        faults = dataclasses.replace(scenario.features["faults"], seed=seed)
        run = simulate(dataclasses.replace(scenario, features={**scenario.features, "faults": faults}),
                       workload=workload)
        if tick is not None:
            tick()
        out.append(run.summary)
    return out


def spread(fractions: list[float]) -> dict:
    """Availability over the seeds: the worst, the median and the best."""
    return {"availability_min": float(np.min(fractions)), "availability_median": float(np.median(fractions)),
            "availability_max": float(np.max(fractions))}


def plan_spares(scenario, target: float, seeds: int = 5, max_spares: int = 4, workload=None,
                progress: Callable[[int, int, float], None] | None = None) -> dict:
    """The spares N+k for `target` (a fraction of windows, e.g. 0.999); `progress(done, total,
    eta_s)` after each simulation."""
    from sim.simulate import simulate
    from sim.workload.generators import build_workload

    config = scenario.features.get("faults")
    if config is None:
        raise ScenarioError(f"{scenario.source or 'scenario'}: faults: missing; the spares are sized against "
                            "a fault model (docs/faults.md)")
    if scenario.slo is None:
        raise ScenarioError(f"{scenario.source or 'scenario'}: slo: missing; availability is the SLO met per window")
    if not 0 < target <= 1:
        raise ScenarioError(f"--availability: {target:g} is not a fraction in (0, 1]")
    if workload is None:
        workload = build_workload(scenario.workload, np.random.default_rng(scenario.seed))
    n, e, hw = scenario.engine.replicas, scenario.engine, scenario.hardware
    spot_price = hw.usd_per_hour if config.spot is None or config.spot.usd_per_gpu_hour is None \
        else config.spot.usd_per_gpu_hour
    options = {"on_demand": dataclasses.replace(config, spot=None)}
    if config.spot is not None:
        options["spot"] = config
    if all(c.failures is None and not c.outages and c.drains is None and c.spot is None for c in options.values()):
        options = {"spot": config}  # (spot was the only fault: no on-demand fleet to compare)
    total = 1 + len(options) * (max_spares + 1) * seeds
    done, began = 0, time.monotonic()

    def tick() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            spent = time.monotonic() - began
            progress(done, total, spent / done * (total - done))

    free = simulate(_fleet(scenario, n, None), workload=workload)  # N without faults
    tick()
    baseline = minutes_met(free.requests, scenario.slo, config.minute_s)
    out: dict = {"target": target, "replicas": n, "seeds": seeds, "minute_s": config.minute_s,
                 "fault_free": {"availability": baseline.get("fraction"),
                                "usd_per_hour": n * e.gpus_per_replica * hw.usd_per_hour},
                 "options": {}, "rule": "the least spares whose worst seed met the target"}
    for name, base in options.items():
        rows = []
        for k in range(max_spares + 1):
            faults = base if name == "on_demand" else _spot_faults(base, k)
            spot_n = 0 if faults.spot is None else faults.spot.replicas
            fractions, missed, lost = [], 0, 0
            for summary in seeded_runs(_fleet(scenario, n + k, faults), seeds, workload, tick):
                a = summary["faults"]["availability"]
                fractions.append(a.get("fraction", float("nan")))
                missed += a.get("minutes", 0) - a.get("met", 0)
                lost += a.get("missed_with_lost_requests", 0)
            usd = e.gpus_per_replica * ((n + k - spot_n) * hw.usd_per_hour + spot_n * spot_price)
            rows.append({"spares": k, "replicas": n + k, "spot_replicas": spot_n, **spread(fractions),
                         "met": bool(np.min(fractions) >= target), "usd_per_hour": usd,
                         # windows missed over the seeds, and those among them that held a lost request
                         "windows_missed": missed, "missed_with_lost_requests": lost})
            if rows[-1]["met"]:
                break
        answer = next((r for r in rows if r["met"]), None)
        out["options"][name] = {"rows": rows, "answer": answer}
        if progress is not None and answer is not None:  # the rest of this option was not needed
            total -= (max_spares - answer["spares"]) * seeds
    met = [(o["answer"]["usd_per_hour"], name) for name, o in out["options"].items() if o["answer"] is not None]
    out["answer"] = None if not met else min(met)[1]
    if out["answer"] is not None:
        best = out["options"][out["answer"]]["answer"]
        out["extra_usd_per_hour"] = best["usd_per_hour"] - out["fault_free"]["usd_per_hour"]
    return out


def lines(plan: dict) -> list[str]:
    """The answer in words, one line each (what `servesim spares` prints)."""
    said = [f"fault-free: {plan['replicas']} replica(s), SLO met in "
            f"{plan['fault_free']['availability']:.2%} of {plan['minute_s']:g}-s windows, "
            f"${plan['fault_free']['usd_per_hour']:.2f}/h"]
    for name, o in plan["options"].items():
        for r in o["rows"]:
            said.append(f"{name:9s} N+{r['spares']} ({r['replicas']} replicas, {r['spot_replicas']} spot): "
                        f"availability min {r['availability_min']:.2%} / median {r['availability_median']:.2%} / "
                        f"max {r['availability_max']:.2%} over {plan['seeds']} seeds, ${r['usd_per_hour']:.2f}/h"
                        + ("  meets" if r["met"] else ""))
    rows = [r for o in plan["options"].values() for r in o["rows"]]
    missed = sum(r["windows_missed"] for r in rows)
    lost = sum(r["missed_with_lost_requests"] for r in rows)
    if missed:
        said.append(f"of the {missed} windows missed over these fleets and seeds, {lost} held a request lost to a "
                    "fault (its retry missed the SLO there): spares do not win those back; a shorter "
                    "faults.retry_delay_s or faster failover does")
    if plan["answer"] is None:
        said.append(f"no fleet up to N+{len(next(iter(plan['options'].values()))['rows']) - 1} met "
                    f"{plan['target']:.3%}; raise --max-spares or loosen the target")
    else:
        best = plan["options"][plan["answer"]]["answer"]
        said.append(f"answer: {plan['answer'].replace('_', '-')} N+{best['spares']} = {best['replicas']} replicas "
                    f"for {plan['target']:.3%} of windows; ${best['usd_per_hour']:.2f}/h, "
                    f"{plan['extra_usd_per_hour']:+.2f} $/h against the fault-free fleet")
    return said
