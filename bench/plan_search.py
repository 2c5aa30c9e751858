"""Configuration-search speed: GPU types x TP sizes x engine settings on the bundled chat scenario.

    python bench/plan_search.py [--gpus h100-sxm,h200,a100-80gb,l40s] [--tp 1,2,4] [--target-rate 60]

Prints the search's wall time, CPU seconds (this process and its workers) and simulations, and a
naive full scan measured in the same run: one confirmed search (the plan's judge: Wilson bound,
the 2% grid, no bounds, no coarse pass) of one candidate, timed here; the naive scan runs that for
every (GPU, TP, setting), so its estimate is candidates x settings x that time (labelled estimated:
faster GPUs need no more simulations per search, the count per search varies by a few). Target
(issue 16): 4 GPUs x 3 TPs x knobs in under 3 minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.planning.config_search import search_configs  # noqa: E402
from sim.planning.evaluator import Evaluator, PlanOptions  # noqa: E402
from sim.planning.load_search import load_knob, max_load  # noqa: E402
from sim.scenario import SLOConfig  # noqa: E402


def cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", default=str(ROOT / "scenarios" / "chat-llama3-8b-h100.yaml"))
    ap.add_argument("--gpus", default="h100-sxm,h200,a100-80gb,l40s")
    ap.add_argument("--tp", default="1,2,4")
    ap.add_argument("--seqs", default="128,256")
    ap.add_argument("--tokens", default="2048,8192")
    ap.add_argument("--target-rate", type=float, default=60.0)
    a = ap.parse_args()
    slo, options = SLOConfig(ttft_ms=500, tpot_ms=50), PlanOptions()
    gpus, tps = a.gpus.split(","), [int(t) for t in a.tp.split(",")]
    seqs, tokens = [int(x) for x in a.seqs.split(",")], [int(x) for x in a.tokens.split(",")]

    c0, t0 = cpu_s(), time.perf_counter()
    r = search_configs(a.scenario, slo, gpus=gpus, tps=tps, target=a.target_rate, seqs=seqs, tokens=tokens,
                       options=options)
    search_wall, search_cpu = time.perf_counter() - t0, cpu_s() - c0
    statuses = [x.get("status") or "pruned" for x in r["candidates"]]

    # the naive scan's unit: one confirmed search of one candidate at the scenario's setting
    c0, t0 = cpu_s(), time.perf_counter()
    ev = Evaluator(a.scenario, slo, options=options)
    one = max_load(ev, load_knob(ev.scenario, ev.options), confirm=True)
    unit_wall, unit_cpu = time.perf_counter() - t0, cpu_s() - c0
    n = len(gpus) * len(tps) * len(seqs) * len(tokens)
    chosen = r["chosen"]
    print(f"scenario {Path(a.scenario).name}: {len(gpus)} GPUs x {len(tps)} TPs x {len(seqs) * len(tokens)} "
          f"settings = {n} configurations, target {a.target_rate:g} req/s")
    print(f"search:  {search_wall:6.1f} s wall, {search_cpu:6.1f} CPU s, {r['simulations']} simulations; "
          f"{statuses.count('confirmed')} confirmed, "
          f"{sum(s.startswith('coarse') for s in statuses)} left coarse, {statuses.count('pruned')} pruned")
    print(f"naive (estimated): {n} x one confirmed search ({unit_wall:.1f} s wall, {unit_cpu:.1f} CPU s, "
          f"{ev.simulations} simulations, measured now) = {n * unit_wall:6.1f} s wall, {n * ev.simulations} "
          "simulations")
    print(f"ratio naive / search: {n * unit_wall / search_wall:.1f}x wall, {n * unit_cpu / search_cpu:.1f}x CPU")
    print(f"answer: {chosen['gpu']} x {chosen['gpus']} (TP{chosen['tensor_parallel_size']}), "
          f"${chosen['usd_per_hour']:.2f}/hour; one-replica answer at the scenario's setting {one['answer']:.2f} req/s"
          if chosen else "answer: none")


if __name__ == "__main__":
    main()
