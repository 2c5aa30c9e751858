"""Simulator speed: simulated requests per wall-second, and peak memory at a million requests.

    python bench/sim_speed.py [--requests 100000] [--baseline-requests 5000] [--million]

The workload is the bundled chat scenario (Llama-3-8B, H100, roofline cost, Poisson 6 req/s,
lognormal prompts and outputs). The baseline, measured in the same run, is the same simulator
stepping one SimPy event per iteration (fast_forward=False) on the first `--baseline-requests`
requests; the ratio is fast-forward's requests/s over the baseline's. For scale the table also
prints the ratio to Vidur's published ~575 requests/s (100k requests in ~174 s), a figure NOT
measured here. `--million` reruns 1M requests in a child process and reports its peak RSS.
"""
from __future__ import annotations

import argparse
import dataclasses
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.config import load_scenario  # noqa: E402
from sim.simulate import simulate  # noqa: E402
from sim.workload import build_workload  # noqa: E402

VIDUR_REQ_PER_S = 575.0  # published: 100k requests in ~174 s on a comparable machine


def scenario(scheduler: str, num_requests: int):
    sc = load_scenario(ROOT / "scenarios/chat-llama3-8b-h100.yaml",
                       overrides=[f"engine.scheduler={scheduler}", f"workload.num_requests={num_requests}",
                                  "engine.max_num_batched_tokens=16384"])
    return sc, build_workload(sc.workload, np.random.default_rng(sc.seed))


def timed(sc, workload, fast_forward: bool) -> tuple[float, dict]:
    t0 = time.perf_counter()
    result = simulate(sc, workload=workload, fast_forward=fast_forward)
    return time.perf_counter() - t0, result.summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--baseline-requests", type=int, default=5_000)
    ap.add_argument("--million", action="store_true", help="also measure 1M requests' peak memory")
    ap.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        sc, w = scenario("chunked", args.child)
        wall, s = timed(sc, w, True)
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"{args.child} {wall:.2f} {peak_mb:.0f} {s['completed']}")
        return
    print(f"{'scheduler':<11}{'requests':>9}{'wall s':>9}{'req/s':>10}{'iters':>10}"
          f"{'baseline req/s':>16}{'x baseline':>11}{'x Vidur*':>9}")
    for scheduler in ("continuous", "chunked"):
        sc, w = scenario(scheduler, args.requests)
        wall, s = timed(sc, w, True)
        base_sc = dataclasses.replace(sc)
        bw = dataclasses.replace(w, **{f: getattr(w, f)[: args.baseline_requests]
                                       for f in ("arrival_s", "prompt_tokens", "output_tokens", "priority")})
        base_wall, _ = timed(base_sc, bw, False)
        rate, base_rate = args.requests / wall, args.baseline_requests / base_wall
        print(f"{scheduler:<11}{args.requests:>9}{wall:>9.2f}{rate:>10.0f}{s['iterations']:>10}"
              f"{base_rate:>16.0f}{rate / base_rate:>11.1f}{rate / VIDUR_REQ_PER_S:>9.1f}")
    print("* Vidur's ~575 req/s is its published figure, not measured in this run.")
    if args.million:
        out = subprocess.run([sys.executable, __file__, "--child", "1000000"], capture_output=True,
                             text=True, check=True).stdout.split()
        print(f"1M requests (chunked): {float(out[1]):.1f} s wall, peak RSS {float(out[2]):.0f} MB, "
              f"{out[3]} completed")


if __name__ == "__main__":
    main()
