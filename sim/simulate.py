"""`servesim run` as a library call: scenario -> workload -> replicas -> metrics -> files."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import simpy

from sim.build import build_replicas, check_servable, cost_model
from sim.config.checks import MAX_SECONDS
from sim.config.errors import ScenarioError
from sim.cost import error_band
from sim.cost.step_cost import CostModel
from sim.features import registry as features
from sim.features.contract import Ran, RunView
from sim.files import give_mode, signals_held, writing
from sim.kv.prefix_cache import PrefixKVCache
from sim.presets import memory
from sim.runtime.disaggregation import pool_utilization
from sim.runtime.metrics import (
    Frame,
    InterTokenGaps,
    distribution,
    inter_token_latencies,
    requests_frame,
    steps_frame,
    summarize,
)
from sim.runtime.recorder import Recorder
from sim.scenario import Scenario, resolved_yaml
from sim.version import __version__
from sim.workload.generators import Agents, Workload, build_workload
from sim.workload.request import RequestTable


@dataclass
class SimResult:
    requests: pd.DataFrame   # requests.csv
    steps: pd.DataFrame      # steps.csv
    summary: dict            # summary.json
    # scenario.yaml's source: set when the run used the scenario's own workload (so that the
    # resolved scenario reproduces it), None when the caller passed a workload
    scenario: Scenario | None = None
    # every inter-token gap: gaps s, counts, ends s (metrics.InterTokenGaps; unpacks as a tuple);
    # the planner judges an ITL target on the gaps after its warm-up
    itl: InterTokenGaps | None = None


MAX_CLOCK_S = 1e12  # s: a run's clock past this (arrivals reach at most MAX_SECONDS) is a cost off the scale


def simulate(scenario: Scenario, progress: Callable[[int, int], None] | None = None, *,
             workload: Workload | None = None, fast_forward: bool = True,
             cost: CostModel | None = None,
             watch: Callable[[RequestTable], Callable[[], None] | None] | None = None) -> SimResult:
    """Run `scenario` to completion. `progress(completed, total)` is called a few times a second;
    `workload` replaces the scenario's (tests, planners); fast_forward=False steps every iteration;
    `cost` replaces the scenario's cost model (validation's replay of measured iterations);
    `watch(requests)` gives a hook called after every iteration, which may end the run by raising
    (the planner's early stop, sim/planning/slo.EarlyStop: the exception leaves simulate)."""
    own_workload = workload is None
    # the engine's overheads on request times (sim/cost/overheads.py), with the scenario's own cost model
    overheads = scenario.cost_model.overheads if cost is None else None
    rng = np.random.default_rng(scenario.seed)  # the run's one generator: the workload, then acceptances
    run = _Run(scenario, rng, *_admitted(scenario, _workload(scenario, workload, rng)))
    cost = cost if cost is not None else cost_model(scenario)
    run.req = req = RequestTable.from_workload(run.workload)
    env = simpy.Environment()
    run.recorder = Recorder(scenario.engine.block_size)
    tick = _hooks(_progress_ticker(req, progress), watch(req) if watch is not None else None)
    run.built = build_replicas(env, scenario, req, run.workload, cost, run.recorder, rng, tick, fast_forward)
    env.run()
    if not env.now <= MAX_CLOCK_S:  # (NaN and inf included): never a summary of garbage times
        raise ScenarioError(f"{scenario.source or 'scenario'}: the simulated clock reached {env.now:.3g} s, past "
                            f"{MAX_CLOCK_S:g} s (~{MAX_CLOCK_S / 3.156e7:,.0f} years): iterations that long mean "
                            "a hardware figure or a cost profile off by orders of magnitude (hardware:, cost_model:)")
    if progress is not None:
        progress(len(req), len(req))
    if run.built.autoscaler is not None:  # the fleet is released when the last request finishes (engine time)
        finished = req.finish[np.isfinite(req.finish)]
        run.end_s = float(finished.max()) if len(finished) else env.now
        run.built.autoscaler.close(run.end_s)
    run.caches = [s.kv for s in run.built.schedulers if isinstance(s.kv, PrefixKVCache) and s.kv.reports]
    run.steps = steps_frame(run.recorder, cached=bool(run.caches))  # prefix caching: cached blocks over time
    run.requests = _requests(run, overheads)
    itl = inter_token_latencies(run.steps, run.recorder, req)  # (takes the recorder's durations)
    summary = _summary(run, itl)
    return SimResult(requests=run.requests, steps=run.steps, summary=summary,
                     scenario=scenario if own_workload else None, itl=itl)


@dataclass
class _Run:
    """One simulation's parts as `simulate` assembles them, for the helpers below."""
    scenario: Scenario
    rng: np.random.Generator
    offered: Workload                  # every request sent (a gateway may turn some away: engine.admission)
    workload: Workload                 # the requests that reached the engine
    admitted_at: np.ndarray | None     # each offered request's passing of the gateway (NaN: shed)
    req: RequestTable = dataclasses.field(init=False)
    recorder: Recorder = dataclasses.field(init=False)
    built: Any = dataclasses.field(init=False)          # sim/build.Replicas
    end_s: float = 0.0                 # an autoscaled fleet's release: the last finish
    caches: list = dataclasses.field(default_factory=list)  # prefix caches with hit statistics
    steps: pd.DataFrame = dataclasses.field(init=False)
    requests: pd.DataFrame = dataclasses.field(init=False)
    states: dict = dataclasses.field(default_factory=dict)  # each active feature's run state
    view: RunView = dataclasses.field(init=False)       # what the features' summaries read


def _workload(scenario: Scenario, workload: Workload | None, rng: np.random.Generator) -> Workload:
    if workload is not None:
        return workload
    try:
        return build_workload(scenario.workload, rng)
    except ScenarioError as err:  # (a bound on the workload's own times: name the scenario file)
        if not str(err).startswith("workload"):
            raise
        raise ScenarioError(f"{_where(scenario)}{err}") from None


def _admitted(scenario: Scenario, workload: Workload) -> tuple[Workload, Workload, np.ndarray | None]:
    """(every request offered, those that reach the engine, when each passed the gateway): a
    request that could never run is refused here."""
    e, where = scenario.engine, _where(scenario)
    if e.lora is None and workload.adapter is not None and bool((workload.adapter >= 0).any()):
        raise ScenarioError(f"{where}workload.trace: its requests name LoRA adapters (the adapter column) but the "
                            "engine serves none; set engine.lora (e.g. {max_loras: 4, max_lora_rank: 16})")
    offered, admitted_at = workload, None
    if e.admission is not None:
        workload, admitted_at = _through_gateway(e.admission, workload, where)
    check_servable(workload, e, scenario.budget.num_gpu_blocks, where, scenario.budget.layout)
    return offered, workload, admitted_at


def _requests(run: _Run, overheads) -> pd.DataFrame:
    """requests.csv's frame: the request table's columns, each feature's, and (behind a gateway)
    a row per offered request."""
    req, steps, built, sc = run.req, run.steps, run.built, run.scenario
    gate = built.gate  # a concurrency limit at the gateway: when each request passed it (NaN: turned away)
    spread = None  # each request's own frontend time and pauses in its decode, where they vary
    engine_finish = None  # when the engine itself finished each request, where request handling follows it
    if overheads is not None and overheads.on_requests:  # request handling, scheduling lag
        engine_finish = req.finish.copy()
        # (the lag reads when a request reached its replica: past a concurrency gate, when it passed)
        reached = req.arrival if gate is None else np.where(np.isnan(gate.released), req.arrival, gate.released)
        _, spread = overheads.apply(reached, req.prompt, req.first_scheduled, req.first_token, req.finish,
                        req.replica, (steps["replica"].to_numpy(), steps["start_s"].to_numpy(),
                                      steps["duration_s"].to_numpy(), steps["count"].to_numpy()),
                        np.frombuffer(run.recorder.durations, dtype=np.float64), run.rng)
    offered, admitted_at = run.offered, run.admitted_at
    if admitted_at is not None:  # latencies from each request's own arrival: the gateway's wait is the client's
        req.arrival = offered.arrival_s[np.isfinite(admitted_at)]
    requests = requests_frame(req)
    if engine_finish is not None:  # (the iterations' timeline: the slot figures read it)
        requests["engine_finish_s"] = engine_finish
    if spread is not None:  # (sim/cost/overheads.py: frontend_cv, stalls; the export's ITLs read them)
        requests["frontend_s"], requests["stall_s"] = spread
    loop = built.loop
    if loop is not None:  # (closed-loop users)
        requests["user"] = loop.user  # who sent each request (closed loop only)
        if loop.sessions is not None:  # multi-turn: which conversation, which turn of it
            requests["conversation"] = loop.sessions.conversation
            requests["turn"] = loop.sessions.turn
    if run.caches:  # prefix caching simulated: tokens each request found cached (vLLM: cached tokens)
        requests["cached_tokens"] = np.sum([c.cached_tokens for c in run.caches], axis=0)
    ran = Ran(steps, np.frombuffer(run.recorder.durations, dtype=np.float64))  # (before the gaps take them)
    run.states = {key: f.observe(sc.features[key], built.features.get(key), ran) for key, f in features.active(sc)}
    del ran  # (its view of the recorder's durations: inter_token_latencies takes and resizes them)
    for key, f in features.active(sc):
        for column, values in f.columns(sc.features[key], run.states[key]).items():
            requests[column] = values
    transfers = built.transfers
    if transfers is not None:  # (sized like req: before the shed rows join)
        requests["prefill_replica"] = transfers.prefill_replica
        requests["kv_transfer_s"] = transfers.transfer_s
    if gate is not None and admitted_at is not None:  # turned away at the concurrency gate: shed rows too
        passed = ~np.isnan(gate.released)
        admitted_at = run.admitted_at = admitted_at.copy()
        admitted_at[np.flatnonzero(np.isfinite(admitted_at))] = gate.released
        requests = requests[passed].reset_index(drop=True)
    if admitted_at is not None:  # every offered request, the shed ones marked
        requests = _with_shed(requests, offered, admitted_at)
    if offered.adapter is not None:  # workload.adapters: each request's LoRA adapter (-1: the base model)
        requests["adapter"] = offered.adapter
    if offered.classes is not None:  # workload.classes: each request's class by name (rows: every offered request)
        requests["class"] = np.asarray(offered.class_names, dtype=object)[offered.classes]
    return requests if isinstance(requests, Frame) else Frame(requests)


def _summary(run: _Run, itl: InterTokenGaps) -> dict:
    """summary.json: the metrics, then each part of the run's own section (SECTIONS, then each
    feature's), the error band and the run record."""
    sc = run.scenario
    e, m, hw = sc.engine, sc.model, sc.hardware
    fleet, replicas, gpus = _engines(run)
    offered = run.offered
    summary = summarize(run.req, run.requests, run.steps, run.recorder, itl=itl, max_num_seqs=e.max_num_seqs,
                        replicas=replicas, gpus=gpus, flops_per_token=m.flops_per_token,
                        weight_bytes=m.weight_bytes, kv_bytes_per_token=m.kv_bytes_per_token,
                        experts=None if m.moe is None else (m.routed_expert_bytes,
                                                            1 - m.moe.experts_per_token / m.moe.num_experts),
                        # a hybrid's linear-attention states, read and written by every decode
                        state_bytes_per_decode=0.0 if m.linear_attention is None else
                        2 * m.linear_attention.layers * memory.linear_state_bytes(m, 1),
                        peak_flops=hw.bf16_flops, hbm_bandwidth=hw.hbm_bandwidth, slo=sc.slo,
                        classes=offered.class_names if offered.classes is not None else ())
    if fleet is not None:
        summary["autoscaling"] = fleet
    run.view = RunView(sc, run.requests, run.steps, summary, replicas, gpus)
    for section in SECTIONS:
        section(run, summary)
    _feature_sections(run, summary, "")  # each top-level feature's own (sim/features/: energy, faults, ...)
    if "ttft_ms" in summary:  # where the real server's latencies are expected (sim/cost/error_band.py)
        queued = error_band.queued_share(run.requests["queue_s"].to_numpy(dtype=float),
                                         run.requests["ttft_s"].to_numpy(dtype=float))
        summary["error_band"] = error_band.band(error_band.path_of(sc, features.unvalidated(sc)), summary, queued)
    return {"scenario": sc.name, **summary, "run": run_record(sc)}


def _engines(run: _Run) -> tuple[dict | None, float, float]:
    """(an autoscaled fleet's summary or None, the engines and the GPUs the run held): data-parallel
    ranks are engines of their own; an autoscaled fleet's replicas held on average (what
    utilisation is measured against); disaggregated pools' both."""
    e = run.scenario.engine
    replicas, gpus = e.replicas * e.data_parallel_size, e.replicas * e.gpus_per_replica
    fleet = None
    scaler = run.built.autoscaler
    if scaler is not None:
        fleet = scaler.summary(run.end_s, e.gpus_per_replica, run.scenario.hardware.usd_per_hour)
        replicas, gpus = fleet["mean_replicas"], fleet["mean_replicas"] * e.gpus_per_replica
    if e.disaggregation is not None:
        d = e.disaggregation
        replicas = d.prefill_replicas + d.decode_replicas
        gpus = d.prefill_replicas * d.prefill.tensor_parallel_size + d.decode_replicas * d.decode.tensor_parallel_size
    return fleet, replicas, gpus


# -- summary.json's parts of the engine's own features, in the order they are written ------------
def _admission(run: _Run, summary: dict) -> None:
    admitted_at, offered = run.admitted_at, run.offered
    if admitted_at is None:
        return
    shed = int(np.isnan(admitted_at).sum())
    waited = (admitted_at - offered.arrival_s)[np.isfinite(admitted_at)]
    summary["admission"] = {"offered": len(offered), "admitted": len(offered) - shed, "shed": shed,
                            "shed_fraction": shed / len(offered) if len(offered) else 0.0,
                            "gateway_wait_ms": distribution(waited)}
    if "goodput" in summary:  # met the SLO, of every request offered (a shed one did not)
        g = summary["goodput"]
        g["fraction_of_offered"] = g["fraction"] * summary["completed"] / len(offered) if len(offered) else 0.0


def _prefix_cache(run: _Run, summary: dict) -> None:
    if run.caches:
        queried = sum(c.queried_tokens for c in run.caches)
        summary["prefix_cache_hit_rate"] = sum(c.hit_tokens for c in run.caches) / queried if queried else 0.0


def _engine_features(run: _Run, summary: dict) -> None:
    _feature_sections(run, summary, "engine")  # (an engine feature's, e.g. lora, kv_offloading: among the engine's)


def _feature_sections(run: _Run, summary: dict, section: str) -> None:
    """The summary section of each active feature whose knobs live in `section` ("": its own)."""
    sc = run.scenario
    for key, f in features.active(sc):
        if f.section == section:
            part = f.summarize(sc.features[key], run.states[key], run.view)
            if part is not None:
                summary[key] = part


def _users(run: _Run, summary: dict) -> None:
    loop, req = run.built.loop, run.req
    if loop is not None and loop.sessions is not None:
        summary["sessions"] = loop.sessions.summary()
    if loop is not None and loop.left is not None:  # agents: each session from its first call to its last answer
        first = pd.Series(req.arrival).groupby(loop.user).min()
        last = pd.Series(req.finish).groupby(loop.user).max()
        summary["agents"] = {"sessions": int(len(first)), "calls_mean": len(req) / len(first) if len(first) else 0.0,
                             "session_s": distribution((last - first).to_numpy(), scale=1.0)}


def _kv_transfers(run: _Run, summary: dict) -> None:
    transfers = run.built.transfers
    if transfers is not None:
        d = transfers.config
        summary["kv_transfer_bytes"] = transfers.bytes
        summary["kv_transfer_ms"] = distribution(transfers.transfer_s)
        summary["pool_utilization"] = pool_utilization(run.steps, summary["duration_s"], d.prefill_replicas,
                                                       d.decode_replicas)


SECTIONS: tuple[Callable[[_Run, dict], None], ...] = (_admission, _prefix_cache, _engine_features, _users,
                                                        _kv_transfers)


def _through_gateway(config, workload: Workload, where: str) -> tuple[Workload, np.ndarray]:
    """The requests the gateway admits, arriving at the engine when they pass it; and each offered
    request's passing time (NaN: shed)."""
    from sim.runtime.gateway import admit_all

    if workload.users is not None:
        raise ScenarioError(f"{where}engine.admission: a gateway before closed-loop users is not modelled "
                            "(a shed user would retry); use an open-loop workload or a trace")
    admitted_at = admit_all(config, workload.arrival_s, workload.classes, workload.class_names)
    keep = np.flatnonzero(np.isfinite(admitted_at))
    if len(keep) and admitted_at[keep].max() > MAX_SECONDS:  # a queue at a slow bucket: a runaway clock
        raise ScenarioError(f"{where}engine.admission: its queue holds requests until {admitted_at[keep].max():.3g} s, "
                            f"past servesim's {MAX_SECONDS:g} s bound; raise rate or set max_wait_s")
    if not len(keep):
        raise ScenarioError(f"{where}engine.admission: the gateway turns every request away")
    prefix = None if workload.prefix is None else [workload.prefix[i] for i in keep]
    classes = None if workload.classes is None else workload.classes[keep]
    return Workload(admitted_at[keep], workload.prompt_tokens[keep], workload.output_tokens[keep],
                    workload.priority[keep], None, prefix, classes, workload.class_names), admitted_at


def _with_shed(admitted: pd.DataFrame, offered: Workload, admitted_at: np.ndarray) -> pd.DataFrame:
    """requests.csv over every offered request: the admitted ones' rows under their own ids, a row
    per shed one (no times; replica -1), a `shed` column, and `gateway_wait_s` (s each admitted one
    waited for a token; counted in its queue_s, TTFT and E2E)."""
    keep = np.isfinite(admitted_at)
    n = len(offered)
    out = pd.DataFrame({c: np.full(n, np.nan) for c in admitted.columns})
    for c in admitted.columns:
        if admitted[c].dtype.kind in "iu":
            out[c] = np.full(n, -1 if c == "replica" else 0, dtype=np.int64)
        out.loc[keep, c] = admitted[c].to_numpy()
    out["request_id"] = np.arange(n)
    out["arrival_s"] = offered.arrival_s
    out["prompt_tokens"], out["output_tokens"] = offered.prompt_tokens, offered.output_tokens
    out["shed"] = ~keep
    out["gateway_wait_s"] = admitted_at - offered.arrival_s
    return out


def run_record(scenario: Scenario) -> dict:
    """What summary.json records to reproduce and interpret a run: the engine settings, seed,
    overrides, where the step costs came from, and the servesim version."""
    e = scenario.engine
    engine = dataclasses.asdict(e)
    if e.routing is not None:  # weights as a mapping, as the scenario writes them
        engine["routing"] = e.routing.as_yaml(e.router)
    return {"servesim_version": __version__, "seed": scenario.seed,
            "overrides": list(scenario.overrides), "model": scenario.model.name,
            "hardware": scenario.hardware.name, "engine": engine,
            "num_gpu_blocks": scenario.budget.num_gpu_blocks,
            "cost_model": scenario.cost_model.provenance()}


def _where(scenario: Scenario) -> str:
    return f"{scenario.source}: " if scenario.source else ""


def _hooks(*hooks):
    """One per-iteration hook calling each given one (None: no hook at all)."""
    given = [h for h in hooks if h is not None]
    if len(given) <= 1:
        return given[0] if given else None

    def both() -> None:
        for h in given:
            h()
    return both


def _progress_ticker(req: RequestTable, progress):
    """A cheap per-iteration hook that reports progress at most ~10 times a wall-second."""
    if progress is None:
        return None
    count, due = 0, time.perf_counter() + 0.1

    def tick() -> None:
        nonlocal count, due
        count += 1
        if count & 255 == 0 and time.perf_counter() >= due:
            due = time.perf_counter() + 0.1
            progress(int(np.count_nonzero(~np.isnan(req.finish))), len(req))
    return tick


def write_outputs(result: SimResult, out_dir: Path) -> None:
    """Write requests.csv, steps.csv, scenario.yaml (the resolved scenario, when it reproduces the
    run) and summary.json (strict JSON: a non-finite number is written as null).

    Every file is first written under a temporary name; only when all are complete are they renamed
    into place, summary.json last, with SIGINT and SIGTERM held back for those few renames. So an
    interruption or a failure leaves an earlier complete run in `out_dir` untouched, and a folder
    with summary.json always holds one complete run. A signal that arrives during the renames acts
    once they are done: its KeyboardInterrupt then carries `written_to` (= out_dir)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = json.dumps(finite(result.summary), indent=2, allow_nan=False) + "\n"
    writers = [("requests.csv", lambda f: write_csv(result.requests, f)),
               ("steps.csv", lambda f: write_csv(result.steps, f))]
    if result.scenario is not None:
        scenario_yaml = resolved_yaml(result.scenario).encode()
        writers.append(("scenario.yaml", lambda f: f.write(scenario_yaml)))
    writers.append(("summary.json", lambda f: f.write(summary.encode())))
    temps: list[tuple[str, Path]] = []
    try:
        for name, write in writers:
            fd, temp = tempfile.mkstemp(dir=out_dir, prefix=f".{name}.")
            temps.append((name, Path(temp)))
            give_mode(fd, out_dir / name)
            with os.fdopen(fd, "wb") as f:
                write(f)
        try:
            with writing(out_dir), signals_held():  # (another run writing here: after its renames)
                for name, tmp in temps:
                    os.replace(tmp, out_dir / name)
        except KeyboardInterrupt as interrupted:
            # held until every rename was done: the run is in out_dir in full, and a caller's
            # "nothing was written" would be false; it reads this to say what was kept instead
            interrupted.written_to = out_dir  # type: ignore[attr-defined]
            raise
    finally:
        for _, tmp in temps:
            tmp.unlink(missing_ok=True)


def write_csv(frame: pd.DataFrame, f, rows: int = 1 << 18) -> None:
    """`frame` as CSV into the binary file `f`, written by pyarrow: 6.8-8.1x less CPU than pandas'
    to_csv on a run's two frames (`bench/sim_speed.py`, 10k and 100k requests). Same values, read
    back to the same float64 and int64;
    the text differs from pandas' in that a float is written in its shortest exact form without
    a trailing ".0" or an exponent for small numbers (pandas: 0.0, 1e-05; here: 0, 0.00001). NaN
    is an empty field, as pandas writes it; the header is not quoted."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    f.write((",".join(map(str, frame.columns)) + "\n").encode())
    options = pcsv.WriteOptions(include_header=False, quoting_style="none")
    # `rows` at a time into Arrow: no full Arrow copy of a million-request run's frame beside it
    for start in range(0, max(len(frame), 1), rows):
        pcsv.write_csv(pa.Table.from_pandas(frame.iloc[start:start + rows], preserve_index=False), f, options)


def finite(value):
    """`value` with every NaN or infinity replaced by None (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


# Peak memory of a run, measured (bench/sim_speed.py --child N, peak RSS with the outputs written,
# issue 19's chat workload): 148 MB at 10k requests, 231 MB at 100k, 921 MB at 1M, so ~0.8 KB per
# request on top of ~160 MB for the interpreter, imports and workload (rounded up).
BYTES_PER_REQUEST = 800
BASE_BYTES = 160e6
# Agent sessions hold more per call (users, contexts, fan-out offsets): 3,000,000 calls (10 sessions
# x 3 steps x fan_out 100,000) peaked at 3.12 GB RSS, ~1 KB a call; and the address space a run
# maps is more than it touches: 4.79 GB (VmPeak) for those 3.12 GB (VmHWM), x1.54, so a ulimit -v
# is compared with the estimate x 1.6 (measured on this project's machine, Python 3.11, numpy 2).
AGENT_BYTES_PER_REQUEST = 1000
ADDRESS_PER_RESIDENT = 1.6


def estimate_memory_bytes(num_requests: int, per_request: float = BYTES_PER_REQUEST) -> float:
    return BASE_BYTES + per_request * num_requests


def available_memory_bytes() -> tuple[float, str]:
    """What a run may still take, and what bounds it: the least of the machine's free memory, the
    container's (cgroup v2 memory.max less memory.current) and this process's address-space limit
    (ulimit -v, less the address space already mapped: a limit counts mappings, not pages used)."""
    found = [(float("inf"), "free")]
    try:
        found.append((float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")), "free"))
    except (ValueError, OSError, AttributeError):
        pass
    try:
        cg = Path("/sys/fs/cgroup")
        limit = (cg / "memory.max").read_text().strip()
        if limit != "max":
            found.append((float(limit) - float((cg / "memory.current").read_text()), "free in this container"))
    except (OSError, ValueError):
        pass
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            mapped = next((float(line.split()[1]) * 1024 for line in Path("/proc/self/status").read_text().splitlines()
                           if line.startswith("VmSize:")), 0.0)
            # (as resident bytes: the run maps ADDRESS_PER_RESIDENT x what it touches)
            found.append(((float(soft) - mapped) / ADDRESS_PER_RESIDENT,
                          "all this process's address-space limit (ulimit -v) leaves room for"))
    except (ImportError, OSError, ValueError):
        pass
    return min(found, key=lambda f: f[0])


def check_memory(scenario: Scenario, force: bool = False) -> None:
    """Refuse up front a run whose estimated peak memory exceeds what the machine (its container,
    this process's ulimit) has free."""
    n = scenario.workload.num_requests
    key, per, what = "workload.num_requests", BYTES_PER_REQUEST, f"{n} requests"
    a = scenario.workload.arrival
    if isinstance(a, Agents):  # the sessions' calls, on average: what sets them is named
        n, per = int(a.expected_requests()), AGENT_BYTES_PER_REQUEST
        key = "workload.arrival.fan_out" if a.fan_out is not None else "workload.arrival.sessions"
        what = f"{a.sessions} sessions' calls, {n:,} requests on average,"
    if n is None or force:
        return  # a whole trace: its size was capped when read; or the user said --force
    # the run's own growth against what is left now (the interpreter and imports already hold theirs)
    need, (have, bound) = estimate_memory_bytes(n, per), available_memory_bytes()
    if need > have + BASE_BYTES:
        raise ScenarioError(f"{_where(scenario)}{key}: {what} need about "
                            f"{need / 1e9:.1f} GB ({per} bytes each, measured) but "
                            f"{max(have, 0.0) / 1e9:.1f} GB is {bound}; lower it, or pass --force to try anyway")
