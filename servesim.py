"""servesim's Python API: what the `servesim` command does, from a notebook or a script.

    import servesim

    result = servesim.run("scenarios/quickstart.yaml", engine__max_num_seqs=64)
    result.summary["ttft_ms"]["p99"]          # summary.json, as a dict
    result.requests, result.steps             # requests.csv and steps.csv, as pandas frames
    result.write("runs/mine")                 # the four files `servesim run` writes

    runs = servesim.run_variants("scenarios/chat-chunked.yaml",
                                 {"64 seqs": ["engine.max_num_seqs=64"], "256 seqs": ["engine.max_num_seqs=256"]})
    servesim.summary_frame(runs)              # one row per run
    servesim.plots.latency_cdfs(list(runs.values()))

    plan = servesim.plan("scenarios/chat-chunked.yaml", slo="ttft_ms=500,tpot_ms=50", target_rate=20)
    plan["recommendation"]                    # what plan.json holds; out="DIR" also writes plan.md

A setting is overridden as on the command line's --set: `engine.max_num_seqs=64` in `overrides`,
or as a keyword with `__` for each dot (engine__max_num_seqs=64); values are checked as the CLI
checks them, and a bad one raises ScenarioError with the same one-line message.

    servesim.kv_budget("llama-3-70b", "h100-sxm", tp=4).max_concurrent_seqs(4096)
    cost = servesim.cost_model("measured", "llama-3-8b", "h100-sxm")
    cost.step_times(servesim.Batch(num_decodes=64, decode_context_sum=64 * 1025))[0]   # s

Besides these functions, namespaces load on first use: `servesim.plots` (the figures, on
matplotlib), `servesim.analysis` (reading runs back, slots, workloads to reuse), `servesim.claims`
(the published-claims audit), `servesim.models` and `servesim.gpus` (the presets by name), and
`servesim.Batch` (one iteration's batch, as a cost model prices it).
"""
from __future__ import annotations

import importlib
import json
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.config.errors import ScenarioError
from sim.version import __version__

if TYPE_CHECKING:
    import pandas as pd

    from sim.reporting.analysis import Run
    from sim.scenario import Scenario

# (and plots, analysis, claims, models, gpus, Batch, model_from_hf_config: loaded by __getattr__ below)
__all__ = ["Result", "ScenarioError", "__version__", "cost_model", "headline", "kv_budget", "load_run",
           "load_scenario", "plan", "read_report", "report", "run", "run_variants", "step_terms", "summary_frame"]

# the namespaces, imported when first named (matplotlib alone takes ~0.3 s)
_NAMESPACES = {"plots": "sim.reporting.plots", "analysis": "sim.reporting.analysis", "claims": "sim.reporting.claims"}
_NAMES = {"models": ("sim.presets.models", "MODEL_PRESETS"), "gpus": ("sim.presets.hardware", "HARDWARE_PRESETS"),
          "Batch": ("sim.cost.batch", "BatchStats"),
          "model_from_hf_config": ("sim.presets.models", "model_from_hf_config")}


def __getattr__(name: str) -> Any:
    if name in _NAMESPACES:
        value = importlib.import_module(_NAMESPACES[name])
    elif name in _NAMES:
        module, attr = _NAMES[name]
        value = getattr(importlib.import_module(module), attr)
    else:
        raise AttributeError(f"module 'servesim' has no attribute {name!r}")
    globals()[name] = value
    return value


def _preset(kind: str, value: Any) -> Any:
    """A model or GPU given by preset name (or already a spec): ScenarioError naming the choices."""
    if not isinstance(value, str):
        return value
    from sim.presets.hardware import HARDWARE_PRESETS
    from sim.presets.models import MODEL_PRESETS

    presets: Mapping[str, Any] = MODEL_PRESETS if kind == "model" else HARDWARE_PRESETS
    if value not in presets:
        raise ScenarioError(f"{kind} {value!r}: not a preset; presets: {', '.join(sorted(presets))}")
    return presets[value]


def _override_lines(overrides: Iterable[str] | Mapping[str, Any], settings: Mapping[str, Any]) -> list[str]:
    """--set lines from `overrides` (lines, or a mapping of dotted keys) and keywords (`__` = `.`).
    A value is written as JSON, which YAML reads back as the same number, string, list or mapping."""
    if isinstance(overrides, str):
        raise ScenarioError(f"overrides: {overrides!r} is one string; give a list of KEY=VALUE lines or a mapping")
    lines = ([f"{k}={json.dumps(v)}" for k, v in overrides.items()] if isinstance(overrides, Mapping)
             else [str(line) for line in overrides])
    return lines + [f"{k.replace('__', '.')}={json.dumps(v)}" for k, v in settings.items()]


def load_scenario(scenario: str | Path | Mapping[str, Any], overrides: Iterable[str] | Mapping[str, Any] = (),
                  *, seed: int | None = None, **settings: Any) -> Scenario:
    """A scenario, checked and resolved: from a YAML file, or from a mapping as the YAML would give
    it (relative paths in it are read from the current folder)."""
    from sim.scenario import load_scenario as from_file
    from sim.scenario import scenario_from_dict

    lines = _override_lines(overrides, settings)
    if isinstance(scenario, Mapping):
        return scenario_from_dict(scenario, overrides=lines, seed=seed)
    return from_file(scenario, overrides=lines, seed=seed)


@dataclass
class Result:
    """One simulated run: `summary` (summary.json as a dict), `requests` and `steps` (requests.csv
    and steps.csv as frames), and the resolved `scenario` it ran."""
    scenario: Scenario
    summary: dict
    requests: pd.DataFrame
    steps: pd.DataFrame

    @property
    def name(self) -> str:
        return self.scenario.name

    def write(self, out_dir: str | Path) -> Path:
        """requests.csv, steps.csv, scenario.yaml and summary.json into `out_dir`, all or none (as
        `servesim run --out` writes them); returns the folder."""
        from sim.config.checks import check_out_dir
        from sim.simulate import SimResult, write_outputs

        out_dir = Path(out_dir)
        check_out_dir(out_dir)
        write_outputs(SimResult(self.requests, self.steps, self.summary, self.scenario), out_dir)
        return out_dir

    def as_run(self, name: str | None = None) -> Run:
        """The run as `servesim.plots` and `servesim.analysis` take it."""
        from sim.reporting.analysis import Run

        return Run(name or self.name, self.requests, self.steps, self.summary)


def run(scenario: str | Path | Mapping[str, Any] | Scenario, overrides: Iterable[str] | Mapping[str, Any] = (),
        *, seed: int | None = None, **settings: Any) -> Result:
    """Simulate a scenario (a YAML path, a mapping, or a loaded Scenario) to completion, as
    `servesim run` does, without writing anything (Result.write does)."""
    from sim.scenario import Scenario
    from sim.simulate import simulate

    if isinstance(scenario, Scenario):
        if overrides or settings or seed is not None:
            raise ScenarioError("run: a loaded Scenario takes no overrides or seed; give them to "
                                "servesim.load_scenario, or pass the YAML path here")
        sc = scenario
    else:
        sc = load_scenario(scenario, overrides, seed=seed, **settings)
    result = simulate(sc)
    return Result(sc, result.summary, result.requests, result.steps)


def run_variants(scenario: str | Path, variants: Mapping[Hashable, Iterable[str]], common: Iterable[str] = (),
                 *, workload: Any = None, workers: int = 1) -> dict[Hashable, Run]:
    """One run per variant: `common` then the variant's own --set lines over the scenario file;
    `workload` (servesim.analysis.scenario_workload, changed) replaces the scenario's requests in
    every variant, so that they all serve the same ones. Returns {label: Run} in the order given;
    workers > 1 runs them in processes."""
    from sim.reporting.analysis import simulate_variants

    return simulate_variants(scenario, variants, common=common, workload=workload, workers=workers)


def summary_frame(runs: Iterable[Run | Result] | Mapping[Any, Run | Result],
                  names: Sequence[str] | None = None) -> pd.DataFrame:
    """Runs side by side: a row per run (latency percentiles, throughput, utilisation), indexed by
    its name, or by the mapping's keys (tuples of keys: a MultiIndex whose levels `names` names)."""
    from sim.reporting.analysis import summary_frame as frame

    def as_run(r: Any, label: Any = None) -> Any:
        return r.as_run(None if label is None else str(label)) if isinstance(r, Result) else r
    if isinstance(runs, Mapping):
        return frame({k: as_run(r, k) for k, r in runs.items()}, names)
    return frame([as_run(r) for r in runs])


def load_run(folder: str | Path, name: str | None = None) -> Run:
    """A folder `servesim run` wrote, read back (ScenarioError, naming the file, if it is not one)."""
    from sim.reporting.analysis import load_run as read

    return read(folder, name)


def plan(scenario: str | Path, *, slo: str | None = None, overrides: Iterable[str] | Mapping[str, Any] = (),
         out: str | Path | None = None, search: Mapping[str, Any] | None = None, **options: Any) -> dict:
    """`servesim plan` (or, given gpus=/tp=/schedulers=..., its configuration search): the result
    plan.json or search.json holds, as a dict. `options` are the command's options by their Python
    names (target_rate=20, max_num_seqs=[64, 128], gpus=["h100-sxm", "h200"], seeds=3, ...); a
    list may also be given as its comma-separated text. With `out`, the report is written there too
    (plan.md, plan.json and the figures, or search.md, search.json and pareto.png). `search` sets
    the load search's own knobs beyond the command's (sim/planning/evaluator.PlanOptions: e.g.
    first_seeds, max_seeds, curve_resolution), over what the options make of them."""
    from dataclasses import fields

    from sim.planning.plan_request import PlanRequest, prepare

    known = {f.name for f in fields(PlanRequest)} - {"scenario", "slo", "out", "overrides", "quiet"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ScenarioError(f"plan: no option {unknown[0]!r}; options: {', '.join(sorted(known))}")
    given: dict[str, Any] = {k: ",".join(map(str, v)) if isinstance(v, (list, tuple)) else v
                             for k, v in options.items()}
    request = PlanRequest(scenario=Path(scenario), slo=slo, out=None if out is None else Path(out),
                          overrides=tuple(_override_lines(overrides, {})), **given)
    job = prepare(request)
    if search:
        from dataclasses import replace

        from sim.planning.evaluator import PlanOptions

        allowed = {f.name for f in fields(PlanOptions)}
        wrong = sorted(set(search) - allowed)
        if wrong:
            raise ScenarioError(f"plan: search has no knob {wrong[0]!r}; knobs: {', '.join(sorted(allowed))}")
        job = replace(job, options=replace(job.options, **search))
    result = job.run(keep=out is not None)  # (with `out`, its journal too: the same call again resumes)
    if out is not None:
        job.write(result)
        job.emit(result)
    return result


def report(folder: str | Path) -> Path:
    """FOLDER/report.html for a run, sweep, plan or search folder, as `servesim report` writes it."""
    from sim.reporting.html_report import write_report

    return write_report(folder)


def read_report(path: str | Path) -> dict:
    """The data a report.html embeds: {"kind": "run", "summary"}, {"kind": "sweep", "keys", "rows"}
    or {"kind": "plan" | "search", "result"}."""
    from sim.reporting.html_report import read_report as read

    return read(path)


def headline(result: dict) -> list[tuple[str, str]]:
    """A plan's answer as the rows `servesim plan` prints (what, answer)."""
    from sim.planning.plan_report import headline as rows

    return rows(result)


def kv_budget(model: Any, gpu: Any, *, tp: int = 1, gpu_memory_utilization: float = 0.9, block_size: int = 16,
              max_num_batched_tokens: int = 8192, kv_cache_dtype: str = "auto", pp: int = 1, dp: int = 1,
              ep: bool = False) -> Any:
    """The KV-cache memory budget of a model (preset name or spec) on a GPU (likewise), as
    `servesim capacity` computes it: .num_gpu_blocks, .max_concurrent_seqs(tokens), ... per GPU;
    with `pp` stages, the busiest stage's GPU; with `dp` ranks of a MoE model and `ep`, the experts
    spread over every rank's GPUs."""
    from sim.presets.memory import hybrid_block_size
    from sim.presets.memory import kv_budget as budget
    from sim.presets.models import pipeline_stage
    from sim.reporting.capacity import check_capacity_options, check_layout

    m, hw = _preset("model", model), _preset("GPU", gpu)
    # the same checks as `servesim capacity` (its option names in the line): never a silent garbage budget
    check_capacity_options(m, tp, gpu_memory_utilization, block_size, max_num_batched_tokens)
    check_layout(m, pp, dp, ep)
    stage = pipeline_stage(m, pp)
    # (a hybrid's block is raised to hold a linear-attention state, as vLLM and a scenario do)
    block_size = hybrid_block_size(stage, hw, tp, kv_cache_dtype, block_size)
    return budget(stage, hw, tensor_parallel_size=tp,
                  gpu_memory_utilization=gpu_memory_utilization, block_size=block_size,
                  max_num_batched_tokens=max_num_batched_tokens, kv_cache_dtype=kv_cache_dtype,
                  enable_expert_parallel=ep, data_parallel_size=dp)


def cost_model(name: Any, model: Any, gpu: Any, tp: int = 1) -> Any:
    """A step-cost model as a scenario's `cost_model:` names it ("measured", "roofline", a
    profile's path or mapping), for a model and a GPU (preset names or specs):
    .step_times(servesim.Batch(...)) gives an iteration's seconds."""
    from sim.cost.registry import make_cost_model
    from sim.reporting.capacity import check_capacity_options

    m = _preset("model", model)
    check_capacity_options(m, tp, None, None, None)  # (a TP that does not divide the heads: as the CLI says)
    return make_cost_model(name, m, _preset("GPU", gpu), tp)


def step_terms(model: Any, gpu: Any, batch: Any, tp: int = 1) -> dict[str, float]:
    """Milliseconds of each part of one iteration of `batch` (servesim.Batch) as the measured
    cost model composes it from the GPU's kernel tables (GEMMs, attention, communication, ...)."""
    from sim.cost.composer import SYSTEMS, TABLES, KernelTables, StepComposer
    from sim.reporting.capacity import check_capacity_options

    hardware, m = _preset("GPU", gpu), _preset("model", model)
    check_capacity_options(m, tp, None, None, None)  # the CLI's --tp check, its line
    if hardware.name not in SYSTEMS:
        raise ScenarioError(f"GPU {hardware.name!r}: no kernel tables; tables for: {', '.join(sorted(SYSTEMS))}")
    tables = KernelTables.load(TABLES / SYSTEMS[hardware.name], hardware.hbm_bandwidth)
    return StepComposer(tables, m, tp).terms(batch)
