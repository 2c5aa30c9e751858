"""Simulator speed: phases (load, simulate, write), scaling and peak memory, 10k to 1M requests.

    python bench/sim_speed.py [--requests 10000,100000] [--baseline-requests 3000] [--million]

The workload is issue 19's: the bundled chat scenario (Llama-3-8B, H100, chunked, max_num_seqs 128,
max_num_batched_tokens 8192, Poisson 6 req/s, prompts lognormal 1155 +- 1100 max 4096, outputs
lognormal 211 +- 250 max 2048, roofline cost). Each size runs in a fresh child process, which
reports its peak RSS and times:
  load      load_scenario + build_workload (the requests drawn),
  simulate  simulate() (fast-forward, the default),
  write     write_outputs(): requests.csv and steps.csv by pyarrow (the default writer), and the same
            two frames by pandas' to_csv (the writer before), as the same-run baseline of this phase.
Times are CPU seconds of this thread (time.thread_time: the machine is shared and wall time lies)
and wall seconds. Same-run baseline of the simulate phase: this simulator stepping one SimPy event
per iteration (fast_forward=False) on --baseline-requests requests of the same workload, here.

Vidur is not run here (bench/vidur_same_run.py runs it beside servesim on these requests: its
install and cold start took ~23 min here the first time, each 100k run ~4 min). Its figure
below is that bench's, labelled: 100k of these requests in 239.31 s of CPU for Vidur 0.0.26's whole
process (median of 3, 2026-11-26, a later run than the first), i.e. 418 req/s. `--million` adds 1M requests
(without the pandas
baseline, whose text would count in its RSS).
"""
from __future__ import annotations

import argparse
import io
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import sim  # noqa: E402
from sim.scenario import load_scenario  # noqa: E402
from sim.simulate import simulate, write_outputs  # noqa: E402
from sim.workload.generators import build_workload  # noqa: E402

VIDUR_MEASURED_REQ_PER_S = 100_000 / 239.31  # bench/vidur_same_run.py, same machine kind, not this run
OVERRIDES = ["engine.scheduler=chunked", "engine.max_num_seqs=128", "engine.max_num_batched_tokens=8192",
             "workload.arrival.rate=6",
             "workload.prompt_tokens={dist: lognormal, mean: 1155, std: 1100, max: 4096}",
             "workload.output_tokens={dist: lognormal, mean: 211, std: 250, max: 2048}",
             "cost_model=roofline"]


def clocks():
    return time.thread_time(), time.perf_counter()


def since(start) -> tuple[float, float]:
    cpu, wall = clocks()
    return cpu - start[0], wall - start[1]


def measure(n: int, pandas_baseline: bool = True) -> dict:
    t = clocks()
    sc = load_scenario(ROOT / "scenarios/chat-llama3-8b-h100.yaml",
                       overrides=[*OVERRIDES, f"workload.num_requests={n}"])
    w = build_workload(sc.workload, np.random.default_rng(sc.seed))
    out = {"load": since(t)}
    t = clocks()
    result = simulate(sc, workload=w)
    out["simulate"] = since(t)
    with tempfile.TemporaryDirectory() as tmp:
        t = clocks()
        write_outputs(result, Path(tmp))
        out["write"] = since(t)
    # peak RSS of the process so far (MB): loaded, simulated, written; before the pandas baseline,
    # whose CSV text would count
    out["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if pandas_baseline:
        t = clocks()
        for frame in (result.requests, result.steps):  # the writer before, into memory (no disk)
            frame.to_csv(io.StringIO(), index=False)
        out["write_pandas"] = since(t)
    out["iterations"] = result.summary["iterations"]
    out["completed"] = result.summary["completed"]
    return out


def in_child(n: int, pandas_baseline: bool) -> dict:
    """measure(n) in a fresh process, so that its peak RSS is this size's alone."""
    cmd = [sys.executable, __file__, "--child", str(n)] + ([] if pandas_baseline else ["--no-pandas"])
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", default="10000,100000", help="comma-separated sizes")
    ap.add_argument("--baseline-requests", type=int, default=3000)
    ap.add_argument("--million", action="store_true", help="also 1M requests (no pandas baseline)")
    ap.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--no-pandas", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, pandas_baseline=not args.no_pandas)))
        return
    print("simulator:", "compiled by mypyc (setup.py)" if sim.compiled() else
          "pure Python (SERVESIM_PURE_PYTHON=1, or `pip install -e .` did not compile it)")
    print(f"{'requests':>9}{'iters':>10}{'load s':>8}{'simulate s':>12}{'write s':>9}{'pandas s':>10}"
          f"{'write x':>9}{'total s':>9}{'req/s':>9}{'x Vidur*':>10}{'RSS MB':>8}"
          "   (CPU s of the child's thread; wall in ())")
    sizes = [int(x) for x in args.requests.split(",")] + ([1_000_000] if args.million else [])
    for n in sizes:
        pandas = n < 1_000_000  # (a million rows' CSV text in memory: not worth the RAM)
        m = in_child(n, pandas)
        total = sum(m[k][0] for k in ("load", "simulate", "write"))
        wall = sum(m[k][1] for k in ("load", "simulate", "write"))
        rate = n / total
        baseline = (f"{m['write_pandas'][0]:>10.2f}{m['write_pandas'][0] / m['write'][0]:>9.1f}" if pandas
                    else f"{'-':>10}{'-':>9}")
        print(f"{n:>9}{m['iterations']:>10}{m['load'][0]:>8.2f}{m['simulate'][0]:>12.2f}{m['write'][0]:>9.2f}"
              f"{baseline}{total:>9.2f}{rate:>9.0f}{rate / VIDUR_MEASURED_REQ_PER_S:>10.1f}{m['rss_mb']:>8.0f}"
              f"   (wall {wall:.2f} s; {m['completed']} completed)")
    k = args.baseline_requests
    sc = load_scenario(ROOT / "scenarios/chat-llama3-8b-h100.yaml",
                       overrides=[*OVERRIDES, f"workload.num_requests={k}"])
    w = build_workload(sc.workload, np.random.default_rng(sc.seed))
    t = clocks()
    simulate(sc, workload=w, fast_forward=False)
    base_rate = k / since(t)[0]
    t = clocks()
    simulate(sc, workload=w)
    ff_rate = k / since(t)[0]
    print(f"simulate phase on {k} requests: fast-forward {ff_rate:.0f} req/s, stepping every "
          f"iteration {base_rate:.0f} req/s ({ff_rate / base_rate:.1f}x)")
    print(f"* Vidur: {VIDUR_MEASURED_REQ_PER_S:.0f} req/s, its whole process's CPU seconds on these requests "
          f"(bench/vidur_same_run.py on this machine kind, not this run; it measures both in one run)")


if __name__ == "__main__":
    main()
