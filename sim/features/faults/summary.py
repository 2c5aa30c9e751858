"""summary.json's `faults` section: what failed, what it cost the requests, the SLO minute by
minute (an availability figure), the capacity lost over time and the fleet's bill."""
from __future__ import annotations

import numpy as np
import pandas as pd

from sim.runtime.metrics import PER_REQUEST, distribution


def minutes_met(requests: pd.DataFrame, slo, minute_s: float) -> dict:
    """The SLO judged per window of `minute_s` s of arrivals: a window meets it when, of the requests
    that arrived in it, at least the SLO's percentile met each per-request target (TTFT, TPOT,
    E2EL; a failed request meets none). The ITL target is a property of the whole token stream and
    is not judged per window. Windows with no arrival are not counted."""
    if slo is None or not any(k in PER_REQUEST for k in slo.targets()):
        return {"source": "not computed: the scenario sets no per-request SLO (slo.ttft_ms, tpot_ms or e2el_ms)"}
    served = requests  # (faults run without a gateway: every row is a request the engine got)
    window = np.floor(served["arrival_s"].to_numpy(dtype=float) / minute_s).astype(np.int64)
    failed = served["finish_s"].isna().to_numpy()
    met = pd.Series(True, index=np.unique(window))
    for key, (target, pct) in slo.targets().items():
        if key not in PER_REQUEST:
            continue
        values = served[PER_REQUEST[key]].to_numpy(dtype=float) * 1e3
        ok = ~(values > target) & ~failed  # (a one-token request has no TPOT and cannot miss it)
        share = pd.Series(ok).groupby(window).mean()
        met &= share >= pct / 100.0
    missed_lost = 0
    if "attempts" in served:  # a missed window that held a lost request (retried or failed)
        lost = (served["attempts"].to_numpy() > 1) | served["failed"].to_numpy(dtype=bool)
        touched = pd.Series(lost).groupby(window).any()
        missed_lost = int((~met & touched.reindex(met.index, fill_value=False)).sum())
    return {"minute_s": minute_s, "minutes": int(len(met)), "met": int(met.sum()),
            # of the windows missed, those with a lost request: the retries' own latency missed
            # there, which spares do not win back (a shorter retry_delay_s or failover would)
            "missed_with_lost_requests": missed_lost,
            "fraction": float(met.mean()) if len(met) else 1.0,
            "worst_minute_start_s": None if met.all() else float(met.index[~met.to_numpy()][0] * minute_s),
            # each window with an arrival: its start (s) and whether it met the SLO (the figure's bottom row)
            "windows": [[float(k * minute_s), bool(m)] for k, m in met.items()],
            "rule": "a window met the SLO when at least the percentile of its arrivals met every per-request "
                    "target; failed requests count as misses"}


def capacity(log: list[dict], size: int, end_s: float) -> dict:
    """Replica-seconds down and draining over [0, end_s], and the replicas up on average."""
    down = draining = 0.0
    for i in range(size):
        state, since = "up", 0.0
        for entry in (e for e in log if e["replica"] == i):
            t = min(entry["t_s"], end_s)
            down += (t - since) * (state == "down")
            draining += (t - since) * (state == "draining")
            state, since = entry["state"], t
        down += max(end_s - since, 0.0) * (state == "down")
        draining += max(end_s - since, 0.0) * (state == "draining")
    held = size * end_s
    return {"replica_seconds_down": down, "replica_seconds_draining": draining,
            "mean_up_replicas": (held - down - draining) / end_s if end_s > 0 else float(size),
            "capacity_lost_fraction": (down + draining) / held if held > 0 else 0.0}


def faults_section(faults, config, requests: pd.DataFrame, scenario, fleet: dict | None = None) -> dict:
    """summary.json's `faults`; `fleet`: the run's `autoscaling` section (an autoscaled fleet's bill)."""
    attempts, failed = faults.attempts, faults.failed
    arrival = requests["arrival_s"].to_numpy(dtype=float)
    finish = requests["finish_s"].to_numpy(dtype=float)
    end_s = float(np.nanmax(finish)) if np.isfinite(finish).any() else 0.0
    retried = (attempts > 1) & ~failed
    e = scenario.engine
    size = len(faults.schedulers)
    spot = config.spot
    spot_n = 0 if spot is None else spot.replicas
    price = scenario.hardware.usd_per_hour
    spot_price = price if spot is None or spot.usd_per_gpu_hour is None else spot.usd_per_gpu_hour
    gpu_hours = end_s / 3600 * e.gpus_per_replica
    if fleet is None:  # every replica held the whole run, the last spot_n of them on spot
        cost = {"on_demand_replicas": size - spot_n, "spot_replicas": spot_n,
                "usd": gpu_hours * ((size - spot_n) * price + spot_n * spot_price),
                "usd_all_on_demand": gpu_hours * size * price, "hours": end_s / 3600}
    else:  # an autoscaled fleet: the spans it held, each priced on its own capacity (its `autoscaling`)
        pools = fleet.get("gpu_hours_by_pool", {})
        cost = {"on_demand_gpu_hours": pools.get("on_demand", fleet["gpu_hours"]),
                "spot_gpu_hours": pools.get("spot", 0.0), "usd": fleet["usd"],
                "usd_all_on_demand": fleet["gpu_hours"] * fleet["usd_per_gpu_hour"], "hours": end_s / 3600}
    out = {**{k: v for k, v in faults.counts.items() if k != "lost"},
           "requests_lost": faults.counts["lost"],
           "requests_retried": int(retried.sum()), "retries": int((attempts - 1).sum()),
           "requests_failed": int(failed.sum()), "failed_fraction": float(failed.mean()) if len(failed) else 0.0,
           # from each retried request's arrival to the send of the attempt that finished
           "retried_lost_ms": distribution((faults.resent_s - arrival)[retried]),
           "retried_e2el_ms": distribution((finish - arrival)[retried]),
           "availability": minutes_met(requests, scenario.slo, config.minute_s),
           "capacity": capacity(faults.pool.log, size, end_s),
           "cost": cost,
           "timeline": [x for x in faults.pool.log if x["t_s"] <= end_s]}
    return out


def one_line(s: dict) -> str:
    a = s.get("availability", {})
    met = (f"SLO met in {a['fraction']:.2%} of {a['minute_s']:g}-s windows ({a['met']}/{a['minutes']})"
           if "fraction" in a else a.get("source", ""))
    return (f"faults: {s['failures']} failures, {s['outages']} outages, {s['drains']} drains, "
            f"{s['preemptions']} spot preemptions; {s['requests_retried']} requests retried, "
            f"{s['requests_failed']} failed; capacity lost {s['capacity']['capacity_lost_fraction']:.1%}; {met}")
