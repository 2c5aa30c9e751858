"""Simulator speed with prefix caching on vs off, measured in the same run.

    python bench/prefix_speed.py [--requests 5000] [--rounds 5]

The bundled chat scenario (Llama-3-8B, H100, chunked, roofline) with half the requests starting
with one of 4 system prompts of 512 tokens (`workload.prefix`), simulated with
`enable_prefix_caching` true and false, alternating, in this process. Prints min and median thread
CPU seconds of `simulate()` and the ratio (issue 17's target: caching on costs at most 20% more).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.scenario import load_scenario  # noqa: E402
from sim.simulate import simulate  # noqa: E402
from sim.workload.generators import build_workload  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    runs = {}
    for on in (True, False):
        sc = load_scenario(ROOT / "scenarios/chat-llama3-8b-h100.yaml", overrides=[
            f"workload.num_requests={args.requests}", "workload.prefix={tokens: 512, groups: 4, share: 0.5}",
            f"engine.enable_prefix_caching={str(on).lower()}"])
        runs[on] = (sc, build_workload(sc.workload, np.random.default_rng(sc.seed)))
    times: dict[bool, list[float]] = {True: [], False: []}
    hit = None
    for i in range(args.rounds):
        for on in ((True, False) if i % 2 == 0 else (False, True)):
            sc, w = runs[on]
            t0 = time.thread_time()
            r = simulate(sc, workload=w)
            times[on].append(time.thread_time() - t0)
            if on:
                hit = r.summary["prefix_cache_hit_rate"]
    print(f"{args.requests} requests, prefix cache hit rate {hit:.1%} when on")
    for on, ts in times.items():
        print(f"  caching {'on ' if on else 'off'}: min {min(ts):.3f} s  median {statistics.median(ts):.3f} s")
    print(f"  on / off: {min(times[True]) / min(times[False]):.3f}x (min), "
          f"{statistics.median(times[True]) / statistics.median(times[False]):.3f}x (median)")


if __name__ == "__main__":
    main()
