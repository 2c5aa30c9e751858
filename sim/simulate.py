"""`servesim run` as a library call: scenario -> workload -> replicas -> metrics -> files."""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import simpy

from .cluster import ClosedLoopRouter, make_inboxes
from .routers import make_router
from .config import Scenario, resolved_yaml
from .engine import Replica
from .metrics import requests_frame, steps_frame, summarize
from .recorder import Recorder
from .request import RequestTable
from .schedulers import build_scheduler, check_servable
from .version import __version__
from .workload import Workload, build_workload


@dataclass
class SimResult:
    requests: pd.DataFrame   # requests.csv
    steps: pd.DataFrame      # steps.csv
    summary: dict            # summary.json
    # scenario.yaml's source: set when the run used the scenario's own workload (so that the
    # resolved scenario reproduces it), None when the caller passed a workload
    scenario: Scenario | None = None


def simulate(scenario: Scenario, progress: Callable[[int, int], None] | None = None, *,
             workload: Workload | None = None, fast_forward: bool = True) -> SimResult:
    """Run `scenario` to completion. `progress(completed, total)` is called a few times a second;
    `workload` replaces the scenario's (tests, planners); fast_forward=False steps every iteration."""
    own_workload = workload is None
    if own_workload:
        workload = build_workload(scenario.workload, np.random.default_rng(scenario.seed))
    e, where = scenario.engine, _where(scenario)
    blocks = scenario.budget.num_gpu_blocks
    check_servable(workload, e, blocks, where)
    cost = scenario.cost()
    req = RequestTable.from_workload(workload)
    env = simpy.Environment()
    recorder = Recorder(e.block_size)
    schedulers = [build_scheduler(e, req, blocks, workload) for _ in range(e.replicas)]
    router = make_router(e.router, e.replicas)
    if workload.users is None:
        inboxes = make_inboxes(router, env, req.arrival, schedulers, req.replica)
    else:  # closed loop: arrivals are filled in as users' requests finish
        loop = ClosedLoopRouter(env, req, workload.users, schedulers, router)
        inboxes = loop.inboxes
    tick = _progress_ticker(req, progress)
    for i, (sched, inbox) in enumerate(zip(schedulers, inboxes)):
        Replica(env, i, sched, cost, recorder, inbox, fast_forward=fast_forward, on_iteration=tick)
    env.run()
    if progress is not None:
        progress(len(req), len(req))
    steps = steps_frame(recorder)
    requests = requests_frame(req)
    if workload.users is not None:
        requests["user"] = loop.user  # who sent each request (closed loop only)
    m, hw = scenario.model, scenario.hardware
    summary = summarize(req, requests, steps, recorder, max_num_seqs=e.max_num_seqs, replicas=e.replicas,
                        gpus=e.replicas * e.tensor_parallel_size, flops_per_token=m.flops_per_token,
                        weight_bytes=m.weight_bytes, kv_bytes_per_token=m.kv_bytes_per_token,
                        peak_flops=hw.bf16_flops, hbm_bandwidth=hw.hbm_bandwidth, slo=scenario.slo)
    summary = {"scenario": scenario.name, **summary, "run": run_record(scenario)}
    return SimResult(requests=requests, steps=steps, summary=summary,
                     scenario=scenario if own_workload else None)


def run_record(scenario: Scenario) -> dict:
    """What summary.json records to reproduce and interpret a run: the engine settings, seed,
    overrides, where the step costs came from, and the servesim version."""
    e = scenario.engine
    return {"servesim_version": __version__, "seed": scenario.seed,
            "overrides": list(scenario.overrides), "model": scenario.model.name,
            "hardware": scenario.hardware.name, "engine": dataclasses.asdict(e),
            "num_gpu_blocks": scenario.budget.num_gpu_blocks,
            "cost_model": scenario.cost_model.provenance()}


def _where(scenario: Scenario) -> str:
    return f"{scenario.source}: " if scenario.source else ""


def _progress_ticker(req: RequestTable, progress):
    """A cheap per-iteration hook that reports progress at most ~10 times a wall-second."""
    if progress is None:
        return None
    state = {"n": 0, "next": time.perf_counter() + 0.1}

    def tick() -> None:
        state["n"] += 1
        if state["n"] & 255 == 0 and time.perf_counter() >= state["next"]:
            state["next"] = time.perf_counter() + 0.1
            progress(int(np.count_nonzero(~np.isnan(req.finish))), len(req))
    return tick


def write_outputs(result: SimResult, out_dir: Path) -> None:
    """Write requests.csv, steps.csv, scenario.yaml (the resolved scenario, when given) and
    summary.json. Each file is written to a temporary name and renamed, summary.json last, so a
    directory with summary.json holds a complete run."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").unlink(missing_ok=True)
    _atomic(out_dir / "requests.csv", lambda f: result.requests.to_csv(f, index=False))
    _atomic(out_dir / "steps.csv", lambda f: result.steps.to_csv(f, index=False))
    if result.scenario is not None:
        _atomic(out_dir / "scenario.yaml", lambda f: f.write(resolved_yaml(result.scenario)))
    _atomic(out_dir / "summary.json", lambda f: f.write(json.dumps(result.summary, indent=2) + "\n"))


def _atomic(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", newline="") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
