"""What `servesim plan` is asked, checked once, and the plan or configuration search it runs.

    request = PlanRequest(scenario=path, slo="ttft_ms=500", target_rate=20.0, gpus="h100-sxm,h200")
    job = prepare(request)               # every option and the scenario checked: ScenarioError, one line
    result = job.run(progress)           # the simulations (plan, or a GPU x TP x setting search)
    job.write(result)                    # plan.md / search.md, the JSON and plots into job.out_dir

The option mini-languages ("64,128,256", "off,eagle:3:0.7", "off,1:3", "on,off") are parsed here, so
that the CLI only passes text through and a notebook can call the same thing.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sim.config.checks import MAX_COUNT, MAX_RATE, check_out_dir
from sim.config.errors import ScenarioError
from sim.files import staged, write_file, writing
from sim.planning.evaluator import PlanOptions
from sim.planning.plan_options import PlanRequest
from sim.planning.slo import parse_slo
from sim.presets.hardware import HARDWARE_PRESETS
from sim.presets.names import hardware_preset
from sim.scenario import Scenario, SLOConfig, load_scenario
from sim.schedulers import SCHEDULERS


@dataclass(frozen=True)
class PlanJob:
    """A checked request, ready to run: what it runs on and where it writes."""
    request: PlanRequest
    scenario: Scenario
    slo: SLOConfig
    options: PlanOptions
    out_dir: Path

    @property
    def gpus(self) -> list[str]:
        """The GPU types planned: --gpus, else the scenario's."""
        return planned_gpus(self.request, self.scenario)

    @property
    def prices(self) -> dict[str, float]:
        """USD per GPU-hour given for the GPU types planned (the others: their preset's price)."""
        r = self.request
        given = parse_prices(r.price)
        if r.gpu_hour_usd is not None:
            given = {g: r.gpu_hour_usd for g in self.gpus} | given
        return given

    @property
    def fleet(self) -> bool:
        """A fleet plan (the scenario autoscales): the cheapest policy over its whole run
        (sim/planning/fleet_plan.py), rather than one replica's sustained load."""
        return self.scenario.engine.autoscaling is not None

    @property
    def label(self) -> str:
        return "planning a fleet" if self.fleet else "searching" if self.request.searches else "planning"

    def run(self, progress: Callable[..., None] | None = None,
            note: Callable[[str], None] | None = None, keep: bool = True) -> dict:
        """The plan or search; on request.cluster's Dask workers when given (one connection). With
        `keep`, every simulation is kept in out_dir's journal as it finishes
        (sim/planning/journal.py): the same command again resumes an interrupted plan, simulating
        only what was missing; `note` hears what the journal held. Without, nothing is written."""
        from contextlib import nullcontext

        from sim.planning.journal import Journal

        kept = Journal.open(self.out_dir, self.fingerprint(), note=note) if keep else nullcontext(None)
        with kept as journal:
            if note is not None and journal is not None and journal.kept:
                note(f"resuming: {journal.kept} simulations kept in {journal.path} are read back, not simulated again")
            if self.request.cluster is None:
                return self._run(progress, None, journal)
            from sim.planning.parallel import DaskRunner

            with DaskRunner(self.request.cluster) as runner:
                return self._run(progress, runner, journal)

    def fingerprint(self) -> dict:
        """What every simulation of this plan depends on beyond its own overrides and seed: the
        scenario file and the files it names (their bytes), the SLO and the rules that judge and
        stop runs, servesim's version and sources."""
        from sim.planning.journal import file_digest, source_digest
        from sim.version import __version__

        sc, o = self.scenario, self.options
        files = {"scenario": file_digest(self.request.scenario)}
        profile = sc.cost_model.provenance().get("profile")
        if profile:
            files["profile"] = file_digest(profile)
        if sc.workload.trace is not None:
            files["trace"] = file_digest(sc.workload.trace)
        return {"servesim": __version__, "sources": source_digest(), "files": files,
                "overrides": list(self.request.overrides), "slo": self.slo.label(),
                "warmup_fraction": o.warmup_fraction, "early_stop": o.early_stop, "clear_fail": o.clear_fail}

    def _run(self, progress: Callable[..., None] | None, runner: Any, journal: Any = None) -> dict:
        r = self.request
        target = r.target_rate if r.target_users is None else r.target_users
        seqs = parse_int_list("--max-num-seqs", r.max_num_seqs)
        tokens = parse_int_list("--max-num-batched-tokens", r.max_num_batched_tokens)
        if self.fleet:
            from sim.planning.fleet_plan import WINDOW_S, plan_fleet

            return plan_fleet(r.scenario, self.slo, overrides=r.overrides, window_s=r.window_s or WINDOW_S,
                              seeds=r.seeds, gpu_hour_usd=self.prices.get(self.scenario.hardware.name),
                              workers=r.workers, runner=runner, progress=progress, journal=journal,
                              power_cap_kw=r.power_cap_kw, availability=r.availability, fault_seeds=r.fault_seeds)
        if r.searches:
            from sim.planning.config_search import search_configs

            e = self.scenario.engine
            return search_configs(
                r.scenario, self.slo, gpus=self.gpus, prices=self.prices,
                tps=parse_int_list("--tp", r.tp) or (e.tensor_parallel_size,), target=target,
                target_unit="users" if r.target_users is not None else "req/s",
                overrides=r.overrides, seqs=seqs or (), tokens=tokens or (),
                schedulers=parse_schedulers(r.schedulers or e.scheduler),
                prefix_caching=parse_on_off("--prefix-caching", r.prefix_caching),
                offloading=parse_offload_list(r.kv_offloading_size),
                pps=parse_int_list("--pp", r.pp) or (), dps=parse_int_list("--dp", r.dp) or (),
                all2all=parse_backends(r.all2all_backend),
                speculative=parse_spec_list(r.speculative), disaggregation=parse_split_list(r.disaggregation),
                max_gpus=r.max_gpus, budget_usd_per_hour=r.budget_usd_per_hour, headroom=r.headroom,
                power_cap_kw=r.power_cap_kw, options=self.options, progress=progress, runner=runner, journal=journal)
        from sim.planning.planner import plan

        result = plan(r.scenario, self.slo, overrides=r.overrides, options=self.options, progress=progress,
                      target=target, target_unit="users" if r.target_users is not None else "req/s",
                      gpu_hour_usd=self.prices.get(self.scenario.hardware.name), headroom=r.headroom, band=r.band,
                      seqs_grid=seqs, power_cap_kw=r.power_cap_kw,
                      tokens_grid=tokens, runner=runner, journal=journal)
        if r.availability is not None:
            result["spares"] = self._spares(result, progress)
        return result

    def _spares(self, result: dict, progress: Callable[..., None] | None) -> dict | None:
        """The spares the planned cluster needs under the scenario's faults for request.availability:
        the cluster's own run (its overrides: setting, load, requests, replicas) with the faults
        back, N+k for k = 0.. max_spares (sim/planning/spares.py). None: the plan has no cluster."""
        from sim.planning.spares import plan_spares

        cluster = result.get("cluster") or {}
        r = self.request
        assert r.availability is not None  # (run() asks only then)
        if cluster.get("replicas") is None or not (cluster.get("point") or {}).get("overrides"):
            return None
        overrides = r.overrides + tuple(cluster["point"]["overrides"])
        try:
            sc = replace(load_scenario(r.scenario, overrides), slo=self.slo)
        except ScenarioError as e:  # (e.g. a spot notice naming a replica the planned cluster does not have)
            # the plan stands (nothing lost); the spares say why they were not sized
            why = f"the planned cluster of {cluster['replicas']} replica(s) does not fit the scenario's faults: {e}"
            result["warnings"].append(f"--availability: {why}")
            return {"refused": why}
        done = result["simulations"]
        tick = None if progress is None else \
            lambda d, t, _eta: progress(done + d, done + t, "spares under the faults")  # noqa: E731
        out = plan_spares(sc, r.availability, r.fault_seeds, r.max_spares, progress=tick)
        out["overrides"] = list(cluster["point"]["overrides"])
        return out

    def unmet(self, result: dict) -> list[str]:
        """Why nothing meets the SLO, one line each (empty when an answer was found): the plan's
        lowest failing load, or each searched candidate's reason for being left out."""
        if self.fleet:
            cap = result.get("power_cap")
            if cap is not None and not cap["within"]:
                return [f"no fleet within --power-cap-kw {cap['kw']:g} meets the SLO: the peak needs "
                        f"{cap['replicas_at_peak']} replicas, which may draw up to {cap['peak_kw_at_most']:,.1f} kW "
                        f"({cap['basis']})"]
            return [] if result["policy"] is not None else [
                "no autoscaled policy meets the SLO in every window (plan.md lists the probes)"]
        if not self.request.searches:
            s = result["load_search"]
            unit = s.get("unit") or "req/s"
            if s["answer"] is not None:
                return []
            slo = {**(result.get("slo") or {}), "percentiles": result.get("slo_percentiles") or {}}
            return [f"no load meets the SLO: one replica fails it even at {s['next']:g} {unit}"
                    + _failing_target(s.get("next_point") or {}, slo) + " (plan.md says how)"]
        if result["chosen"] is not None:
            return []
        return [f"{row['gpu']} TP{row['tensor_parallel_size']}: "
                + (row.get("pruned") or row.get("status") or "not confirmed") for row in result["candidates"]]

    def emit(self, result: dict) -> list[Path]:
        """The deployable files of the answer (sim/planning/deploy.py) into request.emit; [] when
        there is no vLLM command to deploy (no answer, or the static scheduler)."""
        from sim.planning.deploy import deploy_files

        if self.request.emit is None:
            return []
        answer = result.get("chosen") if self.request.searches else result.get("recommendation")
        if not answer or not answer.get("vllm_serve"):
            return []
        gpus = int(answer["tensor_parallel_size"]) * int(answer.get("pipeline_parallel_size") or 1) \
            * int(answer.get("data_parallel_size") or 1)  # per pod
        files = deploy_files(answer["vllm_serve"], int(answer.get("replicas", 1)), gpus, self.scenario.name)
        self.request.emit.mkdir(parents=True, exist_ok=True)
        emit = self.request.emit
        with writing(emit), staged(emit) as stage:  # (one plan's files whole, not a mix of two)
            for name, text in files.items():
                write_file(stage / name, text, executable=name.endswith(".sh"))
        return [emit / name for name in files]

    def write(self, result: dict) -> tuple[str, list[tuple[str, str]], str]:
        """Write the report; (the headline table's title, its rows, what was written). Another
        plan writing into the same folder waits for this one's files, or this for its; the files
        land whole or not at all (a full disk leaves an earlier plan there as it was)."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        with writing(self.out_dir), staged(self.out_dir) as stage:
            return self._write(result, stage)

    def _write(self, result: dict, out: Path) -> tuple[str, list[tuple[str, str]], str]:
        if self.fleet:
            from sim.planning.fleet_report import FLEET_PNG, fleet_headline, write_fleet_report

            write_fleet_report(result, out)
            return (f"servesim plan (a fleet): {result['scenario']}", fleet_headline(result),
                    f"plan.md, plan.json, {FLEET_PNG}")
        if self.request.searches:
            from sim.planning.search_report import search_headline, write_search_report

            write_search_report(result, out)
            return (f"servesim plan --gpus/--tp: {result['scenario']}", search_headline(result),
                    "search.md, search.json, pareto.png")
        from sim.planning.plan_report import headline, write_report

        write_report(result, out)
        return f"servesim plan: {result['scenario']}", headline(result), "plan.md, plan.json, plots"


def _failing_target(point: dict, slo: dict) -> str:
    """', where p99 TTFT is 1.5x (or more) its 0.001 ms target': which target the lowest load tried
    fails, by how much (a run stopped early gives a lower bound), and what that means."""
    steady = point.get("steady") or {}
    key = steady.get("binding")
    ratio = (steady.get("mean_ratio") or {}).get(key)
    if key is None or ratio is None or slo.get(key) is None:
        return ""
    pct = (slo.get("percentiles") or {}).get(key, slo.get("percentile", 99))
    bound = " or more (its runs stopped early, certain to miss)" if point.get("stopped") else ""
    return (f", where p{pct:g} {key.split('_')[0].upper()} is {ratio:.3g}x{bound} its {slo[key]:g} ms target "
            f"({key}); at the lowest load tried the requests barely queue, so the target is likely below "
            "what one request alone takes")


def _check_numbers(r: PlanRequest) -> None:
    """The options that are numbers, and the ones that need another, checked before the scenario is
    read: ScenarioError, one line naming the flag."""
    if r.target_rate is not None and r.target_users is not None:
        raise ScenarioError("--target-rate and --target-users: give one (a rate for open-loop "
                            "scenarios, users for closed-loop ones)")
    whole = ("--target-users", "--seeds", "--workers", "--min-requests")  # (the rest: any number > 0)
    for flag, v in (("--target-rate", r.target_rate), ("--target-users", r.target_users),
                    ("--seeds", r.seeds), ("--resolution", r.resolution), ("--workers", r.workers),
                    ("--horizon-s", r.horizon_s), ("--min-requests", r.min_requests),
                    ("--power-cap-kw", r.power_cap_kw)):
        if v is not None and not 0 < v < math.inf:
            rule = "an integer >= 1" if flag in whole else "a finite number > 0"
            raise ScenarioError(f"{flag}: {v} is not {rule}")
    for flag, v, cap in (("--target-rate", r.target_rate, MAX_RATE), ("--target-users", r.target_users, MAX_COUNT)):
        if v is not None and v > cap:  # said before any search runs
            raise ScenarioError(f"{flag}: {v:g} is more than {cap:g}, the most servesim plans for")
    if r.resolution is not None and not r.resolution < 1:  # (> 0: above) a grid step, as a fraction
        raise ScenarioError(f"--resolution: {r.resolution:g} is not a fraction under 1 (the load grid's step: "
                            "0.02 puts loads 2% apart)")
    if r.cluster is not None and r.workers is not None:
        raise ScenarioError("--workers: not used with --cluster (the cluster's workers run the plan)")
    if r.availability is not None:
        if not 0 < r.availability <= 1:
            raise ScenarioError(f"--availability: {r.availability:g} is not a fraction in (0, 1] (e.g. 0.999)")
        if r.searches:
            raise ScenarioError("--availability: not with a configuration search (--gpus, --tp, ...) yet; "
                                "plan the chosen configuration with it (docs/faults.md)")
    for flag, v, lo in (("--max-spares", r.max_spares, 0), ("--fault-seeds", r.fault_seeds, 1)):
        if not isinstance(v, int) or not lo <= v <= 64:
            raise ScenarioError(f"{flag}: {v} is not an integer in [{lo}, 64]")
    if r.window_s is not None and not 0 < r.window_s < math.inf:
        raise ScenarioError(f"--window-s: {r.window_s} is not a finite number > 0")
    if r.gpu_hour_usd is not None and not 0 <= r.gpu_hour_usd < math.inf:
        raise ScenarioError(f"--gpu-hour-usd: {r.gpu_hour_usd} is not a finite number >= 0")


def prepare(r: PlanRequest, note: Callable[[str], None] | None = None) -> PlanJob:
    """Every option checked and the scenario loaded, before any simulation: ScenarioError, one line.
    `note` hears what servesim guessed (a cost model fallen back to an estimate) as soon as it is known."""
    _check_numbers(r)
    sc = load_scenario(r.scenario, r.overrides)
    _check_fleet(r, sc)
    if r.availability is not None and sc.features.get("faults") is None:
        raise ScenarioError(f"--availability: {r.scenario} has no faults: section; the spares are sized against "
                            "a fault model (docs/faults.md)")
    if r.availability is not None and sc.engine.autoscaling is None and r.target_rate is None \
            and r.target_users is None:  # (a fleet plan takes the scenario's own load)
        raise ScenarioError("--availability: needs --target-rate (or --target-users): the spares are "
                            "those of the cluster sized for it")
    planned = planned_gpus(r, sc)
    if r.gpu_hour_usd is not None and len(set(planned)) > 1:
        raise ScenarioError(f"--gpu-hour-usd: one price for {len(set(planned))} GPU types ({', '.join(planned)}); "
                            f"price each: --price {planned[0]}=USD,{planned[1]}=USD")
    unplanned = sorted(set(parse_prices(r.price)) - set(planned))
    if unplanned:
        raise ScenarioError(f"--price {unplanned[0]}: not a GPU this plan uses ({', '.join(planned)})")
    given = parse_prices(r.price)
    for gpu in dict.fromkeys(planned):  # a preset without a citable price is not free: ask for one
        own = sc.hardware.usd_per_hour if gpu == sc.hardware.name else 0.0
        preset = HARDWARE_PRESETS.get(gpu)
        if preset is not None and preset.usd_per_hour == 0 and not own and gpu not in given and r.gpu_hour_usd is None:
            raise ScenarioError(f"--price: {gpu} has no preset price (no public on-demand rate servesim can cite); "
                                f"give yours: --price {gpu}=USD (per GPU-hour), or hardware.usd_per_hour")
    if sc.cost_model.notice and note is not None:
        note(sc.cost_model.notice)
    if r.slo is not None:
        slo = parse_slo(r.slo)
        if sc.slo is not None and sc.slo.classes:  # --slo is the default targets; the classes keep their own
            slo = replace(slo, classes=sc.slo.classes)
            if note is not None:
                note(f"--slo sets the targets of every workload class without its own; "
                     f"{', '.join(n for n, _ in sc.slo.classes)} keep slo.classes' targets")
    elif sc.slo is not None:
        slo = sc.slo
    else:
        raise ScenarioError(f"--slo: missing and {r.scenario} has no slo: section; "
                            "e.g. --slo ttft_ms=500,tpot_ms=50,percentile=99")
    out_dir = r.out if r.out is not None else Path("runs") / f"{sc.name}-plan"
    check_out_dir(out_dir)
    if r.emit is not None:
        check_out_dir(r.emit, "--emit")
    if not 0.5 <= r.confidence < 1:
        raise ScenarioError(f"--confidence: {r.confidence:g} is not in [0.5, 1)")
    # the list options, checked now (run() parses them again: cheap, and the job stays plain data)
    parse_int_list("--max-num-seqs", r.max_num_seqs)
    parse_int_list("--max-num-batched-tokens", r.max_num_batched_tokens)
    if r.searches:
        parse_int_list("--tp", r.tp)
        parse_int_list("--pp", r.pp)
        parse_int_list("--dp", r.dp)
        parse_backends(r.all2all_backend)
        parse_schedulers(r.schedulers or sc.engine.scheduler)
        parse_on_off("--prefix-caching", r.prefix_caching)
        parse_offload_list(r.kv_offloading_size)
        parse_spec_list(r.speculative)
        parse_split_list(r.disaggregation)
    seeds = r.seeds  # near a target; 2 first (1 with --seeds 1), up to twice as many across it
    options = PlanOptions(first_seeds=min(2, seeds), seeds=seeds, max_seeds=max(2 * seeds, PlanOptions.max_seeds),
                          curve_seeds=min(2, seeds), curve_max_seeds=seeds, resolution=r.resolution,
                          horizon_s=r.horizon_s, min_requests=r.min_requests, confidence=r.confidence,
                          max_requests=max(r.min_requests, PlanOptions.max_requests), workers=r.workers)
    return PlanJob(r, sc, slo, options, out_dir)


def _check_fleet(r: PlanRequest, sc: Scenario) -> None:
    """A fleet plan (engine.autoscaling) takes the scenario's own load, hardware and engine: the
    options that size one replica or search configurations are refused, and --window-s needs it."""
    if sc.engine.autoscaling is None:
        if r.window_s is not None:
            raise ScenarioError("--window-s: only for a fleet plan (a scenario with engine.autoscaling; docs/fleet.md)")
        return
    given = [flag for flag, v in (
        ("--target-rate", r.target_rate), ("--target-users", r.target_users), ("--gpus", r.gpus), ("--tp", r.tp),
        ("--pp", r.pp), ("--dp", r.dp), ("--all2all-backend", r.all2all_backend),
        ("--schedulers", r.schedulers), ("--speculative", r.speculative), ("--disaggregation", r.disaggregation),
        ("--prefix-caching", r.prefix_caching), ("--kv-offloading-size", r.kv_offloading_size),
        ("--max-num-seqs", r.max_num_seqs),
        ("--max-num-batched-tokens", r.max_num_batched_tokens), ("--horizon-s", r.horizon_s), ("--emit", r.emit),
        ("--max-gpus", r.max_gpus), ("--budget-usd-per-hour", r.budget_usd_per_hour)) if v is not None]
    if sc.engine.admission is not None:
        raise ScenarioError("plan: engine.admission is set; a fleet plan sizes a fleet that serves every request "
                            "(remove it with --set engine.admission=null; docs/fleet.md)")
    if sc.engine.autoscaling.min_replicas_schedule:
        raise ScenarioError("plan: engine.autoscaling.min_replicas_schedule is set; a fleet plan searches "
                            "target_in_flight and min_replicas, not a schedule (remove it with "
                            "--set engine.autoscaling.min_replicas_schedule=null)")
    if given:
        raise ScenarioError(f"{given[0]}: not with a fleet plan ({r.scenario} sets engine.autoscaling: the plan "
                            "searches its policy over the scenario's own load; docs/fleet.md)")


def planned_gpus(r: PlanRequest, scenario: Scenario) -> list[str]:
    """The GPU types a request plans: --gpus, else the scenario's."""
    return [g.strip() for g in (r.gpus or scenario.hardware.name).split(",")]


def parse_prices(text: str | None) -> dict[str, float]:
    """'h100-sxm=2.5,h200=3.4' -> {"h100-sxm": 2.5, "h200": 3.4}: USD per GPU-hour of hardware presets."""
    out: dict[str, float] = {}
    for item in (x.strip() for x in (text or "").split(",") if x.strip()):
        name, sep, value = item.partition("=")
        name = hardware_preset(name.strip(), HARDWARE_PRESETS, f"--price {item!r}", "GPU")
        try:
            usd = float(value) if sep else math.nan
        except ValueError:
            usd = math.nan
        if not 0 <= usd < math.inf:
            raise ScenarioError(f"--price {item!r}: write NAME=USD, a number >= 0 per GPU-hour (e.g. {name}=2.5)")
        if name in out:  # (two prices for one GPU: which was meant is not ours to guess)
            raise ScenarioError(f"--price {item!r}: {name} is priced twice (${out[name]:g} and ${usd:g}); give one")
        out[name] = usd
    return out


def parse_int_list(flag: str, text: str | None) -> tuple[int, ...] | None:
    """'64,128,256' -> (64, 128, 256); None when not given; a bad item is one line naming the flag."""
    if text is None:
        return None
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item.isdigit() or int(item) < 1:
            raise ScenarioError(f"{flag}: {item!r} is not an integer >= 1 (write e.g. {flag} 64,128,256)")
        out.append(int(item))
    return tuple(out)


def parse_schedulers(text: str) -> list[str]:
    names = [k.strip() for k in text.split(",")]
    for k in names:
        if k not in SCHEDULERS:
            raise ScenarioError(f"--schedulers: unknown scheduler {k!r}; allowed: {', '.join(SCHEDULERS)}")
    return names


def parse_on_off(flag: str, text: str | None) -> list[bool]:
    """'on,off' -> [True, False]; None -> []."""
    values = {"on": True, "off": False}
    items = [c.strip().lower() for c in text.split(",")] if text else []
    for c in items:
        if c not in values:
            raise ScenarioError(f"{flag}: {c!r} is not on or off (write {flag} on,off)")
    return [values[c] for c in items]


def parse_backends(text: str | None) -> list[str]:
    """'allgather_reducescatter,deepep_low_latency' -> the list (vLLM's --all2all-backend names); None -> []."""
    from sim.scenario import ALL2ALL_BACKENDS

    out = [c.strip() for c in text.split(",")] if text else []
    for name in out:
        if name not in ALL2ALL_BACKENDS:
            raise ScenarioError(f"--all2all-backend: {name!r} is not one of {', '.join(ALL2ALL_BACKENDS)}")
    return list(dict.fromkeys(out))


def parse_offload_list(text: str | None) -> list[float | None]:
    """'0,16,64' -> [None, 16.0, 64.0]: GiB of CPU KV tier (engine.kv_offloading_size), 0 for none
    (each candidate checked when its scenario loads); None -> []."""
    out: list[float | None] = []
    for item in [c.strip() for c in text.split(",")] if text else []:
        try:
            gib = float(item)
        except ValueError:
            gib = math.nan
        if not (gib >= 0 and math.isfinite(gib)):
            raise ScenarioError(f"--kv-offloading-size: {item!r} is not a size in GiB >= 0 (0: no CPU tier), "
                                "e.g. --kv-offloading-size 0,16,64")
        out.append(None if gib == 0 else gib)
    return list(dict.fromkeys(out))


def parse_spec_list(text: str | None) -> list[dict[str, Any] | None]:
    """'off,eagle:3:0.7,draft:4:0.6:llama-2-7b' -> [None, {method: eagle, ...}, ...] (checked when
    each setting's scenario loads: engine.speculative's rules)."""
    if text is None:
        return []
    out: list[dict[str, Any] | None] = []
    for item in (x.strip() for x in text.split(",")):
        if item == "off":
            out.append(None)
            continue
        parts = item.split(":")
        try:
            spec: dict[str, Any] = {"method": parts[0], "num_speculative_tokens": int(parts[1]),
                                    "acceptance_rate": float(parts[2])}
        except (IndexError, ValueError):
            raise ScenarioError(f"--speculative: {item!r} is not off or METHOD:K:ACCEPTANCE[:DRAFT_MODEL] "
                                "(e.g. eagle:3:0.7)") from None
        if len(parts) > 3:
            spec["draft_model"] = parts[3]
        out.append(spec)
    return out


def parse_split_list(text: str | None) -> list[tuple[int, int] | None]:
    """'off,1:3,2:2' -> [None, (1, 3), (2, 2)]."""
    if text is None:
        return []
    out: list[tuple[int, int] | None] = []
    for item in (x.strip() for x in text.split(",")):
        p, sep, d = item.partition(":")
        if item == "off":
            out.append(None)
        elif sep and p.isdigit() and d.isdigit() and int(p) > 0 and int(d) > 0:
            out.append((int(p), int(d)))
        else:
            raise ScenarioError(f"--disaggregation: {item!r} is not off or P:D (prefill and decode replicas, "
                                "e.g. 1:3)")
    return out
