"""The real half of a validation on disk: `servesim validate --real-only` writes it on the GPU
machine (no simpy there), `--compare-only` reads it back where the simulator runs.

    DIR/real/requests.csv, steps.csv, summary.json   the simulator's run schemas (servesim plot reads them)
    DIR/real/iterations.csv                         per iteration: model-step seconds + the batch's BatchStats
    DIR/real/workload.csv                           the requests replayed (the simulator replays the same)
    DIR/real/run.json                               scenario, engine settings, device, clock, versions; last
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sim.config.errors import ScenarioError
from sim.files import write_file
from sim.scenario import EngineConfig, Scenario
from sim.workload.generators import Workload, build_workload

from .engine import EngineResult, num_blocks

REAL_RUN_FORMAT = "servesim-real-run/v1"
# real/: the simulator's three run files (so `servesim plot` reads it), the engine's per-iteration
# timings and batch shapes, the requests it replayed, and run.json (written last: complete).
REAL_FILES = ("requests.csv", "steps.csv", "summary.json", "iterations.csv", "workload.csv",
              "run.json")


@dataclass
class RealRun:
    """The real half of a validation: what `--real-only` writes to real/ and `--compare-only`
    reads back (on a machine with simpy, later)."""
    result: EngineResult
    workload: Workload       # the very requests it replayed (workload.csv)
    meta: dict               # run.json: scenario, engine settings, device, clock, versions


def write_real(real: RealRun, out_dir: Path) -> Path:
    """out_dir/real/: requests.csv, steps.csv, summary.json (the simulator's schemas: `servesim
    plot` reads the folder), iterations.csv (per iteration: the model step's seconds and the batch
    the cost model would price), workload.csv (the requests replayed) and run.json, last."""
    d = Path(out_dir) / "real"
    d.mkdir(parents=True, exist_ok=True)
    (d / "run.json").unlink(missing_ok=True)
    r, w = real.result, real.workload
    write_file(d / "requests.csv", r.requests.to_csv(index=False))
    write_file(d / "steps.csv", r.steps.to_csv(index=False))
    write_file(d / "summary.json", json.dumps(r.summary, indent=2) + "\n")
    write_file(d / "iterations.csv", pd.DataFrame({
        "iteration": np.arange(len(r.stats)), "step_s": r.step_s,
        "num_decodes": [s.num_decodes for s in r.stats],
        "decode_context_sum": [s.decode_context_sum for s in r.stats],
        "prefill_lens": [" ".join(map(str, s.prefill_lens.tolist())) for s in r.stats],
        "prefill_contexts": [" ".join(map(str, s.prefill_contexts.tolist())) for s in r.stats],
    }).to_csv(index=False))
    write_file(d / "workload.csv", pd.DataFrame({
        "request_id": np.arange(len(w)), "arrival_s": w.arrival_s, "prompt_tokens": w.prompt_tokens,
        "output_tokens": w.output_tokens, "priority": w.priority}).to_csv(index=False))
    meta = {k: v for k, v in real.meta.items() if k not in ("loaded_from", "warnings")}
    write_file(d / "run.json", json.dumps(meta, indent=2) + "\n")
    return d


def read_iterations(d: Path) -> pd.DataFrame:
    """real/iterations.csv, its space-separated chunk lists kept as text."""
    return pd.read_csv(Path(d) / "iterations.csv", dtype={"prefill_lens": str, "prefill_contexts": str},
                       keep_default_na=False)


def batch_stats(it: pd.DataFrame) -> list:
    """The BatchStats of each row of iterations.csv (what the cost model prices)."""
    from sim.cost.batch import BatchStats

    def ints(text: str) -> np.ndarray:
        return np.array([int(x) for x in str(text).split()], dtype=np.int64)

    return [BatchStats(prefill_lens=ints(a), prefill_contexts=ints(b), num_decodes=int(n),
                       decode_context_sum=int(c))
            for a, b, n, c in zip(it["prefill_lens"], it["prefill_contexts"], it["num_decodes"],
                                  it["decode_context_sum"])]


def load_real(path: Path, scenario: Scenario) -> RealRun:
    """A real run written by write_real (`--real-only`), checked against `scenario`: the same
    model, engine settings and KV blocks, or a ScenarioError. `path`: the validate folder or its
    real/ subfolder. The requests are the recorded ones (workload.csv), whatever the scenario's
    workload says; a difference is a warning in the notes."""

    path = Path(path)
    d = path if (path / "run.json").exists() or path.name == "real" else path / "real"
    where = f"--compare-only {path}"
    if not d.is_dir():
        raise ScenarioError(f"{where}: no such folder (expected the --out of a --real-only run)")
    missing = [f for f in REAL_FILES if not (d / f).is_file()]
    if missing:
        raise ScenarioError(f"{where}: {d / missing[0]} is missing; an incomplete or older real run "
                            f"(a complete one has {', '.join(REAL_FILES)})")
    try:
        meta = json.loads((d / "run.json").read_text())
        requests = pd.read_csv(d / "requests.csv")
        steps = pd.read_csv(d / "steps.csv")
        summary = json.loads((d / "summary.json").read_text())
        it = read_iterations(d)
        wl = pd.read_csv(d / "workload.csv")
    except (ValueError, OSError) as exc:  # JSON, CSV and read errors
        raise ScenarioError(f"{where}: unreadable real run ({str(exc).splitlines()[0]})") from None
    got = meta.get("format") if isinstance(meta, dict) else meta
    if got != REAL_RUN_FORMAT:
        raise ScenarioError(f"{d / 'run.json'}: format: got {got!r}; allowed: {REAL_RUN_FORMAT}")
    recorded_engine = dict(meta.get("engine")) if isinstance(meta.get("engine"), dict) else {}
    if meta.get("engine_kind") != "vllm":  # our engine runs with prefix caching off (older
        from .engine import without_prefix_caching  # recordings kept the scenario's own setting)
        scenario = without_prefix_caching(scenario)
        recorded_engine["enable_prefix_caching"] = False
    theirs = json.loads(json.dumps(dataclasses.asdict(scenario.engine)))
    checks = [("model", meta.get("model"), scenario.model.name)]
    # a key newer than the recording was at its default then (the knob did not exist)
    defaults = json.loads(json.dumps(dataclasses.asdict(EngineConfig())))
    checks += [(f"engine.{k}", recorded_engine.get(k, defaults.get(k)), v) for k, v in theirs.items()]
    checks += [("num_gpu_blocks (derived)", meta.get("num_gpu_blocks"), num_blocks(scenario))]
    for key, recorded, now in checks:
        if recorded != now:
            raise ScenarioError(f"{where}: the real run has {key} {recorded!r} but "
                                f"{scenario.source or 'the scenario'} gives {now!r}; pass the "
                                f"scenario (and --set options) the real run used")

    stats = batch_stats(it)
    workload = Workload(arrival_s=wl["arrival_s"].to_numpy(np.float64),
                        prompt_tokens=wl["prompt_tokens"].to_numpy(np.int64),
                        output_tokens=wl["output_tokens"].to_numpy(np.int64),
                        priority=wl["priority"].to_numpy(np.int64))
    result = EngineResult(requests=requests, steps=steps, step_s=it["step_s"].to_numpy(np.float64),
                          stats=stats, tokens=[], duration_s=float(meta.get("duration_s", np.nan)),
                          summary=summary)
    warnings = []
    try:
        mine = build_workload(scenario.workload, np.random.default_rng(scenario.seed))
        same = len(mine) == len(workload) and all(
            np.array_equal(getattr(mine, f), getattr(workload, f))
            for f in ("arrival_s", "prompt_tokens", "output_tokens"))
    except ScenarioError:
        same = False
    if not same:
        warnings.append(f"warning: the scenario's own workload differs from the {len(workload)} "
                        f"requests the real run replayed; the simulator replays those")
    return RealRun(result=result, workload=workload,
                   meta={**meta, "loaded_from": str(d), "warnings": warnings})
