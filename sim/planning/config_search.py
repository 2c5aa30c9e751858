"""The configuration search: GPU type x tensor parallelism x engine knobs, ranked by cost.

    result = search_configs("scenarios/chat-llama3-8b-h100.yaml", slo, gpus=("h100-sxm", "h200"),
                            tps=(1, 2), target=60.0)

For one scenario and SLO, every candidate (a GPU preset, a TP size and an engine setting) gets the
highest load one replica sustains, then the replicas and GPUs a target load needs and their cost.
Simulation is spent where it can change the answer:

1. **Pruned without simulating**: a TP the scenario rules refuse (the model does not fit, TP does
   not divide the heads) and a single replica over `max_gpus` or `budget_usd_per_hour`.
2. **Bounds, 2 simulations per (GPU, TP)**: the engine saturated (10x the scenario's load) gives
   the requests/s a replica completes flat out (under overload, with its preemptions; sustained
   loads under an SLO came out at 0.7-1.2x it on the chat scenario, so it is an estimate, not a
   strict bound); nearly idle (1/100 of that, or one closed-loop user) gives the latency floor: a
   candidate that misses the SLO there misses it at every load. Loads are in the scenario's unit:
   req/s (a generated rate; a trace replayed at time_scale), users (a closed loop: the flat-out
   throughput times one user's cycle, Little's law) or sessions/s (agents: over a session's calls).
   One that could not carry the target within the GPU or dollar limits even at SLACK x its
   saturated throughput is out.
3. **Coarse search** of every engine setting left (the engine curve's grid and seeds, galloping
   from 85% of the saturated throughput); each (GPU, TP)'s best setting by load per GPU, and its
   estimated replicas: target / (headroom x that load). Steps 2-3 run every candidate at once.
4. **With a target, every candidate that could be the cheapest confirmed as its whole cluster**
   (`_clusters`: branch and bound, in order of estimated cost): the fewest replicas whose cluster a
   fresh run meets the SLO in (planner.size_cluster), each candidate after the first only up to
   as many replicas as would still cost less than the cheapest confirmed so far (one run of that
   cluster usually shows it dearer). A candidate whose cost at SLACK x its saturated throughput
   per replica is no lower cannot be the cheapest and is not simulated again. Without a target:
   the lowest $ per million output tokens, refined on the load search's grid while a candidate
   could still win (`_refine`).
5. **The answer** is the cheapest confirmed cluster, its numbers the candidate row's own.

Costs: GPUs = replicas x TP; USD/hour = GPUs x the GPU's price (--price or --gpu-hour-usd, else the
preset's usd_per_hour, said per candidate as price_source); USD per million output
tokens at the sustained load of one replica (TP x price / output tokens/s).
"""
from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from sim.config.errors import ScenarioError
from sim.cost.error_band import step_factors
from sim.features.energy.power import basis
from sim.planning.engine_curve import SETTING_KEYS
from sim.planning.evaluator import Evaluator, PlanOptions
from sim.planning.load_search import Knob, check_target_unit, load_knob, max_load, replay_stats
from sim.planning.parallel import LocalRunner
from sim.planning.planner import Phases, concurrently, mean_usd_per_kwh, size_cluster
from sim.planning.search_report import LAST_RELEASES, TTFT_AT_SUSTAINED, _knobs, bill, candidate_point
from sim.planning.search_report import tp_groups as _units
from sim.planning.vllm_command import vllm_serve
from sim.presets.hardware import HARDWARE_PRESETS
from sim.presets.names import hardware_preset
from sim.scenario import ALL2ALL_BACKENDS, EngineConfig, SLOConfig, load_scenario

# knobs the search can vary; a disaggregated setting's "replica" is a unit of P + D replicas
KNOBS = ("pipeline_parallel_size", "data_parallel_size", "enable_expert_parallel", "all2all_backend", "disaggregation",
         "speculative",
         "scheduler", "enable_prefix_caching",
         "kv_offloading_size", *SETTING_KEYS)
SATURATE = 10.0     # the bound's load: this x the scenario's own
IDLE = 0.01         # the latency floor's load: this x the saturated throughput
START = 0.85        # coarse searches start at this x the saturated throughput
SLACK = 1.5         # pruning by limits assumes a replica could sustain up to this x its saturated throughput


def search_configs(path: str | Path, slo: SLOConfig, *, gpus: Iterable[str], tps: Iterable[int],
                   target: float | None = None, overrides: Iterable[str] = (),
                   seqs: Iterable[int] = (), tokens: Iterable[int] = (), schedulers: Iterable[str] = (),
                   prefix_caching: Iterable[bool] = (), offloading: Iterable[float | None] = (),
                   pps: Iterable[int] = (), dps: Iterable[int] = (), all2all: Iterable[str] = (),
                   speculative: Iterable[dict | None] = (),
                   disaggregation: Iterable[tuple[int, int] | None] = (),
                   max_gpus: int | None = None, budget_usd_per_hour: float | None = None,
                   power_cap_kw: float | None = None,
                   prices: dict[str, float] | None = None, target_unit: str = "req/s",
                   headroom: float = 1.0, options: PlanOptions = PlanOptions(),
                   progress: Callable[..., None] | None = None, runner: Any = None, journal: Any = None) -> dict:
    """Every candidate's sustained load and cost; the cheapest whose confirmed cluster meets the SLO
    at `target` (without a target: the lowest USD per million output tokens at the sustained
    load). `runner`: where simulations run (a DaskRunner for a cluster; default local processes,
    one pool for the search); `journal`: keeps every result (resume)."""
    start = time.perf_counter()
    overrides = tuple(overrides)
    base = load_scenario(path, overrides)
    # (aliases such as h100 or "H100 80GB HBM3" name their preset; a name unknown: the closest ones)
    gpus = [hardware_preset(g, HARDWARE_PRESETS, "--gpus", "GPU") for g in gpus]
    # the load's unit: req/s (a generated rate, or a trace replayed at time_scale), users (a closed
    # loop) or sessions/s (agent sessions); the target is read in it
    own_knob = load_knob(base, options)
    unit = own_knob.unit
    check_target_unit(own_knob, target, target_unit, path)
    settings, keys = _settings(base.engine, seqs=seqs, tokens=tokens, schedulers=schedulers,
                               prefix_caching=prefix_caching, offloading=offloading, pps=pps, dps=dps,
                               all2all=all2all, speculative=speculative, disaggregation=disaggregation)
    given = prices or {}  # every GPU x TP, priced: the user's price, else the preset's (a rounded estimate)
    rows: list[dict[str, Any]] = [
        {"gpu": gpu, "tensor_parallel_size": tp,
         "usd_per_gpu_hour": given[gpu] if gpu in given else HARDWARE_PRESETS[gpu].usd_per_hour,
         "price_source": "--price" if gpu in given else "the hardware preset"}
        for gpu in gpus for tp in tps]
    evaluators: dict[tuple[str, int], Evaluator] = {}
    phases = Phases(progress, ["bounds", "coarse search"] + (["clusters"] if target is not None else ["refining"]))
    own_runner = runner is None
    runner = LocalRunner(options.workers).start() if own_runner else runner
    try:
        # 1-2. prune by rules and bounds (each GPU x TP's two runs at once)
        phases.start("bounds")
        found = concurrently(*[functools.partial(_prune, row, path, slo, overrides, options, runner, settings, target,
                                                 headroom, max_gpus, budget_usd_per_hour, unit, phases, journal)
                               for row in rows])
        evaluators = {(r["gpu"], r["tensor_parallel_size"]): ev for r, ev in zip(rows, found) if ev is not None}

        # 3. coarse search of every setting of every candidate left (the candidates at once)
        phases.start("coarse search")
        live = [r for r in rows if (r["gpu"], r["tensor_parallel_size"]) in evaluators]
        concurrently(*[functools.partial(_coarse, row, evaluators[row["gpu"], row["tensor_parallel_size"]], settings,
                                         keys, target, headroom) for row in live])
        for row in live:
            if row.get("pruned"):
                del evaluators[row["gpu"], row["tensor_parallel_size"]]

        # 4. with a target: every candidate that could be the cheapest, its cluster confirmed
        chosen_row = None
        if target is not None:
            phases.start("clusters")
            chosen_row = _clusters(rows, evaluators, target, headroom, max_gpus, budget_usd_per_hour, power_cap_kw)
        else:  # without one: the lowest $ per million output tokens, refined on the load search's grid
            phases.start("refining")
            chosen_row = _refine(rows, evaluators)

        out = _answer(base, path, slo, target, headroom, max_gpus, budget_usd_per_hour, power_cap_kw, unit, options,
                      settings, keys, rows, chosen_row, evaluators)
        out["pareto"] = pareto(rows, target is not None)
        out["simulations"] = phases.done
        out["read_back"] = journal.read_back if journal is not None else 0
        out["wall_s"] = time.perf_counter() - start
        return out
    finally:
        if own_runner:
            runner.close()


def _settings(e: EngineConfig, *, seqs: Iterable[int], tokens: Iterable[int], schedulers: Iterable[str],
              prefix_caching: Iterable[bool], offloading: Iterable[float | None], pps: Iterable[int],
              dps: Iterable[int], all2all: Iterable[str], speculative: Iterable[dict | None],
              disaggregation: Iterable[tuple[int, int] | None]) -> tuple[list[dict[str, Any]], list[str]]:
    """Every engine setting the search tries (each knob's values given, else the scenario's own),
    and the knobs that vary: each setting holds only those."""
    own_spec = e.speculative.as_yaml() if e.speculative else None
    specs = list(speculative) or [own_spec]
    own_split = e.disaggregation.as_yaml() if e.disaggregation else None
    splits = [None if s is None else {"prefill_replicas": s[0], "decode_replicas": s[1]}
              for s in disaggregation] or [own_split]
    caching: list[bool | None] = list(prefix_caching) or [e.enable_prefix_caching]
    tiers: list[float | None] = list(offloading) or [e.kv_offloading_size]  # GiB of CPU KV tier (None: none)
    stages: list[int] = list(dict.fromkeys(pps)) or [e.pipeline_parallel_size]  # pipeline stages per replica
    # data-parallel ranks per replica; DP > 1 with expert parallelism, as vLLM serves a MoE model so
    ranks: list[tuple[int, bool]] = [(d, True if d > 1 else e.enable_expert_parallel)
                                     for d in dict.fromkeys(dps)] or [(e.data_parallel_size, e.enable_expert_parallel)]
    # the ranks' all-to-all (vLLM's --all2all-backend): compared where there are ranks, the default alone
    backends = list(dict.fromkeys(all2all)) or [e.all2all_backend]
    odd = [b for b in backends if b not in ALL2ALL_BACKENDS]
    if odd:
        raise ScenarioError(f"--all2all-backend: {odd[0]!r} is not one of {', '.join(ALL2ALL_BACKENDS)}")
    default = EngineConfig.all2all_backend
    settings: list[dict[str, Any]] = [
        {"max_num_seqs": n, "max_num_batched_tokens": t, "scheduler": k, "enable_prefix_caching": c,
         "kv_offloading_size": o, "speculative": sp, "disaggregation": dg, "pipeline_parallel_size": p,
         "data_parallel_size": dp, "enable_expert_parallel": ep, "all2all_backend": a2a}
                for dp, ep in ranks for a2a in (backends if dp > 1 else [default])
                for p in stages for dg in splits for sp in specs
                for k in dict.fromkeys(schedulers or [e.scheduler])
                for c in dict.fromkeys(caching) for o in dict.fromkeys(tiers)
                for n in sorted(set(seqs) or {e.max_num_seqs})
                for t in sorted(set(tokens) or {e.max_num_batched_tokens})]
    # the knobs searched (more than one value), the two always shown, and any given one value other
    # than the scenario's (--dp 8 alone: every setting at DP8)
    keys = [k for k in KNOBS if len({str(x[k]) for x in settings}) > 1 or k in SETTING_KEYS
            or any(x[k] != _current(e, k) for x in settings)]
    settings = [{k: x[k] for k in keys} for x in settings]  # only the knobs searched (and the two always shown)
    return settings, keys


def _answer(base, path, slo: SLOConfig, target: float | None, headroom: float, max_gpus: int | None,
            budget: float | None, power_cap_kw: float | None, unit: str, options: PlanOptions,
            settings: list[dict], keys: list[str], rows: list[dict], chosen_row: dict | None,
            evaluators: dict) -> dict[str, Any]:
    """search.json's document but for its timings: the question, every candidate, and the chosen
    row's own confirmed numbers (one source for every file)."""
    out: dict[str, Any] = {"scenario": base.name, "source": str(path), "slo_label": slo.label(),
                           "slo_targets": slo.targets(),  # metric -> [limit ms, percentile]
                           "model": base.model.name, "unit": unit, "target": target, "headroom": headroom,
                           "max_gpus": max_gpus, "budget_usd_per_hour": budget,
                           "power_cap_kw": power_cap_kw,
                           "settings": settings, "candidates": rows, "chosen": None,
                           "options": {k: getattr(options, k) for k in PlanOptions.__dataclass_fields__
                                       if k != "workers"}}
    if base.workload.trace is not None:  # every load is the trace replayed at time_scale = load / native rate
        out["workload"] = replay_stats(base.workload)
    if chosen_row is not None:
        ev = evaluators[chosen_row["gpu"], chosen_row["tensor_parallel_size"]]
        chosen = {**{k: chosen_row[k] for k in keys}, "gpu": chosen_row["gpu"],
                  "tensor_parallel_size": chosen_row["tensor_parallel_size"]}
        if target is not None:
            chosen.update(replicas=chosen_row["replicas"], gpus=chosen_row["gpus"],
                          usd_per_hour=chosen_row["usd_per_hour"], cluster_point=chosen_row["cluster"]["point"],
                          **{k: chosen_row[k] for k in ("electricity_usd_per_hour", "total_usd_per_hour",
                                                        "facility_kw", "band") if chosen_row.get(k) is not None})
        chosen["vllm_serve"] = vllm_serve(ev.load(tuple(chosen_row["coarse_overrides"])))
        out["chosen"] = chosen
    return out


def _prune(row: dict, path, slo: SLOConfig, overrides: tuple[str, ...], options: PlanOptions, runner: Any,
           settings: list[dict], target: float | None, headroom: float, max_gpus: int | None,
           budget: float | None, unit: str, phases: Phases, journal: Any) -> Evaluator | None:
    """Steps 1-2 for one GPU x TP: its evaluator, or None with row["pruned"] saying why."""
    gpu, tp = row["gpu"], row["tensor_parallel_size"]
    extra: tuple[str, ...] = (f"hardware={gpu}", f"engine.tensor_parallel_size={tp}")
    if max_gpus is not None and tp > max_gpus:
        row["pruned"] = f"one replica needs {tp} GPUs > --max-gpus {max_gpus}"
        return None
    if budget is not None and tp * row["usd_per_gpu_hour"] > budget:
        row["pruned"] = f"one replica costs {tp * row['usd_per_gpu_hour']:.2f} USD/h > --budget-usd-per-hour"
        return None
    try:
        ev = _evaluator(path, slo, overrides + extra, options, runner, settings, journal)
    except ScenarioError as err:  # does not fit, TP does not divide the heads, no profile...
        row["pruned"] = str(err).split(": ", 1)[-1] if str(err).startswith(str(path)) else str(err)
        return None
    ev.progress = phases.tick
    knob = load_knob(ev.scenario, ev.options)
    row["cost_model"] = ev.scenario.cost_model.provenance()["name"]
    row.update(_bounds(ev, knob, slo))
    if row.get("pruned"):
        return None
    if target is not None:
        best_case = SLACK * row["bound"]
        need = math.ceil(target / headroom / best_case - 1e-9) * tp
        if max_gpus is not None and need > max_gpus:
            row["pruned"] = f"even at {best_case:.2f} {unit} per replica ({SLACK:g}x its saturated " \
                            f"throughput) the target needs {need} GPUs > --max-gpus {max_gpus}"
        elif budget is not None and need * row["usd_per_gpu_hour"] > budget:
            row["pruned"] = f"even at {SLACK:g}x its saturated throughput the target needs {need} GPUs, " \
                            f"{need * row['usd_per_gpu_hour']:.2f} USD/h > --budget-usd-per-hour"
    return None if row.get("pruned") else ev


def _coarse(row: dict, ev: Evaluator, settings: list[dict], keys: list[str], target: float | None,
            headroom: float) -> None:
    """Step 3 for one GPU x TP: every setting's coarse sustained load (the engine curve's grid and
    seeds, galloping from 85% of the saturated throughput); the best per GPU, its estimated cost."""
    knob = load_knob(ev.scenario, ev.options)
    grid = knob.anchored(row["bound"] * START, max(ev.options.curve_resolution, knob.resolution))
    entries: list[dict[str, Any]] = []
    at = 0
    for setting in settings:
        extra = tuple(f"engine.{k}={_yaml(v)}" for k, v in setting.items() if _current(ev.scenario.engine, k) != v)
        try:
            ev.load(extra)
        except ScenarioError as err:
            entries.append({**setting, "overrides": list(extra), "sustained": None, "refused": str(err)})
            continue
        found = max_load(ev, grid, extra, start=at, gallop=True, seeds=ev.options.curve_ladder(), **setting)
        entries.append({**setting, "overrides": list(extra), "sustained": found["answer"],
                        "next": found["next"], "point": found["answer_point"],
                        "cost_model": ev.load(extra).cost_model.name})
        if found["answer"] is not None:
            at = grid.index(found["answer"])
    row["settings"] = [{k: v for k, v in s.items() if k != "point"} for s in entries]
    bases = {s["cost_model"] for s in entries if "cost_model" in s}
    if len(bases) > 1:  # e.g. DP/EP settings on the roofline beside measured TP ones: said, not hidden
        row["mixed_cost_models"] = ", ".join(f"{_knobs_text(s)}: {s['cost_model']}" for s in entries
                                             if "cost_model" in s)
    best = _best_per_gpu([s for s in entries if "refused" not in s])
    if best is None:  # (every setting refused, e.g. --pp past the model's layers: that is why)
        refused = [s["refused"] for s in entries if "refused" in s]
        row["pruned"] = ("every setting refused: " + "; ".join(dict.fromkeys(refused))
                         if len(refused) == len(entries) else "no setting meets the SLO at any load")
        return
    row.update({k: best[k] for k in keys}, replicas_per_unit=_units(best), coarse_load=best["sustained"],
               coarse_grid=grid.resolution, coarse_overrides=best["overrides"],
               ties=[{k: x[k] for k in keys} for x in entries if x is not best and x["sustained"] is not None
                     and x["sustained"] / _units(x) == best["sustained"] / _units(best)])
    row.update(_costs(row, best["sustained"], best["point"], target, headroom))


def _clusters(rows: list[dict], evaluators: dict, target: float, headroom: float, max_gpus: int | None,
              budget: float | None, power_cap_kw: float | None = None) -> dict | None:
    """Step 4 with a target: branch and bound over the candidates' clusters. In order of estimated
    cost, each candidate that could still be the cheapest (its cost at SLACK x its saturated
    throughput per replica below the cheapest confirmed) is simulated as its whole cluster at the
    target: the fewest replicas that meet the SLO there, confirmed (size_cluster), and at most as
    many as would cost less than the cheapest confirmed so far, so a dearer candidate costs the
    few runs that show it. The cheapest confirmed cluster is the answer (ties: the smaller TP)."""
    live = sorted((r for r in rows if (r["gpu"], r["tensor_parallel_size"]) in evaluators), key=_rank)
    best: dict | None = None
    for row in live:
        ev = evaluators[row["gpu"], row["tensor_parallel_size"]]
        knob = load_knob(ev.scenario, ev.options)
        per_replica_gpus = row["tensor_parallel_size"] * row.get("replicas_per_unit", 1)
        unit_usd = per_replica_gpus * row["usd_per_gpu_hour"]
        fewest = max(1, math.ceil(target / headroom / (SLACK * row["bound"]) - 1e-9))  # (at SLACK x flat out)
        row["replicas_lower_bound"] = fewest
        most = None
        if best is not None:  # cheaper than the best so far: fewer than this many replicas
            # (by the best's whole bill: electricity only adds to a candidate's, so its GPUs alone bound it)
            most = math.ceil(bill(best) / unit_usd - 1e-9) - 1 if unit_usd > 0 else None
            if most is not None and most < fewest:
                row["status"] = (f"cannot be the cheapest: even at {SLACK:g}x its saturated throughput it needs "
                                 f"{fewest} replicas, ${fewest * unit_usd:,.2f}/hour")
                continue
        within = _most_within(max_gpus, budget, per_replica_gpus, unit_usd)
        if within is not None and within < fewest:
            row["status"] = (f"over the limits: even at {SLACK:g}x its saturated throughput it needs {fewest} "
                             f"replicas, {fewest * per_replica_gpus} GPUs, ${fewest * unit_usd:,.2f}/hour")
            continue
        caps = [c for c in (most, within) if c is not None]
        cl = size_cluster(ev, knob, target / headroom, row["coarse_load"], tuple(row["coarse_overrides"]),
                          _scale(row.get("disaggregation")), most=min(caps) if caps else None)
        row["cluster"] = _brief_cluster(cl)
        if cl["replicas"] is None:
            why = "the cheapest so far" if most is not None and min(caps) == most else "the limits"
            row["status"] = (f"dearer: {cl['beyond']} replicas (${cl['beyond'] * unit_usd:,.2f}/hour, just under "
                             f"{why}) miss the SLO at the target")
            continue
        n = cl["replicas"]
        watts = (cl.get("point") or {}).get("facility_w")  # the confirmed cluster's modelled facility power
        row["facility_kw"] = None if watts is None else watts / 1e3
        kwh_usd = mean_usd_per_kwh(ev.scenario.features["energy"])
        if kwh_usd is not None and watts is not None:  # the whole bill ranks: GPU-hours + electricity
            row["electricity_usd_per_hour"] = watts / 1e3 * kwh_usd
        if power_cap_kw is not None and watts is not None and watts / 1e3 > power_cap_kw:
            how = basis(ev.scenario.features["energy"], ev.scenario.hardware)
            row["status"] = (f"over the power cap: {n} replicas meet the SLO but draw {watts / 1e3:,.1f} kW "
                             f"({how}), over {power_cap_kw:g} kW")
            continue
        row.update(replicas=n, gpus=n * per_replica_gpus, usd_per_hour=n * unit_usd, status="confirmed",
                   cluster_load_per_replica=target / headroom / n)
        band = _replica_band(ev.scenario, n, unit_usd)
        if band is not None:
            row["band"] = band
        if "electricity_usd_per_hour" in row:
            row["total_usd_per_hour"] = n * unit_usd + row["electricity_usd_per_hour"]
        if best is None or _rank(row) < _rank(best):
            best = row
    return best


def _replica_band(scenario, replicas: int, unit_usd: float) -> dict | None:
    """The error band of this GPU x TP's path (sim/cost/error_band.step_factors: the step time
    real vLLM may take, x faster .. x slower) carried into the confirmed cluster to first order:
    the replicas a load needs scale with the step time (a replica's capacity with its inverse).
    Not simulated; None where the cost model has no band (unit cost)."""
    f = step_factors(scenario)
    if f is None:
        return None
    lo = max(1, math.ceil(replicas * f["faster"] - 1e-9))
    hi = max(lo, math.ceil(replicas * f["slower"] - 1e-9))
    return {**f, "replicas": [lo, hi], "usd_per_hour": [lo * unit_usd, hi * unit_usd],
            "rule": "replicas scale with the step time, to first order (not simulated)"}


def _most_within(max_gpus: int | None, budget: float | None, gpus_per_replica: int, unit_usd: float) -> int | None:
    """The most replicas --max-gpus and --budget-usd-per-hour allow (None: no limit)."""
    caps = []
    if max_gpus is not None:
        caps.append(max_gpus // gpus_per_replica)
    if budget is not None and unit_usd > 0:
        caps.append(math.floor(budget / unit_usd + 1e-9))
    return min(caps) if caps else None


def _brief_cluster(cl: dict) -> dict:
    """A candidate's cluster, for the table: its count, the point that confirmed it, what was tried."""
    keep = ("met", "seeds", "passes", "replicas", "overrides", "ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "bettable",
            "steady",
            "output_throughput", "total_token_throughput", "request_throughput", "stopped")
    brief = lambda p: {k: p[k] for k in keep if k in p} if p else None  # noqa: E731
    return {"replicas": cl["replicas"], "beyond": cl["beyond"], "requests_per_run": cl["requests_per_run"],
            "point": brief(cl["point"]), "one_fewer": brief(cl["one_fewer"]),
            "tried": [brief(p) for p in cl["tried"]]}


def _refine(rows: list[dict], evaluators: dict) -> dict | None:
    """Step 4 without a target: refine, in order of coarse $ per million output tokens, each
    candidate's best setting on the load search's grid while its coarse cost could still be the
    lowest (a refined answer is at most a grid step above the coarse one)."""
    live = sorted((r for r in rows if (r["gpu"], r["tensor_parallel_size"]) in evaluators), key=_rank)
    cheapest = None
    for row in live:
        slack = 1 + row["coarse_grid"]
        if cheapest is not None and _rank(row, slack) > _rank(cheapest):
            row["status"] = "coarse (cannot be the cheapest)"
            continue
        ev = evaluators[row["gpu"], row["tensor_parallel_size"]]
        knob = load_knob(ev.scenario, ev.options)
        found = max_load(ev, knob, tuple(row["coarse_overrides"]), start=knob.index(row["coarse_load"]), gallop=True)
        if found["answer"] is None:
            row.update(status="fails when refined", sustained_load=None)
            continue
        row.update(status="refined", sustained_load=found["answer"], confidence=found["confidence"],
                   estimate=found["estimate"])
        row.update(_costs(row, found["answer"], found["answer_point"], None, 1.0))
        if cheapest is None or _rank(row) < _rank(cheapest):
            cheapest = row
    return cheapest


def _best_per_gpu(entries: list[dict]) -> dict | None:
    """The setting sustaining the most load per GPU (a disaggregated unit has P + D replicas); ties
    as the engine curve breaks them (sim/planning/engine_curve._best)."""
    ok = [p for p in entries if p["sustained"] is not None]
    return max(ok, key=lambda p: (p["sustained"] / _units(p), -len(p["overrides"]), -p["max_num_seqs"],
                                  -p["max_num_batched_tokens"])) if ok else None


LAYOUT_KNOBS = ("pipeline_parallel_size", "data_parallel_size", "enable_expert_parallel", "all2all_backend")


def _evaluator(path, slo: SLOConfig, overrides: tuple[str, ...], options: PlanOptions, runner: Any,
               settings: list[dict], journal: Any = None) -> Evaluator:
    """The candidate's evaluator on the scenario's own layout, else on the first searched layout
    that loads (a model too big for TP4 alone may fit as TP4 x PP2); the scenario's own error if none."""
    try:
        return Evaluator(path, slo, overrides, options, runner=runner, journal=journal)
    except ScenarioError as err:
        for setting in settings:
            layout = tuple(f"engine.{k}={_yaml(v)}" for k, v in setting.items() if k in LAYOUT_KNOBS)
            if layout:
                try:
                    return Evaluator(path, slo, overrides + layout, options, runner=runner, journal=journal)
                except ScenarioError:
                    continue
        raise err


def _knobs_text(setting: dict) -> str:
    return _knobs({k: setting[k] for k in setting if k in KNOBS})  # (the report's wording)


def _scale(split: dict | None):
    """size_cluster's overrides for n replicas: n disaggregated units, or engine.replicas=n."""
    if split is None:
        return None
    def overrides(n: int) -> tuple[str, ...]:
        units = {**split, "prefill_replicas": n * split["prefill_replicas"],
                 "decode_replicas": n * split["decode_replicas"]}
        return (f"engine.disaggregation={_yaml(units)}",)
    return overrides


def _yaml(v) -> str:
    """A --set value: booleans and mappings as YAML writes them, None as null."""
    if isinstance(v, dict):
        return yaml.safe_dump(v, default_flow_style=True, sort_keys=False).strip()
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def _current(engine, key: str):
    """The engine's value of a searched knob, as a setting writes it (speculative: its mapping)."""
    v = getattr(engine, key)
    return v.as_yaml() if key in ("speculative", "disaggregation") and v is not None else v


def _bounds(ev: Evaluator, knob: Knob, slo: SLOConfig) -> dict:
    """One replica's load flat out in the knob's unit (where to start searching; `bound`) and the
    latency floor (nearly idle): one seed each."""
    saturated = ev.runs(knob.overrides(knob.value(0) * SATURATE, ev.options), range(1), whole=True)[0]
    flat_out = saturated["request_throughput"]  # requests/s completed under overload
    # nearly idle: one user of a closed loop, else 1/100 of the flat-out load
    idle_load = 1 if knob.integer else max(in_unit(knob, flat_out, 0.0) * IDLE, 1e-3)
    idle = ev.runs(knob.overrides(idle_load, ev.options), range(1), whole=True)[0]
    out: dict[str, Any] = {"bound": in_unit(knob, flat_out, idle["request_throughput"]),
                           "bound_request_throughput": flat_out}
    if not idle["met"]:
        worst = max(slo.targets(), key=lambda k: (idle[k]["slo"] or 0) / slo.targets()[k][0])
        out["pruned"] = (f"misses the SLO even nearly idle: {worst} {idle[worst]['slo']:.1f} ms > "
                         f"{slo.targets()[worst][0]:g} ms")
    return out


def in_unit(knob: Knob, flat_out: float, one_user: float) -> float:
    """The flat-out throughput (requests/s) as a load in the knob's unit: itself (req/s); over a
    session's mean calls (sessions/s); for a closed loop, by Little's law, users = throughput x a
    user's cycle (response + think), the cycle measured alone as 1 / `one_user`'s throughput (requests/s
    of one user), so flat_out / one_user, at least 1. Like the rate's, an estimate: responses slow
    under load, and an overloaded engine can complete less than at the SLO's load (preemptions): on
    the bundled closed loop (Llama-3-8B, H100/A100, TP1/2, roofline) the users sustained came out at
    0.5-1.4x it. The search gallops from 85% of it."""
    if knob.unit == "sessions/s":
        return flat_out / knob.per_count
    if knob.integer:
        return max(1.0, flat_out / one_user) if one_user > 0 else 1.0
    return flat_out


def _costs(row: dict, sustained: float, point: dict, target: float | None, headroom: float) -> dict:
    """Replicas (estimated: target / (headroom x sustained)), GPUs and USD for the target; USD per
    million output tokens at one replica's sustained load."""
    tp, price = row["tensor_parallel_size"] * row.get("replicas_per_unit", 1), row["usd_per_gpu_hour"]
    out_tps = point["output_throughput"] if point else 0.0
    out = {"sustained_per_gpu": sustained / tp,
           "usd_per_million_output_tokens": tp * price / (out_tps * 3600) * 1e6 if out_tps > 0 else None,
           TTFT_AT_SUSTAINED: point["ttft_ms"]["p99"] if point else None}
    out[LAST_RELEASES[TTFT_AT_SUSTAINED]] = out[TTFT_AT_SUSTAINED]
    if target is not None:  # (estimated from one replica; a candidate's cluster replaces these: _clusters)
        replicas = math.ceil(target / (headroom * sustained) - 1e-9)
        out.update(replicas_estimate=replicas, gpus_estimate=replicas * tp, usd_per_hour_estimate=replicas * tp * price)
    return out


def _rank(row: dict, slack: float = 1.0) -> tuple:
    """Cheapest first: USD/hour for the target (a confirmed cluster's, else the estimate from one
    replica's coarse load), else USD per million output tokens; `slack` > 1 is the most the cost
    can fall when the coarse answer is refined."""
    if "usd_per_hour" in row:
        return (bill(row), row["tensor_parallel_size"])
    if "usd_per_hour_estimate" in row:
        return (row["usd_per_hour_estimate"], row["tensor_parallel_size"])
    per_m = row.get("usd_per_million_output_tokens")
    return ((per_m or math.inf) / slack, row["tensor_parallel_size"])


def pareto(rows: list[dict], with_target: bool) -> list[dict]:
    """The candidates no other beats on both cost and p99 TTFT, each where pareto.png puts it
    (search_report.candidate_point: a confirmed cluster's numbers, else the estimate)."""
    kinds = ("confirmed",) if with_target else ("refined", "coarse")  # (a bound is no point to trade off)
    points: list[tuple[dict, tuple[float, float, str]]] = []
    for r in rows:
        p = candidate_point(r, with_target)
        if p is not None and p[2] in kinds and "limits" not in r.get("status", ""):
            points.append((r, p))
    key = "usd_per_hour" if with_target else "usd_per_million_output_tokens"
    front = []
    for r, (c, t, kind) in points:
        if not any(o is not r and oc <= c and ot <= t and (oc < c or ot < t) for o, (oc, ot, _) in points):
            front.append({"gpu": r["gpu"], "tensor_parallel_size": r["tensor_parallel_size"], key: c,
                          "ttft_ms.p99": t, LAST_RELEASES[TTFT_AT_SUSTAINED]: t, "kind": kind,
                          "status": r.get("status")})
    return sorted(front, key=lambda f: f[key])
