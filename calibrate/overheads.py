"""Fit vLLM's engine overheads (sim/cost/overheads.py) to measured serving runs, by simulating them.

Used by `bench/fidelity.py --fit` (the published H100 runs: the shipped defaults) and by
`servesim calibrate --from-bench` (a user's own `vllm bench serve` results). A run is a `Case`: its
measured metrics and a way to simulate it with given overheads. The fit simulates every case at
every point of GRID (the per-iteration terms change the engine's dynamics, so each needs its own
simulation), and solves `frontend_s` on each point without simulating (it shifts TTFT and E2E by a
constant). The loss is the mean |error| of mean TPOT, median E2E and median TTFT over the cases the
real server sustained, plus 1 per case mis-classified (simulated overloaded while the real server
kept up, or the reverse): no gain in error is worth that. Ties go to the first grid point, the
smallest overheads.
"""
from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from sim.config.checks import _int, check_input_file
from sim.config.errors import ScenarioError
from sim.presets.hardware import HARDWARE_PRESETS
from sim.presets.models import MODEL_PRESETS

SATURATED_TTFT_S = 1.0  # a run whose median TTFT reaches this did not keep up (real and simulated)
# The grid searched (seconds). host_per_iteration_s hides under GPU work: only runs whose iterations
# are shorter than it can tell it apart from 0.
GRID = {"async_scheduling": (False, True), "host_per_iteration_s": (0.0, 8e-3),
        "per_iteration_s": (0.0, 0.25e-3, 0.5e-3, 0.75e-3, 1e-3),
        "tp_sync_per_iteration_s": (0.0, 0.25e-3, 0.5e-3, 1e-3)}
# On a fitted (v1) profile, whose iterations were timed whole on the engine (their host work in
# them), no host floor is searched: the lag, what the server adds per iteration beyond the timed
# engine (wider: a CPU server's API process shares the cores), and the frontend (solved).
PROFILE_GRID = {"async_scheduling": (False, True),
                "per_iteration_s": tuple(round(0.25e-3 * i, 7) for i in range(9))}  # 0 to 2 ms
FRONTEND_GRID = np.round(np.arange(0.0, 20.0001e-3, 0.1e-3), 7)  # frontend_s candidates, s
FIT_METRICS = ("tpot_mean_ms", "e2e_p50_s", "ttft_p50_ms")  # their mean |error| is minimised


@dataclass
class Result:
    """One run, measured (`real`) and simulated (`sim`): ttft_p50_ms, tpot_mean_ms, tpot_p50_ms,
    e2e_p50_s, e2e_p90_s. `info` names it: at least "stage" (its name) and "model"."""
    info: dict
    real: dict
    sim: dict
    real_overloaded: bool
    sim_overloaded: bool
    wall_s: float = 0.0
    # the simulated requests' times without frontend or spread (arrival_s, first_token_s, finish_s,
    # replica, prompt_tokens, output_tokens): what fit_spread draws the spread on; None: not kept
    times: dict | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.info["stage"]

    @property
    def error(self) -> dict:
        return {k: (self.sim[k] - self.real[k]) / self.real[k] for k in self.real}


def sim_metrics(requests) -> dict:
    """The metrics from a run's requests frame (requests.csv): the five fitted on, and the
    tails and means that the error band covers (TTFT mean/p90/p99, E2E mean/p99)."""
    tpot = requests["tpot_s"].dropna()
    ttft, e2e = requests["ttft_s"].dropna(), requests["e2el_s"].dropna()
    return {"ttft_p50_ms": 1e3 * float(ttft.median()), "tpot_mean_ms": 1e3 * float(tpot.mean()),
            "tpot_p50_ms": 1e3 * float(tpot.median()), "e2e_p50_s": float(e2e.median()),
            "e2e_p90_s": float(e2e.quantile(0.9)),
            "ttft_mean_ms": 1e3 * float(ttft.mean()), "ttft_p90_ms": 1e3 * float(ttft.quantile(0.9)),
            "ttft_p99_ms": 1e3 * float(ttft.quantile(0.99)), "e2e_mean_s": float(e2e.mean()),
            "e2e_p99_s": float(e2e.quantile(0.99))}


TIME_COLUMNS = ("arrival_s", "first_token_s", "finish_s", "replica", "prompt_tokens", "output_tokens")


def request_times(requests) -> dict:
    """The columns of requests.csv fit_spread needs, as arrays."""
    return {c: requests[c].to_numpy() for c in TIME_COLUMNS}


# The spread searched after the deterministic fit (sim/cost/overheads.py): frontend_cv, and stalls
# (rate per s, mean length s); each run drawn with the same generator at every point (common random
# numbers: the loss changes with the parameters, not with the draws)
SPREAD_GRID = {"frontend_cv": (0.0, 0.25, 0.5, 0.75, 1.0, 1.5),
               "stalls": ((0.0, 0.0),) + tuple((rate, mean) for rate in (0.01, 0.02, 0.05, 0.1, 0.2)
                                                for mean in (0.05, 0.1, 0.2, 0.4, 0.8))}
# the statistics the spread is fitted on: every TTFT and E2E statistic the error band covers
SPREAD_METRICS = ("ttft_p50_ms", "ttft_mean_ms", "ttft_p90_ms", "ttft_p99_ms",
                  "e2e_p50_s", "e2e_mean_s", "e2e_p90_s", "e2e_p99_s", "tpot_mean_ms")


def with_spread(r: Result, params: dict, seed: int = 0) -> dict:
    """The run's simulated metrics with `params`' frontend and spread drawn on its kept times (as
    simulate() would, with generator `seed`)."""
    from sim.cost.overheads import EngineOverheads
    t = r.times
    assert t is not None, "with_spread needs the run's request times"
    o = EngineOverheads(frontend_s=params["frontend_s"], frontend_cv=params.get("frontend_cv", 0.0),
                        stall_rate_per_s=params.get("stall_rate_per_s", 0.0), stall_s=params.get("stall_s", 0.0))
    first, finish = t["first_token_s"].astype(float), t["finish_s"].astype(float)
    on_first, on_finish = o.shifts(t["arrival_s"], t["prompt_tokens"], first, finish, t["replica"],
                                   np.random.default_rng(seed))
    ttft = first + on_first - t["arrival_s"]
    e2e = finish + on_finish - t["arrival_s"]
    n = t["output_tokens"]
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(n > 1, (e2e - ttft) / (n - 1), np.nan)
    import pandas as pd
    return sim_metrics(pd.DataFrame({"ttft_s": ttft, "e2el_s": e2e, "tpot_s": tpot}))


def spread_loss(results: list[Result], params: dict) -> float:
    errs = []
    for r in results:
        if r.real_overloaded:
            continue
        sim = with_spread(r, params)
        errs += [abs(sim[k] - r.real[k]) / r.real[k] for k in SPREAD_METRICS if k in r.real]
    return float(np.mean(errs)) if errs else 0.0


def fit_spread(results: list[Result], params: dict) -> dict:
    """`params` (a fitted point and frontend) with the SPREAD_GRID point that minimises the mean
    |error| of SPREAD_METRICS over `results` (simulated at that point, their times kept; ties: the
    first, the least spread)."""
    best = None
    for cv in SPREAD_GRID["frontend_cv"]:
        for rate, mean in SPREAD_GRID["stalls"]:
            p = {**params, "frontend_cv": cv, "stall_rate_per_s": rate, "stall_s": mean}
            value = spread_loss(results, p)
            if best is None or value < best[1] - 1e-12:
                best = (p, value)
    assert best is not None
    return best[0]


def with_frontend(r: Result, f: float) -> dict:
    """The run's simulated metrics with `f` seconds more request handling (TTFT and E2E)."""
    sim = dict(r.sim)
    for k in sim:  # a constant shift moves every TTFT and E2E statistic alike (TPOT not at all)
        if k.startswith("ttft_"):
            sim[k] += 1e3 * f
        elif k.startswith("e2e_"):
            sim[k] += f
    return sim


def loss(results: list[Result], f: float) -> float:
    errs, wrong = [], 0
    for r in results:
        wrong += r.sim_overloaded != r.real_overloaded
        if r.real_overloaded:
            continue
        sim = with_frontend(r, f)
        errs += [abs(sim[k] - r.real[k]) / r.real[k] for k in FIT_METRICS]
    return (float(np.mean(errs)) if errs else 0.0) + wrong


def best_frontend(results: list[Result]) -> tuple[float, float]:
    losses = [loss(results, f) for f in FRONTEND_GRID]
    i = int(np.argmin(losses))
    return float(FRONTEND_GRID[i]), losses[i]


def grid_points(grid: dict | None = None) -> list[dict]:
    grid = grid or GRID
    keys = list(grid)
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def point_key(params: dict) -> str:
    return json.dumps({k: params[k] for k in GRID if k in params}, sort_keys=True)


@dataclass
class Fit:
    per_point: list[tuple[dict, list[Result]]] = field(default_factory=list)

    spread: bool = False  # fit the spread too (the runs' times kept): fit_spread

    def best(self, keep: Callable[[Result], bool] = lambda r: True) -> tuple[dict, float]:
        """The grid point and frontend minimising the loss over the results `keep` selects (and,
        with `spread`, the spread fitted on them at that point)."""
        best = None
        for point, results in self.per_point:
            f, value = best_frontend([r for r in results if keep(r)])
            if best is None or value < best[1] - 1e-12:
                best = ({**point, "frontend_s": f, "frontend_per_prompt_token_s": 0.0}, value)
        assert best is not None
        if self.spread:
            index = {point_key(p): res for p, res in self.per_point}
            return fit_spread([r for r in index[point_key(best[0])] if keep(r)], best[0]), best[1]
        return best

    def held_out(self, group: Callable[[Result], Any]) -> list[tuple[Any, dict, list[Result]]]:
        """Leave each group out (a model's stages, a benchmark run): per group, in sorted order, the
        grid point and frontend fitted on the other groups and the group's results simulated with
        them. From the grid already simulated: no new simulation."""
        groups = sorted({group(r) for r in self.per_point[0][1]}) if self.per_point else []
        out = []
        for g in groups:
            params, _ = self.best(lambda r, g=g: group(r) != g)
            out.append((g, params, [r for r in self.results(params) if group(r) == g]))
        return out

    def results(self, params: dict) -> list[Result]:
        """Every run as simulated with `params` (its grid point; its frontend added)."""
        index = {point_key(p): res for p, res in self.per_point}
        f = params["frontend_s"]
        if self.spread:
            return [Result(r.info, r.real, with_spread(r, params), r.real_overloaded, r.sim_overloaded, r.wall_s)
                    for r in index[point_key(params)]]
        return [Result(r.info, r.real, with_frontend(r, f), r.real_overloaded, r.sim_overloaded, r.wall_s)
                for r in index[point_key(params)]]


def simulate_grid(simulate_point: Callable[[dict], list[Result]],
                  progress: Callable[[str], None] | None = None, grid: dict | None = None,
                  tick: Callable[[int, int], None] | None = None, spread: bool = False) -> Fit:
    """simulate_point(measured options) -> every run's Result, at each point of `grid` (default
    GRID; its keys a subset of GRID's) with frontend 0. After each point: progress(a line with
    the ETA) and tick(points done, points)."""
    fit = Fit(spread=spread)
    points = grid_points(grid)
    t0 = time.time()
    for i, point in enumerate(points):
        fit.per_point.append((point, simulate_point({**point, "frontend_s": 0.0, "frontend_per_prompt_token_s": 0.0,
                                                     "frontend_cv": 0.0, "stall_rate_per_s": 0.0,
                                                     "stall_s": 0.0})))
        if tick is not None:
            tick(i + 1, len(points))
        if progress is not None:
            done = time.time() - t0
            progress(f"  grid point {i + 1}/{len(points)} {json.dumps(point)}: {done:.0f} s, "
                     f"ETA {done / (i + 1) * (len(points) - i - 1):.0f} s")
    return fit


def step_time_error(results: list[Result]) -> dict | None:
    """The 10th and 90th percentile of the signed mean-TPOT error over the sustained runs: the
    planner's error band (the --from-bench profile's serving_error). None: no run has a TPOT to
    compare (every output one token: no decode step was timed)."""
    errs = [e for e in (r.error["tpot_mean_ms"] for r in results if not r.real_overloaded) if np.isfinite(e)]
    if not errs:
        return None
    return {"p10": round(float(np.percentile(errs, 10)), 4), "p90": round(float(np.percentile(errs, 90)), 4),
            "stages": len(errs)}


def error_band(results: list[Result], basis: str) -> dict | None:
    """step_time_error as step-time factors (real = simulated / (1 + error)), bracketing the
    simulated step itself: where every run errs on one side (one run, or a bias the grid's steps
    leave), that side's end and 1.0 (a band of 1.03 and 1.03 would say the real step is never the
    simulated one, and the planner's band is the answer at each end). None: no TPOT to judge by."""
    e = step_time_error(results)
    if e is None:
        return None
    return {"slower": round(1 / (1 + min(e["p10"], 0.0)), 4), "faster": round(1 / (1 + max(e["p90"], 0.0)), 4),
            "basis": f"{basis}: TPOT error {e['p10']:+.1%} to {e['p90']:+.1%} (10th-90th percentile, "
                     f"{e['stages']} runs)"}


# ----------------------------------------------------------------------------- your own server

def bench_metrics(doc: dict) -> dict:
    """A `vllm bench serve --save-result` document's measured metrics, in Result's keys (those it
    has: its aggregate keys, else its per-request lists)."""
    from sim.reporting.compare import _measured
    pick = {"ttft_p50_ms": ("ttft", "median", 1.0), "tpot_mean_ms": ("tpot", "mean", 1.0),
            "tpot_p50_ms": ("tpot", "median", 1.0), "e2e_p50_s": ("e2el", "median", 1e-3)}
    out = {}
    for key, (metric, stat, scale) in pick.items():
        value = _measured(doc, metric, stat)
        if value is not None and value > 0:
            out[key] = value * scale
    return out


def bench_scenario(bench: Path, model, gpu: str, tp: int, measured: dict | None,
                   profile: Path | None = None) -> dict:
    """The scenario that replays one benchmark's requests on the engine being calibrated: step
    costs from `profile` when given (its overheads then set by `with_overheads`), else the measured
    kernel tables with the `measured` options."""
    cost = ({"profile": str(profile.resolve())} if profile is not None
            else {"measured": dict(measured)} if measured is not None else None)
    return {"name": "calibrate-" + "".join(c if c.isalnum() or c in "._-" else "-" for c in bench.stem)[:60],
            "seed": 0, "model": model, "hardware": gpu, "cost_model": cost,
            "engine": {"scheduler": "chunked", "tensor_parallel_size": tp},
            "workload": {"trace": str(bench.resolve()), "format": "vllm_bench"}}


def with_overheads(scenario, values: dict | None):
    """`scenario` with its profile's engine overheads replaced by `values` (None: as the profile
    says)."""
    from dataclasses import replace

    from sim.cost.overheads import EngineOverheads
    if values is None:
        return scenario
    spec = scenario.cost_model
    overheads = EngineOverheads(**values)
    return replace(scenario, cost_model=replace(spec, options={**spec.options, "overheads": overheads}))


def fit_grid(scenario) -> dict:
    """The grid `fit_bench` searches for this scenario's cost model: every term on kernel-table
    step costs, PROFILE_GRID's on a fitted (v1) profile."""
    from sim.cost.measured import TableProfile
    profile = scenario.cost_model.profile
    return GRID if profile is None or isinstance(profile, TableProfile) else PROFILE_GRID


def bench_model(benches: list[Path], model: str, gpu: str | None, tp: int, overrides: tuple[str, ...],
                profile: Path | None = None) -> Any:
    """`servesim calibrate --from-bench`'s options checked: the scenario's model value (a preset name,
    or {hf_config: path}). ScenarioError naming the option for bad input."""
    _int(tp, "--tp", lo=1)
    if gpu not in HARDWARE_PRESETS:
        raise ScenarioError(f"--gpu: {gpu!r} is not one of {', '.join(HARDWARE_PRESETS)} "
                            f"(the GPU the benchmarks ran on)")
    if model in MODEL_PRESETS:
        value: Any = model
    elif Path(model).is_file():
        value = {"hf_config": str(Path(model).resolve())}
    else:
        raise ScenarioError(f"--model: {model!r} is neither a preset ({', '.join(MODEL_PRESETS)}) "
                            f"nor a HF config.json path")
    bad = [s for s in overrides if not s.startswith("engine.")]
    if bad:
        raise ScenarioError(f"--set {bad[0]}: only engine.KEY=VALUE describes the server here")
    for b in benches:
        check_input_file(b, "trace", str(b))
    if profile is not None:
        check_input_file(profile, "profile", "--profile")
    return value


def base_of_another_preset(scenario) -> str | None:
    """The preset a fitted --profile names, where its shape differs from the scenario's model (a
    profile of whole iterations records only a model name; a preset's name says its shape)."""
    from dataclasses import replace

    from sim.presets.models import MODEL_PRESETS
    name = scenario.cost_model.profile.metadata.get("model")
    preset = MODEL_PRESETS.get(name)
    return name if preset is not None and replace(preset, name=scenario.model.name) != scenario.model else None


def fit_bench(benches: list[Path], model, gpu: str, tp: int, overrides: tuple[str, ...] = (),
              grid: dict | None = None, progress: Callable[[str], None] | None = None,
              profile: Path | None = None, tick: Callable[[int, int], None] | None = None) -> dict:
    """Fit the engine overheads to `vllm bench serve` results of one server (model, GPU, TP and
    the engine settings in `overrides`, e.g. engine.max_num_seqs=128): each result's requests are
    replayed (its start_times, or its request_rate) at every grid point (default: `fit_grid`'s).
    Step costs: the kernel tables of that model and GPU, or `profile` (a fitted v1 profile of the
    server's own iterations: then PROFILE_GRID's terms, no host floor; or a v2 profile). Returns the
    fitted parameters and per-run results before (the shipped defaults, or the profile's own
    overheads) and after, and the scenario of the first run (to build the profile from).
    ScenarioError for unusable inputs."""
    from sim.config.errors import ScenarioError
    from sim.reporting.compare import measured_doc
    from sim.scenario import scenario_from_dict
    from sim.simulate import simulate

    real = []
    for b in benches:
        m = bench_metrics(measured_doc(b))
        missing = [k for k in FIT_METRICS if k not in m]
        if missing:
            raise ScenarioError(f"{b}: no measured {', '.join(missing)} (expected vllm bench serve "
                                f"--save-result output with its median_ttft_ms, mean_tpot_ms, median_e2el_ms: "
                                f"vllm bench serve writes median_e2el_ms with --percentile-metrics "
                                f"ttft,tpot,itl,e2el, or each request's latency with --save-detailed)")
        real.append(m)

    def scenario(b: Path, measured: dict | None):
        if profile is None:
            return scenario_from_dict(bench_scenario(b, model, gpu, tp, measured), base_dir=b.resolve().parent,
                                      overrides=overrides)
        return with_overheads(scenario_from_dict(bench_scenario(b, model, gpu, tp, None, profile),
                                                 base_dir=b.resolve().parent, overrides=overrides), measured)

    def run(measured: dict | None) -> list[Result]:
        out = []
        for i, (b, m) in enumerate(zip(benches, real)):
            sc = scenario(b, measured)
            t0 = time.perf_counter()
            sim = sim_metrics(simulate(sc).requests)
            out.append(Result({"stage": b.name, "model": sc.model.name, "run": i}, m, sim,
                              m["ttft_p50_ms"] >= 1e3 * SATURATED_TTFT_S,
                              sim["ttft_p50_ms"] >= 1e3 * SATURATED_TTFT_S, time.perf_counter() - t0))
        return out

    first = scenario(benches[0], None)
    if profile is None and first.cost_model.name != "measured":
        raise ScenarioError(f"{first.model.name} on {gpu} at TP {tp}: {first.cost_model.notice}; "
                            "--from-bench fits the overheads on top of measured kernel times (or give "
                            "--profile: a profile of your engine's own step times)")
    before = run(None)
    fit = simulate_grid(run, progress, grid or fit_grid(first), tick)
    params, value = fit.best()
    # leave one run out, with two or more: (the overheads fitted on the others, the run with them)
    held = [(p, rs[0]) for _, p, rs in fit.held_out(lambda r: r.info["run"])] if len(benches) > 1 else []
    return {"params": params, "loss": value, "before": before, "after": fit.results(params),
            "held_out": held, "scenario": first}


FAR_OFF = 1.0  # a fitted run still more than 100% off: the step costs underneath are not this server's


def bench_warnings(result: dict) -> list[str]:
    """What a user must hear about fit_bench's result, one line each: a run the fitted overheads
    still miss by more than FAR_OFF (the overheads cannot make up for step costs of another GPU or
    model), and a profile left without an error band (no run had a TPOT)."""
    said = []
    for r in result["after"]:
        off = {k: e for k, e in r.error.items() if k in FIT_METRICS and np.isfinite(e) and abs(e) > FAR_OFF}
        if off:
            worst = max(off, key=lambda k: abs(off[k]))
            said.append(f"{r.name}: after the fit the simulation is still {off[worst]:+.0%} off on {worst} "
                        "(more than 100%): the step costs it sits on are not this server's; check --gpu, "
                        "--model and --tp, or give --profile of this machine")
    runs = [r for _, r in result["held_out"]] or result["after"]
    if step_time_error(runs) is None:
        said.append("no run has a TPOT (every output one token): the profile has no serving_error, so plans "
                    "on it carry no error band; benchmark with --random-output-len > 1")
    return said


def bench_profile(result: dict, benches: list[Path]) -> dict:
    """fit_bench's result as a profile: the fitted overheads (`model.engine_overheads`), the fit's
    error on the user's runs (`metadata.serving_error`, the planner's band) and the runs it was
    fitted on, over the step costs it was fitted on: a v2 profile composed for the calibrated model
    x GPU x TP, or a copy of the --profile given."""
    from sim.cost.composer import compose_document

    sc = result["scenario"]
    base = sc.cost_model.profile if sc.cost_model.name == "profile" else None
    if base is None:
        doc = compose_document(sc.model, sc.hardware, sc.engine.tensor_parallel_size)
    else:
        doc = yaml.safe_load(Path(base.source).read_text())
    doc["model"]["engine_overheads"] = dict(result["params"])
    meta = doc["metadata"]
    held = [r for _, r in result["held_out"]]
    band = (error_band(held, "your server's benchmarks, each predicted with the overheads fitted on the "
                             "others (leave one run out)") if held else
            error_band(result["after"], "fitted to your server's benchmarks (in-sample)"))
    if band is not None:
        meta["serving_error"] = band
    meta["calibrated_on"] = [str(b) for b in benches]
    note = "engine overheads fitted by servesim calibrate --from-bench to the runs in calibrated_on"
    if band is None:  # (a NaN band is refused on reading: none, and said)
        note += "; no serving_error: no run had a TPOT (outputs of one token), so plans carry no error band"
    if base is not None:
        note += f", on the step costs of {base.source}"
    if isinstance(meta.get("notes"), list):
        meta["notes"].append(note)
    else:
        meta["notes"] = f"{meta['notes']}; {note}" if meta.get("notes") else note
    return doc


def write_bench_profile(doc: dict, path: Path) -> None:
    """bench_profile's document to `path`: a composed (v2) one as every composed profile is
    written (6 significant digits), a copy of a fitted (v1) base with its numbers unchanged (the
    fit's errors were computed on them)."""
    from calibrate.measured import write_profile
    from sim.cost.measured import FORMAT
    if doc.get("format") == FORMAT:
        write_profile(doc, path)
        return
    from sim.files import write_file
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, yaml.safe_dump(doc, sort_keys=False, width=100))
