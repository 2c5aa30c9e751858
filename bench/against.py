"""This checkout's simulator speed against another git revision's, measured in the same run.

    python bench/against.py REV [--requests 5000] [--rounds 30] [--scheduler chunked]
    python bench/against.py pure ...   # this checkout, compiled vs its own pure-Python source
    python bench/against.py REV --compiled ...   # both compiled (REV built by pip wheel, ~1 min)
    python bench/against.py REV --set cost_model=measured ...   # another cost model (both trees)

REV's tree is checked out into a temporary git worktree and one long-lived worker process per tree
imports its simulator once. This checkout runs as installed: compiled by mypyc where `pip install
-e .` built it (setup.py); REV's worktree has no extensions, so it runs as pure Python, unless
`--compiled` builds them: `pip wheel` on the worktree (setup.py's mypyc, in pip's isolated build
environment) and its extensions unpacked into it. `pure` is this checkout again under
SERVESIM_PURE_PYTHON=1.

Each round asks both workers for the same simulation, alternating which goes first (the machine is
shared and noisy: many short interleaved runs spread the noise over both, and the minimum of many
is a stable estimate of the undisturbed time). A simulation is the bundled
chat scenario (Llama-3-8B, H100, roofline) with `--requests` requests; the time is the simulating
thread's CPU time (`time.thread_time`) around `simulate()` alone. Prints min and median seconds per
tree and their ratio (> 1: this checkout is faster).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WORKER = """
import sys, time
sys.path.insert(0, {root!r})
import numpy as np
import os
# by the tree's files, not by trying imports: this checkout's editable install answers for any
# module name the other tree lacks
if os.path.exists({root!r} + "/sim/scenario.py"):
    from sim.scenario import load_scenario
    from sim.workload.generators import build_workload
elif os.path.exists({root!r} + "/sim/config/scenario.py"):  # before the scenario left sim/config/
    from sim.config.scenario import load_scenario
    from sim.workload.generators import build_workload
else:  # a revision from before sim/ was split into sub-packages
    from sim.config import load_scenario
    from sim.workload import build_workload
from sim.simulate import simulate
sc = load_scenario({root!r} + "/scenarios/chat-llama3-8b-h100.yaml", overrides=[
    "engine.scheduler={scheduler}", "workload.num_requests={requests}",
    "engine.max_num_batched_tokens=16384", *{sets!r}])
w = build_workload(sc.workload, np.random.default_rng(sc.seed))
import sim
print("compiled" if getattr(sim, "compiled", lambda: False)() else "pure Python", flush=True)
for _ in sys.stdin:  # one simulation per line read
    t0 = time.thread_time()
    r = simulate(sc, workload=w)
    print(time.thread_time() - t0, r.summary["iterations"], flush=True)
"""


def worker(root: Path, args, pure: bool = False) -> subprocess.Popen:
    code = WORKER.format(root=str(root), scheduler=args.scheduler, requests=args.requests, sets=list(args.set))
    env = {**os.environ, "SERVESIM_PURE_PYTHON": "1"} if pure else None
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=root, env=env)


def build(tree: Path, tmp: Path) -> None:
    """REV's compiled extensions, from a wheel of its tree, unpacked where its worker imports them."""
    print(f"building the compiled extensions of {tree.name} (pip wheel)...", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp / "wheel"), str(tree)],
                   check=True, capture_output=True)
    with zipfile.ZipFile(next((tmp / "wheel").glob("*.whl"))) as wheel:
        for name in wheel.namelist():
            if name.endswith(".so") or name.endswith("_compiled_sources.py"):
                wheel.extract(name, tree)


def once(proc: subprocess.Popen) -> tuple[float, int]:
    proc.stdin.write("run\n")
    proc.stdin.flush()
    out = proc.stdout.readline().split()
    return float(out[0]), int(out[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rev", help="git revision to compare with, e.g. HEAD~3; or `pure`")
    ap.add_argument("--requests", type=int, default=5_000)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--scheduler", default="chunked")
    ap.add_argument("--compiled", action="store_true", help="build REV's extensions too (pip wheel)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a scenario override for both trees, e.g. cost_model=measured (repeatable)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        pure = args.rev == "pure"
        other = ROOT if pure else Path(tmp) / "tree"
        if not pure:
            subprocess.run(["git", "worktree", "add", "--detach", str(other), args.rev], cwd=ROOT,
                           check=True, capture_output=True)
            if args.compiled:
                build(other, Path(tmp))
        procs = {"this": worker(ROOT, args), args.rev: worker(other, args, pure=pure)}
        try:
            times: dict[str, list[float]] = {"this": [], args.rev: []}
            iters = {}
            modes = {name: proc.stdout.readline().strip() for name, proc in procs.items()}
            for proc in procs.values():
                once(proc)  # warm-up: first-call costs (lazy imports, caches) are not counted
            for i in range(args.rounds):
                order = list(procs.items())
                for name, proc in order if i % 2 == 0 else reversed(order):
                    t, iters[name] = once(proc)
                    times[name].append(t)
        finally:
            for proc in procs.values():
                proc.stdin.close()
                proc.wait()
            if not pure:
                subprocess.run(["git", "worktree", "remove", "--force", str(other)], cwd=ROOT,
                               check=False, capture_output=True)
    sets = f", {' '.join(args.set)}" if args.set else ""
    print(f"\n{args.requests} requests, {args.scheduler}{sets}, simulate() CPU seconds over {args.rounds} rounds")
    for name, ts in times.items():
        print(f"  {name:<12} min {min(ts):.3f}  median {statistics.median(ts):.3f}  "
              f"({iters[name]} iterations, {modes[name]})")
    ratio_min = min(times[args.rev]) / min(times["this"])
    ratio_med = statistics.median(times[args.rev]) / statistics.median(times["this"])
    print(f"  speed of this checkout vs {args.rev}: {ratio_min:.3f}x (min), {ratio_med:.3f}x (median)")


if __name__ == "__main__":
    main()
