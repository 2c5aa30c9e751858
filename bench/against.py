"""This checkout's simulator speed against another git revision's, measured in the same run.

    python bench/against.py REV [--requests 20000] [--rounds 5] [--scheduler chunked]

REV's tree is checked out into a temporary git worktree. Each round runs the same simulation once in
each tree, in fresh processes and alternating which goes first (the machine is shared and noisy:
interleaving spreads the noise over both). A simulation is the bundled chat scenario (Llama-3-8B,
H100, roofline) with `--requests` requests; the time is the simulating thread's CPU time
(`time.thread_time`) around `simulate()` alone, so imports and workload generation are not counted.
Prints min and median seconds per tree and their ratio (> 1: this checkout is faster).
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import sys, time
sys.path.insert(0, {root!r})
import numpy as np
from sim.config import load_scenario
from sim.simulate import simulate
from sim.workload import build_workload
sc = load_scenario({root!r} + "/scenarios/chat-llama3-8b-h100.yaml", overrides=[
    "engine.scheduler={scheduler}", "workload.num_requests={requests}",
    "engine.max_num_batched_tokens=16384"])
w = build_workload(sc.workload, np.random.default_rng(sc.seed))
t0 = time.thread_time()
r = simulate(sc, workload=w)
print(time.thread_time() - t0, r.summary["iterations"], r.summary["completed"])
"""


def once(root: Path, args) -> tuple[float, int]:
    code = CHILD.format(root=str(root), scheduler=args.scheduler, requests=args.requests)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=root).stdout.split()
    return float(out[0]), int(out[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rev", help="git revision to compare with, e.g. HEAD~3")
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--scheduler", default="chunked")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        other = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(other), args.rev], cwd=ROOT,
                       check=True, capture_output=True)
        try:
            times: dict[str, list[float]] = {"this": [], args.rev: []}
            iters = {}
            for i in range(args.rounds):
                order = [("this", ROOT), (args.rev, other)]
                for name, root in order if i % 2 == 0 else reversed(order):
                    t, iters[name] = once(root, args)
                    times[name].append(t)
                print(f"round {i + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()),
                      flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(other)], cwd=ROOT,
                           check=False, capture_output=True)
    print(f"\n{args.requests} requests, {args.scheduler}, simulate() CPU seconds over {args.rounds} rounds")
    for name, ts in times.items():
        print(f"  {name:<12} min {min(ts):.2f}  median {statistics.median(ts):.2f}  "
              f"({iters[name]} iterations)")
    ratio_min = min(times[args.rev]) / min(times["this"])
    ratio_med = statistics.median(times[args.rev]) / statistics.median(times["this"])
    print(f"  speed of this checkout vs {args.rev}: {ratio_min:.3f}x (min), {ratio_med:.3f}x (median)")


if __name__ == "__main__":
    main()
