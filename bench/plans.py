"""The three plans a user waits for, this checkout against a base revision, measured in the same run.

    python bench/plans.py [--base 0717685] [--only quickstart,gpu-search,day] [--base-timeout 900]

Each plan is `servesim plan ...` as a user types it (the default cost model, all cores, progress
off), run by this checkout and by the base revision (a temporary git worktree, its simulator
compiled by mypyc as `pip install -e .` builds it: bench/against.py's `build`), one after the other,
interleaved plan by plan (this machine is shared: the order alternates, and CPU seconds, this
process's children, are printed beside the wall time). A base run past --base-timeout is stopped
and reported as "> timeout" (its ratio is then a lower bound). Prints per plan: wall and CPU seconds
of each, the ratio (base / this, > 1: this checkout is faster), the target (issue 54: quick start
< 30 s, the 70B GPU x TP search < 2 min, the day's fleet plan < 5 min, on 2 quiet cores) and each
one's answer, so that a faster plan is seen to answer as well (cheaper or equal at the same SLO).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.against import build  # noqa: E402

PLANS = {  # name: (arguments after `servesim plan`, target wall s on 2 cores)
    "quickstart": (["scenarios/quickstart.yaml", "--target-rate", "40"], 30.0),
    "gpu-search": (["scenarios/plan-llama3-70b-gpus.yaml", "--gpus", "h100-sxm,h200,a100-80gb", "--tp", "2,4,8",
                    "--target-rate", "40"], 120.0),
    "day": (["scenarios/day-autoscaling.yaml"], 300.0),
}
CLI = "import sys; sys.path.insert(0, {root!r}); import cli; sys.argv[0] = 'servesim'; cli.main_entry()"


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(tree: Path, args: list[str], out: Path, timeout: float) -> dict:
    """One plan in `tree`: wall and CPU seconds, exit status, and its answer from the files written.
    The scenario is this checkout's file for both (a base revision may not have it: the 70B one is
    new), and what it names (traces) beside it."""
    args = [str(ROOT / args[0]), *args[1:]]
    cpu0, t0 = children_cpu(), time.perf_counter()
    cmd = [sys.executable, "-c", CLI.format(root=str(tree)), "plan", *args, "--out", str(out), "-q"]
    try:
        proc = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "COLUMNS": "200"})
        code = proc.returncode
    except subprocess.TimeoutExpired:
        code = None
    wall, cpu = time.perf_counter() - t0, children_cpu() - cpu0
    return {"wall_s": wall, "cpu_s": cpu, "exit": code, "answer": answer(out) if code == 0 else None}


def answer(out: Path) -> str:
    """The plan's answer in one line, from the JSON it wrote."""
    if (out / "search.json").exists():
        c = json.loads((out / "search.json").read_text())["chosen"]
        return "none" if c is None else (f"{c['gpu']} TP{c['tensor_parallel_size']} x {c['replicas']}, "
                                         f"${c['usd_per_hour']:.2f}/hour")
    doc = json.loads((out / "plan.json").read_text())
    if "static" in doc:  # a fleet plan
        p, s = doc["policy"], doc["static"]
        q = (doc.get("scheduled") or {}).get("policy")
        best = min((x for x in (p, q) if x), key=lambda x: x["usd"], default=None)
        return (f"static {s['replicas']} (${s['usd']:.2f}); policy "
                + ("none" if best is None else f"${best['usd']:.2f}, target_in_flight {best['target_in_flight']:.3g}"))
    rec, cost = doc["recommendation"], doc["cost"]
    return (f"{rec['per_replica_load']:.2f} {rec['unit']} per replica, {rec['replicas']} replicas, "
            f"${cost['usd_per_hour']:.2f}/hour")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="0717685", help="the revision to compare with (default: the commit before "
                                                      "issue 54's work)")
    ap.add_argument("--only", default=",".join(PLANS), help="plans to run: " + ", ".join(PLANS))
    ap.add_argument("--base-timeout", type=float, default=900.0, help="stop a base plan after this many s")
    ap.add_argument("--no-base", action="store_true", help="this checkout only (the absolute times)")
    args = ap.parse_args()
    names = [n.strip() for n in args.only.split(",")]
    results: dict[str, dict[str, dict]] = {n: {} for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        base = tmp_path / "base"
        if not args.no_base:
            subprocess.run(["git", "worktree", "add", "--detach", str(base), args.base], cwd=ROOT, check=True,
                           capture_output=True)
            build(base, tmp_path)
        try:
            for i, name in enumerate(names):
                plan_args, _ = PLANS[name]
                trees = [("this", ROOT, 4 * PLANS[name][1])] + ([] if args.no_base else
                                                                [("base", base, args.base_timeout)])
                for label, tree, limit in trees if i % 2 == 0 else reversed(trees):
                    print(f"{name}: {label}...", file=sys.stderr, flush=True)
                    results[name][label] = run(tree, plan_args, tmp_path / f"{label}-{name}", limit)
        finally:
            if not args.no_base:
                subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=False,
                               capture_output=True)
    cores = len(os.sched_getaffinity(0))
    print(f"\n{cores} cores; this checkout against {args.base} (wall s, CPU s of the plan's processes)")
    print(f"{'plan':<12}{'this wall':>10}{'CPU':>8}{'base wall':>11}{'CPU':>8}{'ratio':>8}{'target':>8}  verdict")
    for name in names:
        t, b = results[name]["this"], results[name].get("base")
        target = PLANS[name][1]
        if b is None:
            ratio = "-"
            base_wall = base_cpu = "-"
        else:
            done = b["exit"] is not None
            ratio = f"{'' if done else '>'}{b['wall_s'] / t['wall_s']:.2f}x"
            base_wall = f"{'' if done else '>'}{b['wall_s']:.0f}"
            base_cpu = f"{b['cpu_s']:.0f}"
        ok = "under target" if t["exit"] == 0 and t["wall_s"] < target else "OVER TARGET"
        print(f"{name:<12}{t['wall_s']:>10.1f}{t['cpu_s']:>8.0f}{base_wall:>11}{base_cpu:>8}{ratio:>8}"
              f"{target:>8.0f}  {ok}")
    print("\nanswers:")
    for name in names:
        for label, r in results[name].items():
            said = r["answer"] or ("stopped at the timeout" if r["exit"] is None else f"exit {r['exit']}")
            print(f"  {name:<12}{label:<6}{said}")


if __name__ == "__main__":
    main()
