"""servesim against published real-vLLM serving runs: per-stage error, summary medians, and the fit
of the engine-overhead parameters with leave-one-model-out (held-out) error.

    python bench/fidelity.py                      # the default cost model on every stage
    python bench/fidelity.py --fit                # fit the overheads, report fit and held-out error
    python bench/fidelity.py --set host_per_iteration_s=0.002 --only 70b

The runs (bench/data/vllm_h100_training.json, facts cited there): real vLLM V1 with prefix caching
on, H100 SXM, inference-perf's constant-rate load, 24 load stages of Llama-2-7B TP1, CodeLlama-34B
TP2, Llama-2-70B TP4 and Mixtral-8x7B TP2. How a stage is simulated (each point an assumption the
data forces; docs/validation.md):

* One request every 1/rate s, as many as the client sent, from an empty server; a stage that
  followed another on the same server (-s1) after a warm-up of each distinct prompt once, so the
  prefix cache starts as the real server's did, and judged on its own requests only.
* 100 distinct prompts (10 groups x 10), shuffled once and then sent in a fixed cycle, their
  lengths read off the measured prompt-length quantiles (inverse CDF at (k + 0.5) / 100); each
  prompt a chain of prefix ids, so a repeat hits vLLM's prefix cache as it did on the real server.
* Every request generates exactly `output_len` tokens (the client set ignore_eos).
* Engine: chunked prefill (vLLM V1), the stage's max_num_seqs and max_num_batched_tokens, block
  size 16, gpu_memory_utilization 0.9, prefix caching on, the stage's tensor-parallel size.
* Real TPOT = (E2E - TTFT) / (output_len - 1), servesim's definition (the client's own TPOT counted
  two stream messages per token); for the median, median E2E minus median TTFT.
* A stage is overloaded when its median TTFT is >= 1 s (real: 24-68 ms sustained, 91-112 s not).

Error is (sim - real) / real; the summary is the median |error| over the stages the real server
sustained. `--fit` searches the overhead parameters (sim/cost/overheads.py) on these stages by
simulating them, and, for each model, refits without that model's stages and reports the error on
them: the held-out figure is the honest one.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from calibrate.overheads import (  # noqa: E402
    FRONTEND_GRID,
    GRID,
    SATURATED_TTFT_S,
    SPREAD_GRID,
    Result,
    fit_spread,
    grid_points,
    request_times,
    sim_metrics,
    simulate_grid,
    step_time_error,
)

DATA = ROOT / "bench" / "data" / "vllm_h100_training.json"
PREFIX_ID_TOKENS = 16  # tokens per prefix id in the trace (one vLLM block): repeats hit in full
QUANTILE_P = {"min": 0.0, "p0.1": 0.001, "p1": 0.01, "p5": 0.05, "p10": 0.10, "p25": 0.25,
              "median": 0.50, "p75": 0.75, "p90": 0.90, "p95": 0.95, "p99": 0.99, "p99.9": 0.999,
              "max": 1.0}
METRICS = (("ttft_p50_ms", "TTFT p50 ms", 1), ("tpot_mean_ms", "TPOT mean ms", 2),
           ("tpot_p50_ms", "TPOT p50 ms", 2), ("e2e_p50_s", "E2E p50 s", 2), ("e2e_p90_s", "E2E p90 s", 2))
# every statistic the error band covers (sim/cost/error_band.py): metric -> label
ALL_METRICS = {"ttft_mean_ms": "TTFT mean", "ttft_p50_ms": "TTFT p50", "ttft_p90_ms": "TTFT p90",
               "ttft_p99_ms": "TTFT p99", "tpot_mean_ms": "TPOT mean", "tpot_p50_ms": "TPOT p50",
               "e2e_mean_s": "E2E mean", "e2e_p50_s": "E2E p50", "e2e_p90_s": "E2E p90", "e2e_p99_s": "E2E p99"}
# the summary's three figures (issue 33's gate): metric -> label
HEADLINE = {"tpot_mean_ms": "TPOT mean", "e2e_p50_s": "E2E p50", "ttft_p50_ms": "TTFT p50"}


def load_runs(path: Path = DATA) -> dict:
    return json.loads(path.read_text())


def prompt_lengths(stage: dict) -> np.ndarray:
    """The distinct prompts' lengths, read off the measured quantiles (inverse CDF at (k+0.5)/n)."""
    q = stage["prompt_len"]
    pts = sorted((QUANTILE_P[k], float(v)) for k, v in q.items() if k in QUANTILE_P)
    ps = np.array([p for p, _ in pts])
    vs = np.maximum.accumulate(np.array([v for _, v in pts]))
    n = stage["distinct_prompts"]
    return np.maximum(1, np.rint(np.interp((np.arange(n) + 0.5) / n, ps, vs))).astype(int)


def follows(stage: dict) -> bool:
    """Whether the stage ran on a server that had served an earlier stage: inference-perf runs an
    experiment's load stages back to back against one server with the same prompts (stage names
    end -s0, -s1, ...), so from the second stage on every prompt is already in the prefix cache."""
    return not stage["stage"].endswith("-s0")


# the warm-up a later stage starts after: each distinct prompt once, one every 1/rate s, then
# this long for them to finish (their E2E is at most ~7 s here) before the stage's first request
WARM_GAP_S = 60.0


def stage_start(stage: dict) -> float:
    """When the stage's own requests begin in its trace (s): after the warm-up, if any."""
    warm = int(stage["distinct_prompts"]) if follows(stage) else 0
    return (warm - 1) / stage["rate"] + WARM_GAP_S if warm else 0.0


def write_trace(stage: dict, path: Path, seed: int = 0) -> None:
    """The stage's requests as a Mooncake JSONL trace with hash_ids (one id per 16 tokens); a stage
    that followed another (follows()) first sends each distinct prompt once, so the prefix cache
    holds them as the real server's did; its own requests begin at stage_start()."""
    lengths = prompt_lengths(stage)
    order = np.random.default_rng(seed).permutation(len(lengths))  # shuffled once, then cycled
    rate, n, out = stage["rate"], int(stage["requests"]), int(stage["output_len"])
    warm = len(order) if follows(stage) else 0
    start = stage_start(stage)
    lines = []
    for k in range(-warm, n):
        j = int(order[k % len(order)])
        ids = [j * 10_000 + b for b in range(math.ceil(int(lengths[j]) / PREFIX_ID_TOKENS))]
        t = (k + warm) / rate if k < 0 else start + k / rate
        lines.append(json.dumps({"timestamp": round(t * 1000.0, 6), "input_length": int(lengths[j]),
                                 "output_length": out, "hash_ids": ids}))
    path.write_text("\n".join(lines) + "\n")


def model_value(runs: dict, key: str, folder: Path):
    """A preset where servesim has one of that name, else the checkpoint's config.json numbers."""
    from sim.presets.models import MODEL_PRESETS
    if key in MODEL_PRESETS:
        return key
    cfg = dict(runs["models"][key])
    cfg["architectures"] = ["MixtralForCausalLM" if cfg.get("model_type") == "mixtral" else "LlamaForCausalLM"]
    path = folder / f"{key}.config.json"
    path.write_text(json.dumps(cfg))
    return {"hf_config": str(path), "name": key}


def scenario_dict(stage: dict, model, trace: Path, measured: dict) -> dict:
    eng = stage["engine"]
    return {"name": "fidelity-" + stage["stage"], "seed": 0, "model": model, "hardware": "h100-sxm",
            "cost_model": {"measured": dict(measured)} if measured else None,
            "engine": {"scheduler": "chunked", "max_num_seqs": int(eng["max_num_seqs"]),
                       "max_num_batched_tokens": int(eng["max_num_batched_tokens"]), "block_size": 16,
                       "gpu_memory_utilization": 0.9, "tensor_parallel_size": int(stage["tensor_parallel_size"]),
                       "enable_prefix_caching": True},
            "workload": {"trace": str(trace), "format": "mooncake", "hash_block_tokens": PREFIX_ID_TOKENS}}


def real_metrics(stage: dict) -> dict:
    n = int(stage["output_len"])
    ttft, e2e = stage["ttft_s"], stage["e2e_s"]
    return {"ttft_p50_ms": 1e3 * ttft["median"], "tpot_mean_ms": 1e3 * (e2e["mean"] - ttft["mean"]) / (n - 1),
            "tpot_p50_ms": 1e3 * (e2e["median"] - ttft["median"]) / (n - 1),
            "e2e_p50_s": e2e["median"], "e2e_p90_s": e2e["p90"],
            "ttft_mean_ms": 1e3 * ttft["mean"], "ttft_p90_ms": 1e3 * ttft["p90"], "ttft_p99_ms": 1e3 * ttft["p99"],
            "e2e_mean_s": e2e["mean"], "e2e_p99_s": e2e["p99"]}


def real_overloaded(stage: dict) -> bool:
    return stage["ttft_s"]["median"] >= SATURATED_TTFT_S or stage["failures"] > 0.01 * stage["requests"]


def simulate_stage(runs: dict, stage: dict, measured: dict, folder: Path, keep_times: bool = False) -> Result:
    """One stage simulated with `measured` as the cost model's options (None: the default)."""
    from sim.scenario import scenario_from_dict
    from sim.simulate import simulate
    folder.mkdir(parents=True, exist_ok=True)
    trace = folder / f"{stage['stage']}.jsonl"
    if not trace.exists():
        write_trace(stage, trace)
    start = stage_start(stage)
    sc = scenario_from_dict(scenario_dict(stage, model_value(runs, stage["model"], folder), trace, measured),
                            base_dir=folder)
    t0 = time.perf_counter()
    result = simulate(sc)
    requests = result.requests[result.requests["arrival_s"] >= start - 1e-9]  # the stage's own
    sim = sim_metrics(requests)
    return Result(stage, real_metrics(stage), sim, real_overloaded(stage),
                  sim["ttft_p50_ms"] >= 1e3 * SATURATED_TTFT_S, time.perf_counter() - t0,
                  times=request_times(requests) if keep_times else None)


def _one(args):
    runs, stage, measured, folder, keep = args
    return simulate_stage(runs, stage, measured, Path(folder), keep)


def simulate_stages(runs: dict, stages: list[dict], measured: dict | None, folder: Path,
                    jobs: int = 1, pool=None, keep_times: bool = False) -> list[Result]:
    """Every stage's Result, in the order given (on `pool`, or across `jobs` processes)."""
    work = [(runs, s, measured, str(folder), keep_times) for s in stages]
    if pool is None and jobs <= 1:
        return [_one(w) for w in work]
    if pool is not None:
        return list(pool.map(_one, work))
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs) as p:
        return list(p.map(_one, work))


def summarise(results: list[Result]) -> dict:
    sustained = [r for r in results if not r.real_overloaded]
    med = {k: float(np.median([abs(r.error[k]) for r in sustained])) if sustained else float("nan")
           for k, _, _ in METRICS}
    wrong = [r.info["stage"] for r in results if r.sim_overloaded != r.real_overloaded]
    return {"median_abs_error": med, "misclassified": wrong, "stages": len(results),
            "sustained": len(sustained)}


def signed(results: list[Result]) -> dict:
    """Per metric over the sustained stages: the signed and the absolute median error (signed < 0:
    the simulation is fast), overall and per model."""
    sustained = [r for r in results if not r.real_overloaded]
    groups = {"all": sustained}
    for r in sustained:
        groups.setdefault(r.info["model"], []).append(r)
    return {g: {k: {"signed": float(np.median([r.error[k] for r in rs])),
                    "abs": float(np.median([abs(r.error[k]) for r in rs]))}
                for k in ALL_METRICS if all(k in r.error for r in rs)}
            for g, rs in groups.items() if rs}


def signed_table(results: list[Result]) -> str:
    """signed() as a table: rows the models (and all), columns each metric's signed / |median|."""
    s = signed(results)
    keys = list(ALL_METRICS)
    w = max(len(g) for g in s)
    lines = [f"{'median error':<{w}} " + " ".join(f"{ALL_METRICS[k]:>13}" for k in keys),
             f"{'(signed |abs|)':<{w}} " + " ".join(f"{'':>13}" for _ in keys)]
    for g, m in s.items():
        lines.append(f"{g:<{w}} " + " ".join(
            f"{pct(m[k]['signed']):>6} {100 * m[k]['abs']:>5.0f}%" if k in m else f"{'':>13}" for k in keys))
    return "\n".join(lines)


def band_coverage(heldout: list[Result]) -> dict:
    """How often the error band (sim/cost/error_band.py) holds on a model it never saw: per metric,
    each model's sustained stages judged against the band built from the other models' held-out
    errors (leave one model out twice over). Returns per metric: coverage (fraction of stages whose
    real value falls inside) and the median half-width of the band (relative to the simulated
    value)."""
    from sim.cost.error_band import interval
    sustained = [r for r in heldout if not r.real_overloaded]
    models = sorted({r.info["model"] for r in sustained})
    out = {}
    for k in ALL_METRICS:
        inside, widths = [], []
        for g in models:
            others = np.array([r.error[k] for r in sustained if r.info["model"] != g])
            lo, hi = interval(others)  # log(real / sim)
            for r in sustained:
                if r.info["model"] == g:
                    ratio = r.real[k] / r.sim[k]
                    inside.append(math.exp(lo) <= ratio <= math.exp(hi))
                    widths.append((math.exp(hi) - math.exp(lo)) / 2)
        out[k] = {"coverage": round(float(np.mean(inside)), 3), "median_half_width": round(float(np.median(widths)), 4),
                  "stages": len(inside)}
    return out


def coverage_line(c: dict) -> str:
    return ", ".join(f"{ALL_METRICS[k]} {100 * v['coverage']:.0f}% (+-{100 * v['median_half_width']:.0f}%)"
                     for k, v in c.items())


def pct(x: float) -> str:
    return f"{100 * x:+.0f}%" if math.isfinite(x) else ""


def num(v: float, decimals: int) -> str:
    return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.{decimals}f}"


def table(results: list[Result]) -> str:
    w = max(len(r.info["stage"]) for r in results)
    head = f"{'stage':<{w}} {'req/s':>5} " + " ".join(f"{label:>24}" for _, label, _ in METRICS) + "  real/sim"
    sub = f"{'':<{w}} {'':>5} " + " ".join(f"{'real':>8}{'sim':>8}{'err':>8}" for _ in METRICS)
    lines = [head, sub]
    for r in results:
        cells = [f"{num(r.real[k], d):>8}{num(r.sim[k], d):>8}{pct(r.error[k]):>8}" for k, _, d in METRICS]
        state = lambda o: "overload" if o else "stable"  # noqa: E731
        flag = "" if r.sim_overloaded == r.real_overloaded else "  <- mis-classified"
        lines.append(f"{r.info['stage']:<{w}} {r.info['rate']:>5g} " + " ".join(cells)
                     + f"  {state(r.real_overloaded)}/{state(r.sim_overloaded)}{flag}")
    return "\n".join(lines)


def summary_line(s: dict) -> str:
    m = s["median_abs_error"]
    parts = ", ".join(f"{label} {100 * m[k]:.1f}%" for k, label in HEADLINE.items())
    wrong = s["misclassified"]
    return (f"median |error| over {s['sustained']} sustained stages: {parts}; "
            f"{len(wrong)} of {s['stages']} stages mis-classified" + (f" ({', '.join(wrong)})" if wrong else ""))


def parse_set(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, _, value = item.partition("=")
        if not key or not value:
            raise SystemExit(f"error: --set {item!r}: expected KEY=VALUE")
        out[key] = yaml.safe_load(value)
    return out


def run_fit(runs: dict, stages: list[dict], folder: Path, jobs: int, progress=print) -> dict:
    """Simulate every grid point on the sustained stages, fit on all of them and leaving each model
    out; the fitted parameters, the fit's and the held-out per-stage results."""
    sustained = [s for s in stages if not real_overloaded(s)]
    t0 = time.time()
    with concurrent.futures.ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        fit = simulate_grid(lambda measured: simulate_stages(runs, sustained, measured, folder, pool=pool,
                                                             keep_times=True),
                            progress, spread=True)
    params, value = fit.best()
    heldout, per_model = [], {}
    for model, p, results in fit.held_out(lambda r: r.info["model"]):
        per_model[model] = p
        heldout += results
    return {"params": params, "loss": value, "fit": fit.results(params), "heldout": heldout,
            "per_model": per_model, "grid_points": len(fit.per_point), "wall_s": time.time() - t0}


def run_spread_fit(runs: dict, stages: list[dict], folder: Path, jobs: int, progress=print) -> dict:
    """The spread alone (calibrate/overheads.fit_spread) on the deterministic fit already written
    (the defaults file's overheads, and each leave-one-model-out fold's): each distinct point
    simulated once with its runs' times kept, the spread fitted on all stages and on each fold's
    training models, the held-out model predicted with its fold's. As run_fit returns."""
    from calibrate.overheads import point_key, with_spread
    from sim.cost.overheads import DEFAULTS_FILE
    doc = yaml.safe_load(DEFAULTS_FILE.read_text())
    det = lambda p: {k: v for k, v in p.items() if k not in ("frontend_cv", "stall_rate_per_s", "stall_s")}  # noqa: E731
    whole = det(doc["overheads"])
    folds = {m: det(p) for m, p in doc["leave_one_model_out"]["fitted_without"].items()}
    sustained = [s for s in stages if not real_overloaded(s)]
    t0 = time.time()
    simulated: dict[str, list[Result]] = {}
    with concurrently_pool(jobs) as pool:
        for p in [whole, *folds.values()]:
            key = point_key(p)
            if key not in simulated:
                measured = {**{k: p[k] for k in ("async_scheduling", "host_per_iteration_s", "per_iteration_s",
                                                 "tp_sync_per_iteration_s")},
                            "frontend_s": 0.0, "frontend_per_prompt_token_s": 0.0, "frontend_cv": 0.0,
                            "stall_rate_per_s": 0.0, "stall_s": 0.0}
                simulated[key] = simulate_stages(runs, sustained, measured, folder, pool=pool, keep_times=True)
                progress(f"  simulated {json.dumps({k: p[k] for k in measured if k in p})}: {time.time() - t0:.0f} s")
    params = fit_spread(simulated[point_key(whole)], whole)
    heldout, per_model = [], {}
    for model, p in folds.items():
        mine = simulated[point_key(p)]
        fold = fit_spread([r for r in mine if r.info["model"] != model], p)
        per_model[model] = fold
        heldout += [Result(r.info, r.real, with_spread(r, fold), r.real_overloaded, r.sim_overloaded, r.wall_s)
                    for r in mine if r.info["model"] == model]
    fit = [Result(r.info, r.real, with_spread(r, params), r.real_overloaded, r.sim_overloaded, r.wall_s)
           for r in simulated[point_key(whole)]]
    order = {s["stage"]: i for i, s in enumerate(sustained)}
    heldout.sort(key=lambda r: order[r.info["stage"]])
    return {"params": params, "loss": None, "fit": fit, "heldout": heldout, "per_model": per_model,
            "grid_points": len(simulated), "wall_s": time.time() - t0}


def concurrently_pool(jobs: int):
    return concurrent.futures.ProcessPoolExecutor(max_workers=max(1, jobs))


def write_defaults(fitted: dict, runs: dict, path: Path) -> None:
    """The fitted overheads as sim/cost/overheads.py's defaults file, with where they came from."""
    from sim.cost.overheads import OVERHEAD_KEYS
    from sim.files import write_file
    fit_s, held_s = summarise(fitted["fit"]), summarise(fitted["heldout"])
    rnd = lambda m: {k: round(v, 4) for k, v in m.items()}  # noqa: E731
    doc = {
        "about": ("vLLM V1's engine overheads on top of kernel-table step costs (sim/cost/overheads.py), "
                  "fitted by `python bench/fidelity.py --fit --write` to real vLLM serving on H100 SXM: "
                  f"{runs['repository']} at {runs['commit'][:7]} (bench/data/vllm_h100_training.json), "
                  "the stages the real server sustained. Held-out: each model's stages predicted with "
                  "the overheads fitted on the other models' (leave one model out)."),
        "overheads": {k: fitted["params"][k] for k in OVERHEAD_KEYS},
        "fit": {"stages": fit_s["sustained"], "median_abs_error": rnd(fit_s["median_abs_error"]),
                "grid": {k: list(v) for k, v in GRID.items()},
                "frontend_grid_s": [float(FRONTEND_GRID[0]), float(FRONTEND_GRID[-1]), 1e-4],
                "spread_grid": {"frontend_cv": list(SPREAD_GRID["frontend_cv"]),
                                "stalls_rate_per_s_and_s": [list(x) for x in SPREAD_GRID["stalls"]]}},
        "leave_one_model_out": {"median_abs_error": rnd(held_s["median_abs_error"]),
                                "step_time_error": step_time_error(fitted["heldout"]),
                                # each sustained stage's held-out signed error per statistic: the
                                # error band's basis (sim/cost/error_band.py)
                                "signed_error": {k: {r.info["stage"]: round(r.error[k], 4) for r in fitted["heldout"]
                                                     if not r.real_overloaded} for k in ALL_METRICS},
                                "signed_median": {k: round(v["signed"], 4) for k, v in
                                                  signed(fitted["heldout"])["all"].items()},
                                "band_coverage": band_coverage(fitted["heldout"]),
                                "fitted_without": fitted["per_model"]},
    }
    write_file(path, yaml.safe_dump(doc, sort_keys=False, width=100))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="stages whose name contains this")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a cost_model.measured option (repeatable), e.g. host_per_iteration_s=0.002")
    ap.add_argument("--fit", action="store_true", help="fit the engine overheads (leave-one-model-out too)")
    ap.add_argument("--fit-spread", action="store_true",
                    help="refit only the request-time spread (frontend_cv, stalls) on the overheads already "
                         "fitted (their points simulated once; minutes, not the grid's 20)")
    ap.add_argument("--write", action="store_true", help="with --fit: write them as the defaults "
                    "(sim/profiles/vllm_v1_overheads.yaml)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", type=Path, help="also write the per-stage results here")
    args = ap.parse_args(argv)
    if args.write and not (args.fit or args.fit_spread):
        print("error: --write needs --fit or --fit-spread", file=sys.stderr)
        return 2
    runs = load_runs()
    stages = [s for s in runs["stages"] if args.only in s["stage"]]
    if not stages:
        print(f"error: --only {args.only!r}: no stage name contains it", file=sys.stderr)
        return 2
    measured = parse_set(args.set)
    t0 = time.time()
    source = f"real vLLM on H100 SXM ({runs['repository']}@{runs['commit'][:7]})"
    with tempfile.TemporaryDirectory(prefix="servesim-fidelity-") as tmp:
        if args.fit or args.fit_spread:
            if args.fit:
                print(f"fitting the engine overheads to {source}: {len(grid_points())} grid points x "
                      f"{sum(not real_overloaded(s) for s in stages)} sustained stages", flush=True)
                fitted = run_fit(runs, stages, Path(tmp), args.jobs, progress=lambda m: print(m, flush=True))
            else:
                print(f"fitting the request-time spread to {source} on the fitted overheads", flush=True)
                fitted = run_spread_fit(runs, stages, Path(tmp), args.jobs, progress=lambda m: print(m, flush=True))
            print(f"fitted: {json.dumps(fitted['params'])}")
            print("fit (all models):\n" + table(fitted["fit"]))
            print("fit: " + summary_line(summarise(fitted["fit"])))
            print("held out (each model predicted with the overheads fitted on the other three):\n"
                  + table(fitted["heldout"]))
            for model, p in fitted["per_model"].items():
                print(f"  without {model}: {json.dumps(p)}")
            print("held out: " + summary_line(summarise(fitted["heldout"])))
            print("held out, signed (< 0: fast) and absolute median error per metric:\n"
                  + signed_table(fitted["heldout"]))
            print("error band on a model it never saw (coverage, median half-width): "
                  + coverage_line(band_coverage(fitted["heldout"])))
            if args.write:
                from sim.cost.overheads import DEFAULTS_FILE
                write_defaults(fitted, runs, DEFAULTS_FILE)
                print(f"wrote {DEFAULTS_FILE.relative_to(ROOT)}")
            return 0
        results = simulate_stages(runs, stages, measured or None, Path(tmp), args.jobs)
    print(f"servesim vs {source}, cost model: measured"
          + (f" with {json.dumps(measured)}" if measured else " (default)"))
    print(table(results))
    s = summarise(results)
    print(summary_line(s) + f"; {time.time() - t0:.0f} s")
    print("signed (< 0: fast) and absolute median error per metric:\n" + signed_table(results))
    if args.json:
        args.json.write_text(json.dumps({"summary": s, "stages": [
            {"stage": r.info["stage"], "real": r.real, "sim": r.sim, "error": r.error,
             "real_overloaded": r.real_overloaded, "sim_overloaded": r.sim_overloaded} for r in results]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
