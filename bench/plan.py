"""Planner speed: wall time of a full `servesim plan` on the bundled chat scenario.

    python bench/plan.py [--scenario scenarios/chat-llama3-8b-h100.yaml] [--target-rate 50] [--workers N]

Prints the plan's wall time, its number of simulations and two baselines, both from this run:
- serial: one full simulation of the scenario as written (measured here), times the plan's number
  of simulations, i.e. the same work run one after another at the scenario's own size;
- naive scan: for the scenario's setting and for every setting on the engine curve, the 2% grid
  walked from the scenario's rate to the setting's first failing point, 3 seeds per point, plus the
  same cluster work: its simulation count times the plan's measured mean seconds per simulation
  (the count is exact, the time per simulation is the plan's).
The target is a full plan (load search, engine curve, cluster sizing) in under a minute on 2 cores.
It also prints the CPU seconds the plan used (this process and its workers): on a shared machine,
CPU seconds / cores is what the wall time would be with the cores to itself.
"""
from __future__ import annotations

import argparse
import math
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.planning.evaluator import PlanOptions
from sim.planning.parallel import default_workers
from sim.planning.planner import plan
from sim.scenario import load_scenario
from sim.simulate import simulate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default=str(ROOT / "scenarios/chat-llama3-8b-h100.yaml"))
    ap.add_argument("--target-rate", type=float, default=50.0, help="req/s to size a cluster for (0: none)")
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args()

    sc = load_scenario(args.scenario)
    t0 = time.perf_counter()
    simulate(sc)
    one = time.perf_counter() - t0

    options = PlanOptions(workers=args.workers)
    cpu0 = _cpu_s()
    t0 = time.perf_counter()
    r = plan(args.scenario, sc.slo, target=args.target_rate or None, options=options)
    wall = time.perf_counter() - t0
    cpu = _cpu_s() - cpu0
    cores = args.workers or default_workers()
    n = r["simulations"]
    per_sim = r["simulated_wall_s"] / n

    s, t, rec = r["load_search"], r["tradeoff"], r["recommendation"]
    r0 = s["curve"][0]["load"]
    scan = lambda nxt: abs(round(math.log(nxt / r0) / math.log1p(options.resolution))) + 1
    settings = {(e["max_num_seqs"], e["max_num_batched_tokens"]): e["next"]
                for e in t["max_num_seqs"] + t["max_num_batched_tokens"]}
    grid_points = sum(scan(nxt) for nxt in settings.values())
    cluster = sum(p["seeds"] for p in r.get("cluster", {}).get("tried", []))
    naive = 3 * grid_points + cluster

    print(f"scenario: {sc.name}; scenario's setting sustains {s['answer']:.2f} req/s per replica "
          f"(next step {s['next']:.2f} fails)")
    print("engine curve (max_num_seqs, max_num_batched_tokens: sustained req/s, goodput req/s): " + ", ".join(
        f"{e['max_num_seqs']},{e['max_num_batched_tokens']}: {e['sustained'] or 0:.2f}, {e['goodput_rps']:.2f}"
        for e in t["max_num_seqs"] + t["max_num_batched_tokens"]))
    print(f"chosen max_num_seqs {rec['max_num_seqs']}, max_num_batched_tokens {rec['max_num_batched_tokens']}: "
          f"{rec['per_replica_load']:.2f} req/s per replica; {rec['replicas']} replicas for "
          f"{args.target_rate:g} req/s")
    print("simulations by step: " + ", ".join(f"{k} {v}" for k, v in r["simulations_by_step"].items()))
    print(f"{'':<34}{'simulations':>12}{'wall s':>10}{'x plan':>9}")
    print(f"{'plan (parallel, adaptive seeds)':<34}{n:>12}{wall:>10.1f}{1.0:>9.2f}")
    print(f"{'  its simulations, serial sum':<34}{n:>12}{r['simulated_wall_s']:>10.1f}"
          f"{r['simulated_wall_s'] / wall:>9.2f}")
    print(f"{'serial: 1 full run x simulations':<34}{n:>12}{one * n:>10.1f}{one * n / wall:>9.2f}"
          f"   (one full run of the scenario: {one:.2f} s)")
    print(f"{'naive 2% scans, 3 seeds (est.)':<34}{naive:>12}{naive * per_sim:>10.1f}{naive * per_sim / wall:>9.2f}"
          f"   ({len(settings)} settings, {grid_points} grid points x 3 + {cluster} cluster runs, "
          f"{per_sim:.2f} s each)")
    print(f"plan CPU time {cpu:.1f} s on {cores} cores: {cpu / cores:.1f} s wall if the cores were idle; "
          f"load average now {os.getloadavg()[0]:.1f}")


def _cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


if __name__ == "__main__":
    main()
