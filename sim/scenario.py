"""Scenario YAML -> validated, frozen dataclasses with presets resolved.

    load_scenario(path, overrides=(), seed=None) -> Scenario
    scenario_from_dict(raw, source=None, base_dir=".", overrides=(), seed=None) -> Scenario

`overrides` are "dotted.key=value" strings (CLI --set), each value parsed as YAML, applied to the
raw mapping before validation. Bad input raises ScenarioError: one line naming the file (or the
--set), the key path and what is allowed. Relative paths resolve against the YAML file's folder.
A model that does not fit in GPU memory is reported here, as a config error. The workload section
and cost-model specs are validated by sim/workload/generators.py and sim/cost/registry.py; the rest is checked here.
`dataclasses.replace` on a Scenario skips validation: to vary a scenario safely, call
scenario_from_dict again with overrides.
"""
from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from sim.config.admission import AdmissionConfig, parse_admission
from sim.config.autoscaling import AutoscalingConfig, parse_autoscaling
from sim.config.checks import (
    MAX_REPLICAS,
    MAX_SECONDS,
    Where,
    _bool,
    _check_keys,
    _choice,
    _existing_path,
    _int,
    _num,
    _or,
    _section,
    _show,
    load_yaml,
    parsed_once,
    parsed_text,
    read_text,
)
from sim.config.disaggregation import DisaggregationConfig, parse_disaggregation
from sim.config.errors import ScenarioError, held_warnings
from sim.config.knobs import ENGINE_KNOBS, MAX_BLOCK_SIZE, MAX_HYBRID_BLOCK_SIZE, Knob, power_of_two_block
from sim.config.lora import LoRAConfig, parse_lora
from sim.config.routing import RoutingConfig, parse_routing
from sim.config.speculative import SpeculativeConfig, parse_speculative
from sim.cost import registry as cost
from sim.cost.registry import CostModelSpec
from sim.features import registry as features
from sim.presets import hardware, memory, models
from sim.presets import names as preset_names
from sim.presets.hardware import HardwareSpec
from sim.presets.memory import MemoryBudget
from sim.presets.models import ModelSpec
from sim.runtime.routers import ROUTERS
from sim.schedulers import SCHEDULERS
from sim.schedulers.queues import POLICIES
from sim.workload import generators as workload
from sim.workload.generators import WorkloadConfig


@dataclass(frozen=True)
class EngineConfig:
    scheduler: str = "continuous"          # a key of sim.schedulers.SCHEDULERS
    max_num_seqs: int = 256                # static: the batch size
    max_num_batched_tokens: int = 8192     # token budget per iteration (continuous, chunked)
    block_size: int = 16                   # tokens per KV block
    gpu_memory_utilization: float = 0.9    # fraction of GPU memory the engine may use
    num_gpu_blocks: int | None = None      # override of the derived KV capacity
    tensor_parallel_size: int = 1
    # vLLM's --pipeline-parallel-size: the layers split into this many stages, each on its own
    # tensor_parallel_size GPUs (sim/cost/pipeline.py prices the pipeline)
    pipeline_parallel_size: int = 1
    # vLLM's --data-parallel-size for a MoE model with enable_expert_parallel: each replica is this
    # many engines (DP ranks, each its own attention, KV cache and scheduler on tensor_parallel_size
    # GPUs) sharing one expert-parallel group of all their GPUs (sim/cost/expert_parallel.py)
    data_parallel_size: int = 1
    # vLLM's --all2all-backend: how those ranks exchange tokens with the experts (sim/cost/expert_parallel.py)
    all2all_backend: str = "allgather_reducescatter"
    replicas: int = 1
    router: str = "round_robin"            # a key of sim.runtime.routers.ROUTERS
    policy: str = "fcfs"                   # a key of sim.schedulers.queues.POLICIES
    batch_timeout_s: float = 0.0           # static only: how long a partial batch waits
    kv_cache_dtype: str = "auto"           # vLLM's --kv-cache-dtype: auto (the model's) | fp8
    enable_expert_parallel: bool = False   # MoE: experts placed whole on GPUs instead of split
    # vLLM's automatic prefix caching: None = the scheduler's default (on where it exists, as in
    # vLLM V1); acts on workloads that say what prompts share (sim/kv/prefix_cache.py)
    enable_prefix_caching: bool | None = None
    # vLLM's KV offloading to CPU memory (--kv-offloading-size, GiB over all TP ranks together;
    # sim/features/kv_offloading/): None = off. Only the "native" backend (vLLM's OffloadingConnector).
    kv_offloading_size: float | None = None
    kv_offloading_backend: str = "native"
    # vLLM's scheduler_reserve_full_isl (on by default in vLLM 0.32): a waiting or preempted request
    # joins only if its whole sequence (prompt + tokens generated so far) fits in the free KV blocks,
    # not just its first chunk; off: the first chunk's blocks suffice (older vLLM V1)
    scheduler_reserve_full_isl: bool = True
    # vLLM's --enforce-eager: no CUDA graphs, every kernel launched from the host (sim/cost/eager.py)
    enforce_eager: bool = False
    # vLLM's --max-cudagraph-capture-size: the largest iteration (tokens) run from a CUDA graph; a
    # larger one runs without (sim/cost/eager.py). None: vLLM's default (eager.capture_limit)
    max_cudagraph_capture_size: int | None = None
    # speculative decoding (sim/config/speculative.py): None = off
    speculative: SpeculativeConfig | None = None
    # disaggregated prefill/decode pools (sim/config/disaggregation.py): None = every replica does both
    disaggregation: DisaggregationConfig | None = None
    # replicas added and removed during the run (sim/config/autoscaling.py): None = `replicas`, fixed
    autoscaling: AutoscalingConfig | None = None
    # a token bucket in front of the router (sim/config/admission.py): None = every request admitted
    admission: AdmissionConfig | None = None
    # multi-LoRA serving (sim/config/lora.py; vLLM's --enable-lora): None = the base model only
    lora: LoRAConfig | None = None
    # what the router sees (stale load signals) and how `weighted` weighs it (sim/config/routing.py):
    # None = exact signals, the default weights
    routing: RoutingConfig | None = None

    @property
    def gpus_per_replica(self) -> int:
        """GPUs one replica holds: tensor_parallel_size x pipeline_parallel_size x data_parallel_size."""
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size


# vLLM's --kv-offloading-backend values; only native is modelled (the other is refused by name)
OFFLOADING_BACKENDS = ("native", "lmcache")
# vLLM's --all2all-backend values modelled (sim/cost/expert_parallel.py): its default, and DeepEP's two
ALL2ALL_BACKENDS = ("allgather_reducescatter", "deepep_high_throughput", "deepep_low_latency")

SLO_METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")  # vLLM's metric names, milliseconds


@dataclass(frozen=True)
class SLOConfig:
    """Latency targets in ms, each judged at a percentile: its own (`percentiles`) or `percentile`.
    ttft/tpot/e2el are per request; itl is every gap between two streamed tokens."""
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    itl_ms: float | None = None
    e2el_ms: float | None = None
    percentile: float = 99.0                          # of a target that names none
    percentiles: tuple[tuple[str, float], ...] = ()   # per-target, e.g. (("itl_ms", 95.0),)
    # a workload class's own SLO (slo.classes.<name>: TTFT, TPOT, E2EL), for its requests instead of
    # this one's per-request targets; the others' requests are held to this one
    classes: tuple[tuple[str, SLOConfig], ...] = ()

    def pct(self, key: str) -> float:
        return dict(self.percentiles).get(key, self.percentile)

    def targets(self) -> dict[str, tuple[float, float]]:
        """{"ttft_ms": (500.0, 99.0), ...}: every target set, with its percentile, in SLO_METRICS order."""
        return {k: (getattr(self, k), self.pct(k)) for k in SLO_METRICS if getattr(self, k) is not None}

    def label(self) -> str:
        """'p99 TTFT <= 500 ms, p95 ITL <= 100 ms' (and '; batch: p99 E2EL <= 600000 ms' per class)"""
        text = ", ".join(f"p{p:g} {k[:-3].upper()} <= {t:g} ms" for k, (t, p) in self.targets().items())
        return "; ".join([text] + [f"{name}: {c.label()}" for name, c in self.classes])

    def for_class(self, name: str) -> SLOConfig:
        """The per-request targets a class's requests are held to: its own, else this SLO's (without
        ITL, which is judged over every token stream at once, not per class)."""
        own = dict(self.classes).get(name)
        if own is not None:
            return own
        return dataclasses.replace(self, itl_ms=None, classes=(),
                                   percentiles=tuple((k, p) for k, p in self.percentiles if k != "itl_ms"))

    def as_yaml(self) -> dict:
        """The SLO as a scenario writes it: a target with its own percentile as "100@p95"."""
        own = dict(self.percentiles)
        out: dict[str, Any] = {k: (f"{t:g}@p{own[k]:g}" if k in own else t) for k, (t, _) in self.targets().items()}
        out["percentile"] = self.percentile
        if self.classes:
            out["classes"] = {name: c.as_yaml() for name, c in self.classes}
        return out


@dataclass(frozen=True)
class Scenario:
    name: str
    seed: int
    model: ModelSpec
    hardware: HardwareSpec
    cost_model: CostModelSpec  # validated; a profile already read
    engine: EngineConfig
    workload: WorkloadConfig   # sim/workload/generators.py owns its shape
    slo: SLOConfig | None
    source: Path | None = None  # the YAML file, for error messages
    base_dir: Path = Path(".")  # relative paths (traces, profiles, hf_config) resolve against it
    overrides: tuple[str, ...] = ()  # the --set KEY=VALUE strings applied, in order
    raw: Mapping[str, Any] | None = None  # the mapping as written, overrides applied
    # each registered feature's config from its own section (sim/features/registry.py: energy, faults, ...)
    features: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @cached_property
    def slips(self) -> tuple[str, ...]:
        """Likely unit slips, each one line with the value probably meant (the run goes on as
        written: `run` and `plan` print them as warnings): an SLO target under 1 ms (seconds
        written as ms), an arrival rate no GPU fleet of this size serves."""
        out = []
        if self.slo is not None:
            for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
                v = getattr(self.slo, key)
                if v is not None and v < 1.0:
                    out.append(f"slo.{key}: {v:g} ms is under a millisecond; if seconds were meant, write "
                               f"{v * 1e3:g}")
        rate = getattr(self.workload.arrival, "rate", None)
        gpus = self.engine.replicas * self.engine.gpus_per_replica
        if isinstance(rate, (int, float)) and rate > 1e4 * gpus:
            out.append(f"workload.arrival.rate: {rate:g} requests/s is over 10,000 per GPU ({gpus} here); "
                       f"if a per-minute or per-hour figure was meant, divide it by 60 or 3,600")
        return tuple(out)

    @cached_property
    def stage_model(self) -> ModelSpec:
        """What one GPU group of a replica runs: the model, or its busiest pipeline stage
        (engine.pipeline_parallel_size > 1; sim/presets/models.pipeline_stage)."""
        return models.pipeline_stage(self.model, self.engine.pipeline_parallel_size)

    @cached_property
    def budget(self) -> MemoryBudget:
        """One replica's GPU memory split and KV blocks per GPU (computed once per Scenario object,
        so a dataclasses.replace of the engine gets its own)."""
        e = self.engine
        return memory.kv_budget(self.stage_model, self.hardware, tensor_parallel_size=e.tensor_parallel_size,
                                gpu_memory_utilization=e.gpu_memory_utilization,
                                block_size=e.block_size,
                                max_num_batched_tokens=e.max_num_batched_tokens,
                                num_gpu_blocks=e.num_gpu_blocks,
                                where=f"{self.source}: engine" if self.source else "engine",
                                kv_cache_dtype=e.kv_cache_dtype,
                                enable_expert_parallel=e.enable_expert_parallel,
                                data_parallel_size=e.data_parallel_size,
                                reserved_bytes=memory.lora_slot_bytes(self.model, e.lora, e.tensor_parallel_size))


TOP_KEYS = ("name", "seed", "model", "hardware", "cost_model", "engine", "workload", "slo",
            *features.top_level_keys())
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # the name becomes the folder runs/<name>



def load_scenario(path: str | Path, overrides: Iterable[str] = (), seed: int | None = None) -> Scenario:
    path = Path(path)
    return scenario_from_dict(_read_yaml(path), source=path, base_dir=path.absolute().parent,
                              overrides=overrides, seed=seed)


def scenario_from_dict(raw: Mapping[str, Any], source: str | Path | None = None,
                       base_dir: str | Path = ".", overrides: Iterable[str] = (),
                       seed: int | None = None) -> Scenario:
    """Validate a scenario mapping (as YAML would give it); `raw` itself is not modified. Warnings
    about it are shown once it is valid (a bad one is its one error line)."""
    with held_warnings():
        return _scenario_from_dict(raw, source, base_dir, overrides, seed)


def _scenario_from_dict(raw: Mapping[str, Any], source: str | Path | None, base_dir: str | Path,
                        overrides: Iterable[str], seed: int | None) -> Scenario:
    label = str(source) if source is not None else "scenario"
    if not isinstance(raw, Mapping):
        raise ScenarioError(f"{label}: top level is {_show(raw)}; expected a mapping with keys "
                            + ", ".join(TOP_KEYS))
    mapping: dict = copy.deepcopy(dict(raw))
    overridden = _apply_overrides(mapping, overrides)
    w = _where_fn(label, overridden)
    base_dir = Path(base_dir)
    raw = mapping
    _check_keys(mapping, "", w, TOP_KEYS)
    for key in ("model", "hardware", "workload"):
        if raw.get(key) is None:
            raise ScenarioError(f"{w(key)}: missing; required: {_HINTS[key]()}")
    name = _or(raw.get("name"), Path(label).stem if source is not None else "scenario")
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ScenarioError(f"{w('name')}: {_show(name)} is not a name of letters, digits, "
                            "'.', '_', '-' (it names the default output folder runs/<name>)")
    seed = _int(_or(raw.get("seed"), 0), w("seed"), lo=0) if seed is None else _int(seed, "--seed", lo=0)

    model = _parse_model(raw["model"], w, base_dir)
    hw = _parse_hardware(raw["hardware"], w)
    engine = _parse_engine(raw.get("engine"), w)
    engine = _check_window(engine, model, w)
    engine = _check_hybrid(engine, model, hw, w)
    stage = _check_pipeline(engine, model, w)  # (the model itself without pipeline parallelism)
    _check_data_parallel(engine, model, w)
    _check_network(engine, hw, w)
    budget = _check_fits(engine, stage, hw, w)
    if engine.disaggregation is not None:  # each pool's TP and memory must fit too
        for name in ("prefill", "decode"):
            def pool_where(k: str, name: str = name) -> str:
                return w(k.replace("engine.", f"engine.disaggregation.{name}.", 1))
            _check_fits(getattr(engine.disaggregation, name), model,
                        getattr(engine.disaggregation, f"{name}_hardware") or hw, pool_where)
    cost_model = _delegate(overridden, "cost_model", lambda: _parse_cost_model(
        raw.get("cost_model"), w, base_dir, stage, hw, engine))
    sections = features.parse_sections(raw, engine, w)
    for said in features.notices(sections) if cost_model.name != "unit" else ():  # a stated model: say so
        cost_model = _say(cost_model, said)
    if stage.linear_attention is not None and cost_model.name != "unit":  # say what priced those layers
        from sim.cost import linear_attention  # (the cost layer's: its kernels' source)
        kernels, why = linear_attention.kernels_for(stage, hw, engine.tensor_parallel_size)
        said = linear_attention.describe(kernels, stage.linear_attention.layers) + (f" ({why})" if why else "")
        said += ("; prefix caching off (the state modelled as vLLM's mamba_cache_mode none; recent vLLM "
                 "caches hybrids' prefixes in its align mode, not modelled: compare with vllm serve "
                 "--no-enable-prefix-caching)")
        cost_model = _say(cost_model, said)
    work = _delegate(overridden, "workload", lambda: workload.parse_workload(
        raw["workload"], label, base_dir))  # its messages read "<label>: workload.<key>: ..."
    slo = _parse_slo(raw.get("slo"), w)
    if work.adapters is not None and engine.lora is None:
        raise ScenarioError(f"{w('workload.adapters')}: the requests name LoRA adapters but the engine serves "
                            "none; set engine.lora (e.g. {max_loras: 4, max_lora_rank: 16})")
    names = [c.name for c in work.classes or ()]
    for path, named in (("slo.classes", slo.classes if slo is not None else ()),
                        ("engine.admission.classes", engine.admission.classes if engine.admission else ())):
        for cls, _ in named:  # every class SLO and class bucket names a class of the workload
            if cls not in names:
                raise ScenarioError(f"{w(f'{path}.{cls}')}: no workload class {cls!r} "
                                    + (f"(workload.classes: {', '.join(names)})" if names else
                                       "(the workload has no classes: workload.classes)"))
    scenario = Scenario(name=name, seed=seed, model=model, hardware=hw, cost_model=cost_model,
                        engine=engine, workload=work, slo=slo,
                        source=Path(source) if source is not None else None, base_dir=base_dir,
                        overrides=tuple(overrides), raw=raw, features=sections)
    scenario.__dict__["budget"] = budget  # resolved once: what cached_property would compute
    scenario.__dict__["stage_model"] = stage
    features.check_rules(scenario, w)
    return scenario


def _say(spec: CostModelSpec, said: str) -> CostModelSpec:
    """`spec` with `said` added to its notice (what a run prints once about its step costs)."""
    return dataclasses.replace(spec, notice=f"{spec.notice}; {said}" if spec.notice else said)


def resolved_mapping(scenario: Scenario) -> dict:
    """The scenario as a self-contained mapping: presets expanded into their fields, the effective
    seed, overrides applied and every file path absolute, so that scenario_from_dict of it (from
    any folder) simulates the same run."""
    e = scenario.engine
    engine = {f.name: getattr(e, f.name) for f in fields(EngineConfig)
              if getattr(e, f.name) is not None}
    if e.speculative is not None:
        engine["speculative"] = e.speculative.as_yaml()
    if e.disaggregation is not None:
        engine["disaggregation"] = e.disaggregation.as_yaml()
    if e.autoscaling is not None:
        engine["autoscaling"] = e.autoscaling.as_yaml()
    if e.admission is not None:
        engine["admission"] = e.admission.as_yaml()
    if e.lora is not None:
        engine["lora"] = e.lora.as_yaml()
    if e.routing is not None:
        engine["routing"] = e.routing.as_yaml(e.router)
    out = {"name": scenario.name, "seed": scenario.seed,
           "model": {k: v for k, v in dataclasses.asdict(scenario.model).items() if v is not None},
           "hardware": {f.name: getattr(scenario.hardware, f.name) for f in fields(HardwareSpec)},
           "cost_model": scenario.cost_model.as_yaml(), "engine": engine,
           "workload": _absolute_paths(copy.deepcopy((scenario.raw or {}).get("workload")),
                                       scenario.base_dir)}
    if scenario.slo is not None:
        out["slo"] = scenario.slo.as_yaml()
    for key, feature in features.FEATURES.items():
        section = feature.as_yaml(scenario.features.get(key))
        if section is not None:
            out[key] = section
    return out


def resolved_yaml(scenario: Scenario) -> str:
    def shown(text: object) -> str:  # one comment line: a newline or control byte in a path or
        # --set text would otherwise end the comment and break the file it describes
        return "".join(c if ord(c) >= 32 and ord(c) != 127 else repr(c)[1:-1] for c in str(text))
    where = f" from {shown(scenario.source)}" if scenario.source else ""
    sets = "".join(f" --set {shown(o)}" for o in scenario.overrides)
    header = (f"# The resolved scenario of this run{where}{sets}, seed {scenario.seed}.\n"
              "# Presets are expanded and paths absolute: `servesim run scenario.yaml` repeats "
              "the run.\n")
    return header + yaml.safe_dump(_plain(resolved_mapping(scenario)), sort_keys=False)


def _absolute_paths(section: Any, base_dir: Path) -> Any:
    """The workload section with its file paths (trace, an empirical dist's trace, a rate profile's
    CSV) made absolute: a run's scenario.yaml reads the same files from anywhere."""
    if isinstance(section, dict):
        for key, value in section.items():
            if (key == "trace" or (key == "rates" and section.get("process") == "profile")) \
                    and isinstance(value, str) and value:
                section[key] = str((base_dir / Path(value).expanduser()).resolve())
            else:
                _absolute_paths(value, base_dir)
    return section


def _plain(value: Any) -> Any:
    """Only YAML's own types (numbers as int/float, paths as strings), for safe_dump."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalars
        return value.item()
    return value


# ---------------------------------------------------------------- YAML and --set

def _read_yaml(path: Path) -> Any:
    """The scenario file, read safely (sim/config/checks.py: a regular file of at most 10 MiB, UTF-8, no
    YAML aliases, duplicate keys or deep nesting), once while it is unchanged (parsed_once)."""
    raw = parsed_once(path, _parse_scenario_file)
    if raw is None:
        raise ScenarioError(f"{path}: empty file; expected a mapping with keys " + ", ".join(TOP_KEYS))
    return raw


def _parse_scenario_file(path: Path) -> Any:
    return load_yaml(read_text(path, "scenario"), str(path))


def _apply_overrides(raw: dict, overrides: Iterable[str]) -> dict[str, str]:
    """Set each "a.b.c=value" in `raw`, creating missing mappings. Returns {key path: value text}."""
    done: dict[str, str] = {}
    for item in overrides:
        key, sep, text = item.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(parts):
            raise ScenarioError(f"--set {item}: expected KEY=VALUE with a dotted key, "
                                "e.g. --set engine.max_num_seqs=128")
        try:
            value = parsed_text(text, f"--set {key}") if text.strip() else None
        except ScenarioError as e:
            raise ScenarioError(f"--set {key}: {_show(text)} is not a YAML value ({e})") from None
        node = raw
        for i, part in enumerate(parts[:-1]):
            if node.get(part) is None:
                node[part] = {}
            node = node[part]
            if not isinstance(node, dict):
                raise ScenarioError(f"--set {key}: {'.'.join(parts[:i + 1])} is {_show(node)}, "
                                    f"not a mapping, so it has no key {parts[i + 1]!r}")
        node[parts[-1]] = value
        done[".".join(parts)] = text
    return done


def _where_fn(label: str, overridden: Mapping[str, str]) -> Where:
    def where(path: str) -> str:
        # A --set wrote this key, a mapping around it, or a key inside it.
        if any(path == k or path.startswith(k + ".") or k.startswith(path + ".") for k in overridden):
            return f"--set {path}"
        return f"{label}: {path}"
    return where


def _delegate(overridden: Mapping[str, str], section: str, parse: Callable[[], Any]) -> Any:
    """Run a section parser owned by another module; if a --set touched the section, say so."""
    try:
        return parse()
    except ScenarioError as e:
        sets = [f"--set {k}={v}" for k, v in overridden.items() if k.split(".")[0] == section]
        if not sets or "--set" in str(e):
            raise
        raise ScenarioError(f"{e} (after {', '.join(sets)})") from None


# ---------------------------------------------------------------- sections

_HINTS = {
    "model": lambda: "a preset name (" + ", ".join(sorted(models.MODEL_PRESETS))
                     + "), {hf_config: path/to/config.json} or a mapping of ModelSpec fields",
    "hardware": lambda: "a preset name (" + ", ".join(sorted(hardware.HARDWARE_PRESETS))
                        + ") or a mapping of HardwareSpec fields",
    "workload": lambda: "a mapping with a trace, or an arrival process and length distributions",
}


def _parse_model(v: Any, w: Where, base_dir: Path) -> ModelSpec:
    if isinstance(v, str):  # a preset, an alias or a checkpoint's repository id (sim/presets/names.py)
        return models.MODEL_PRESETS[preset_names.model_preset(v, models.MODEL_PRESETS, w("model"))]
    if not isinstance(v, dict):
        raise ScenarioError(f"{w('model')}: {_show(v)} is not {_HINTS['model']()}")
    if "hf_config" not in v:
        return models.model_from_fields(v, w("model"))
    _check_keys(v, "model", w, ("hf_config", "name"))
    path = _existing_path(v["hf_config"], "model.hf_config", w, base_dir,
                          "a path to a HF config.json (or its folder)")
    name = v.get("name")
    if name is not None and not (isinstance(name, str) and name):
        raise ScenarioError(f"{w('model.name')}: {_show(name)} is not a non-empty string")
    try:
        return models.model_from_hf_config(path, name=name)
    except ScenarioError as e:  # its messages start with the config.json path
        raise ScenarioError(f"{w('model.hf_config')}: {e}") from None


def _parse_hardware(v: Any, w: Where) -> HardwareSpec:
    if isinstance(v, str):
        return hardware.HARDWARE_PRESETS[preset_names.hardware_preset(v, hardware.HARDWARE_PRESETS, w("hardware"))]
    if not isinstance(v, dict):
        raise ScenarioError(f"{w('hardware')}: {_show(v)} is not {_HINTS['hardware']()}")
    return hardware.hardware_from_fields(v, w("hardware"))


def _parse_engine(v: Any, w: Where) -> EngineConfig:
    m = _section(v, "engine", w, tuple(f.name for f in fields(EngineConfig)))
    engine = _engine_fields(m, w)
    if engine.autoscaling is not None and m.get("replicas") is None:  # the fleet starts at its floor (at time 0)
        engine = dataclasses.replace(engine, replicas=engine.autoscaling.floor(0.0))
    _check_engine(engine, lambda key: w("engine." + key))
    return engine


# the names a "choice" knob takes (sim/config/knobs.py), by the registry it names; read at each
# parse, so a plug-in registered later is accepted
CHOICES: dict[str, Callable[[], Iterable[str]]] = {
    "schedulers": lambda: SCHEDULERS, "routers": lambda: ROUTERS, "policies": lambda: POLICIES,
    "kv_cache_dtypes": lambda: memory.KV_CACHE_DTYPES, "all2all_backends": lambda: ALL2ALL_BACKENDS,
    "offloading_backends": lambda: OFFLOADING_BACKENDS}


def _knob(k: Knob, m: dict, where: str) -> Any:
    """One scalar knob's value from the engine mapping `m`, checked as its row of the table says."""
    raw = m.get(k.name)
    if k.optional and raw is None:
        return None
    v = _or(raw, getattr(EngineConfig, k.name))
    if k.kind == "int":
        value: Any = _int(v, where, lo=int(k.lo), hi=None if k.hi is None else int(k.hi),
                          cap=None if k.cap is None else int(k.cap))
    elif k.kind == "number":
        value = _num(v, where, k.lo, k.hi, open_lo=k.open_lo, cap=k.cap)
    elif k.kind == "bool":
        value = _bool(v, where)
    else:
        value = _choice(v, where, CHOICES[k.choices]())
    if k.rule is not None and not k.rule(value):
        raise ScenarioError(f"{where}: {value} {k.rule_says}")
    return value


def _engine_fields(m: dict, w: Where) -> EngineConfig:
    """The engine section's keys, each read and range-checked (no check across keys yet): the
    scalar knobs by their table (sim/config/knobs.py), in its order, then the sections."""
    get = lambda key: _or(m.get(key), getattr(EngineConfig, key))
    at = lambda key: w("engine." + key)
    knobs = {k.name: _knob(k, m, at(k.name)) for k in ENGINE_KNOBS}
    return EngineConfig(
        **knobs,
        speculative=parse_speculative(m.get("speculative"), at("speculative"), models.MODEL_PRESETS),
        disaggregation=parse_disaggregation(m.get("disaggregation"), w, dict(m), _parse_engine,
                                            hardware.HARDWARE_PRESETS),
        autoscaling=parse_autoscaling(m.get("autoscaling"), at, None if m.get("replicas") is None else get("replicas")),
        admission=parse_admission(m.get("admission"), at),
        lora=parse_lora(m.get("lora"), at),
        routing=parse_routing(m.get("routing"), at, str(get("router"))),
    )


def _check_engine(engine: EngineConfig, at: Callable[[str], str]) -> None:
    """The combinations of engine keys that are not modelled, or that vLLM refuses."""
    if engine.kv_offloading_backend != "native":  # (offloading itself: sim/features/kv_offloading/)
        if engine.kv_offloading_size is None:
            raise ScenarioError(f"{at('kv_offloading_backend')}: {engine.kv_offloading_backend!r} without "
                                "engine.kv_offloading_size (GiB of CPU memory), which turns offloading on")
        raise ScenarioError(f"{at('kv_offloading_backend')}: {engine.kv_offloading_backend!r} is not modelled; "
                            "only 'native' (vLLM's OffloadingConnector) is")
    if engine.enforce_eager and engine.max_cudagraph_capture_size is not None:
        raise ScenarioError(f"{at('max_cudagraph_capture_size')}: {engine.max_cudagraph_capture_size} with "
                            "engine.enforce_eager, which captures no CUDA graph: leave one of them out")
    if engine.autoscaling is not None and engine.disaggregation is not None:
        raise ScenarioError(f"{at('autoscaling')}: autoscaling disaggregated pools is not modelled")
    d = engine.disaggregation
    if d is not None:
        if engine.replicas != 1:
            raise ScenarioError(f"{at('replicas')}: {engine.replicas} with engine.disaggregation, whose pools "
                                "are sized by prefill_replicas and decode_replicas; leave replicas at 1")
        if engine.speculative is not None:
            raise ScenarioError(f"{at('speculative')}: speculative decoding with disaggregated pools is not "
                                "modelled")
        if engine.admission is not None and engine.admission.max_in_flight is not None:
            raise ScenarioError(f"{at('admission.max_in_flight')}: a concurrency limit in front of disaggregated "
                                "pools is not modelled")
        if engine.routing is not None and engine.routing.staleness_s > 0:
            raise ScenarioError(f"{at('routing.staleness_s')}: stale routing signals with disaggregated pools "
                                "are not modelled (0: exact)")
        for name, pool in (("prefill", d.prefill), ("decode", d.decode)):
            if not SCHEDULERS[pool.scheduler].iteration_level:
                raise ScenarioError(f"{at('disaggregation.' + name + '.scheduler')}: {pool.scheduler} cannot "
                                    "serve a disaggregated pool (it is: "
                                    f"{', '.join(n for n, c in SCHEDULERS.items() if c.iteration_level)})")
    if engine.speculative and not SCHEDULERS[engine.scheduler].iteration_level:
        raise ScenarioError(f"{at('speculative')}: the {engine.scheduler} scheduler has no speculative "
                            f"decoding (it is: {', '.join(n for n, c in SCHEDULERS.items() if c.iteration_level)})")
    if engine.enable_prefix_caching and not SCHEDULERS[engine.scheduler].prefix_caching:
        caching = ", ".join(n for n, c in SCHEDULERS.items() if c.prefix_caching)
        raise ScenarioError(f"{at('enable_prefix_caching')}: the {engine.scheduler} scheduler has no "
                            f"prefix caching (it is: {caching})")
    if SCHEDULERS[engine.scheduler].token_budget and engine.max_num_batched_tokens < engine.max_num_seqs:
        # vLLM's rule: every running sequence must be able to decode one token per iteration.
        rule = f"the {engine.scheduler} scheduler needs max_num_batched_tokens >= max_num_seqs"
        if at("max_num_seqs").startswith("--set"):
            raise ScenarioError(f"{at('max_num_seqs')}: {engine.max_num_seqs} is more than "
                                f"max_num_batched_tokens ({engine.max_num_batched_tokens}); {rule}")
        raise ScenarioError(f"{at('max_num_batched_tokens')}: {engine.max_num_batched_tokens} is "
                            f"less than max_num_seqs ({engine.max_num_seqs}); {rule}")


def _check_window(engine: EngineConfig, model: ModelSpec, w: Where) -> EngineConfig:
    """A sliding-window model's KV cache (sim/kv/cache.WindowedKVCache) runs without prefix
    caching, speculative decoding and disaggregation, which are not modelled over it: caching left
    at its default is off (said in docs/simulator.md), asked for it is an error."""
    if not model.sliding_layers:
        return engine
    why = f"with {model.name}'s sliding-window layers"
    if engine.enable_prefix_caching:
        raise ScenarioError(f"{w('engine.enable_prefix_caching')}: prefix caching {why} is not modelled; "
                            f"set it to false (or leave it out: off for such models)")
    for key in ("speculative", "disaggregation"):
        if getattr(engine, key) is not None:
            raise ScenarioError(f"{w('engine.' + key)}: {key} {why} is not modelled")
    return dataclasses.replace(engine, enable_prefix_caching=False)


def _check_hybrid(engine: EngineConfig, model: ModelSpec, hw: HardwareSpec, w: Where) -> EngineConfig:
    """A hybrid model's linear-attention state (sim/kv/cache.StateKVCache) is modelled as vLLM keeps
    it without prefix caching (mamba_cache_mode none), on an iteration-level engine that does both
    phases (pipeline stages and data-parallel ranks included): caching left at its default is off
    (said in the run's notice and docs/simulator.md), asked for it is an error. The attention block
    grows to hold one layer's state, as vLLM sets it (memory.hybrid_block_size)."""
    if model.linear_attention is None:
        if not power_of_two_block(engine.block_size):  # (multiples of 16 are a hybrid's: vLLM sets them)
            raise ScenarioError(f"{w('engine.block_size')}: {engine.block_size} is not a power of two "
                                f"in [1, {MAX_BLOCK_SIZE}] (vLLM uses 16)")
        return engine
    why = f"with {model.name}'s linear-attention layers"
    if engine.enable_prefix_caching:
        raise ScenarioError(f"{w('engine.enable_prefix_caching')}: prefix caching {why} is not modelled "
                            f"(vLLM's mamba_cache_mode align); set it to false (or leave it out: off for such models)")
    _refuse_beside(engine, w("model"), f"{model.name} (linear attention)",
                   ("speculative", "disaggregation", "kv_offloading_size", "lora"), stages=False)
    if model.kv_layout.full_groups != 1:
        raise ScenarioError(f"{w('model')}: {model.attention_layers} attention layers beside "
                            f"{model.linear_attention.layers} linear ones make {model.kv_layout.full_groups} "
                            f"attention groups; servesim models hybrids with one")
    block = memory.hybrid_block_size(model, hw, engine.tensor_parallel_size, engine.kv_cache_dtype,
                                     engine.block_size)
    if block > MAX_HYBRID_BLOCK_SIZE:
        raise ScenarioError(f"{w('model')}: {model.name}'s linear-attention state needs attention blocks of "
                            f"{block:,} tokens to hold it (vLLM's rule); servesim takes at most "
                            f"{MAX_HYBRID_BLOCK_SIZE:,}")
    return dataclasses.replace(engine, enable_prefix_caching=False, block_size=block)


def _check_pipeline(engine: EngineConfig, model: ModelSpec, w: Where) -> ModelSpec:
    """Pipeline parallelism (sim/cost/pipeline.py) is modelled for an iteration-level engine that
    does both phases, on a full-attention model; returns what one stage runs (its busiest)."""
    pp = engine.pipeline_parallel_size
    if pp == 1:
        return model
    at = w("engine.pipeline_parallel_size")
    if pp > model.num_layers:
        raise ScenarioError(f"{at}: {pp} stages for {model.name}'s {model.num_layers} layers; at most "
                            f"{model.num_layers}")
    if model.sliding_layers:
        raise ScenarioError(f"{at}: pipeline parallelism with {model.name}'s sliding-window layers is not modelled")
    _refuse_beside(engine, at, "pipeline parallelism", ("speculative", "disaggregation"), stages=False)
    return models.pipeline_stage(model, pp)


def _check_data_parallel(engine: EngineConfig, model: ModelSpec, w: Where) -> None:
    """Data parallelism is modelled where vLLM uses it for serving: DP attention in front of one
    expert-parallel group of a MoE model (sim/cost/expert_parallel.py), on iteration-level engines."""
    d = engine.data_parallel_size
    if engine.enable_expert_parallel and model.moe is None:
        raise ScenarioError(f"{w('engine.enable_expert_parallel')}: {model.name} is not a mixture of experts; "
                            "expert parallelism has no experts to place (vLLM ignores it on a dense model): "
                            "leave it off")
    if d == 1:
        if engine.all2all_backend != EngineConfig.all2all_backend:
            raise ScenarioError(f"{w('engine.all2all_backend')}: {engine.all2all_backend!r} is used by expert "
                                "parallelism across data-parallel ranks (engine.data_parallel_size > 1)")
        return
    at = w("engine.data_parallel_size")
    engines = d * (engine.autoscaling.max_replicas if engine.autoscaling else engine.replicas)
    if engines > MAX_REPLICAS:
        raise ScenarioError(f"{at}: {d} ranks x {engine.replicas} replicas = {engines:,} engines, more than "
                            f"servesim simulates ({MAX_REPLICAS:,})")
    if model.moe is None:
        raise ScenarioError(f"{at}: {model.name} is not a mixture of experts; data-parallel ranks of a dense "
                            f"model are replicas that share nothing: use engine.replicas: {d}")
    if not engine.enable_expert_parallel:
        raise ScenarioError(f"{at}: data parallelism is modelled with expert parallelism (set "
                            "engine.enable_expert_parallel: true), as vLLM serves wide MoE models")
    _refuse_beside(engine, at, "data parallelism", ("speculative", "disaggregation", "autoscaling"), stages=True)


def _refuse_beside(engine: EngineConfig, at: str, feature: str, keys: tuple[str, ...], stages: bool) -> None:
    """One wording for a feature not modelled together with another: on a scheduler that is not
    iteration-level, beside any engine key of `keys` that is set, or (`stages`) beside pipeline stages."""
    if not SCHEDULERS[engine.scheduler].iteration_level:
        raise ScenarioError(f"{at}: {feature} with the {engine.scheduler} scheduler is not modelled (it is: "
                            f"{', '.join(n for n, c in SCHEDULERS.items() if c.iteration_level)})")
    for key in keys:
        if getattr(engine, key) is not None:
            raise ScenarioError(f"{at}: {feature} with engine.{key} is not modelled")
    if stages and engine.pipeline_parallel_size > 1:
        raise ScenarioError(f"{at}: {feature} with engine.pipeline_parallel_size > 1 is not modelled")


def _check_network(engine: EngineConfig, hw: HardwareSpec, w: Where) -> None:
    """A replica whose pipeline stages or expert-parallel group span nodes needs the GPU's network."""
    span = engine.gpus_per_replica if engine.pipeline_parallel_size > 1 or engine.data_parallel_size > 1 else 0
    if span > hw.nvlink_domain and hw.network_bandwidth <= 0:
        key = "pipeline_parallel_size" if engine.pipeline_parallel_size > 1 else "data_parallel_size"
        raise ScenarioError(f"{w('engine.' + key)}: {span} GPUs a replica span nodes of {hw.nvlink_domain}, and "
                            f"{hw.name} has no network figure to cross them (give hardware.network_bandwidth, "
                            "bytes/s per GPU per direction)")


def _check_fits(engine: EngineConfig, model: ModelSpec, hw: HardwareSpec, w: Where) -> MemoryBudget:
    """Tensor parallelism must split the heads evenly, and weights + KV blocks must fit."""
    tp = engine.tensor_parallel_size
    if model.num_attention_heads % tp:
        raise ScenarioError(f"{w('engine.tensor_parallel_size')}: {tp} does not divide "
                            f"{model.name}'s {model.num_attention_heads} attention heads")
    # Blame the engine key a --set changed, if any: that is what made the model stop fitting.
    keys = ("tensor_parallel_size", "gpu_memory_utilization", "max_num_batched_tokens", "num_gpu_blocks")
    where = next((w(f"engine.{k}") for k in keys if w(f"engine.{k}").startswith("--set")), w("model"))
    slots = memory.lora_slot_bytes(model, engine.lora, tp)
    usable = engine.gpu_memory_utilization * hw.memory_bytes
    lora = engine.lora
    if lora is not None and slots >= usable:  # (the adapter slots alone do not fit: engine.lora is what to change)
        raise ScenarioError(f"{w('engine.lora')}: {lora.max_loras} adapter slots of rank {lora.max_lora_rank} take "
                            f"{slots / 1e9:,.1f} GB per GPU, more than the {usable / 1e9:.1f} GB usable on {hw.name}; "
                            "lower max_loras or max_lora_rank")
    return memory.kv_budget(model, hw, tensor_parallel_size=tp,
                     gpu_memory_utilization=engine.gpu_memory_utilization,
                     block_size=engine.block_size, max_num_batched_tokens=engine.max_num_batched_tokens,
                     num_gpu_blocks=engine.num_gpu_blocks, where=where,
                            kv_cache_dtype=engine.kv_cache_dtype,
                            enable_expert_parallel=engine.enable_expert_parallel,
                            data_parallel_size=engine.data_parallel_size,
                            reserved_bytes=slots)


def _parse_cost_model(v: Any, w: Where, base_dir: Path, model: ModelSpec, hw: HardwareSpec,
                      engine: EngineConfig) -> CostModelSpec:
    """sim/cost/registry.py validates the spec; here only the profile path is resolved against base_dir.
    None (not given): measured where a profile is shipped, else roofline, said once."""
    if engine.data_parallel_size > 1:  # DP attention + expert parallelism: the roofline's estimate
        name = v if isinstance(v, str) else next(iter(v)) if isinstance(v, dict) and len(v) == 1 else None
        if v is None:
            from sim.cost.expert_parallel import measured_all_to_all  # (the cost layer's tables)

            spec = cost.parse_cost_model("roofline", model, hw, engine.tensor_parallel_size, w("cost_model"))
            group = engine.tensor_parallel_size * engine.data_parallel_size
            a2a, why = measured_all_to_all(model, hw, engine.all2all_backend, group)
            backend = engine.all2all_backend
            said = (f"its {backend} all-to-all measured (DeepEP at EP{group}, AIConfigurator tables)" if a2a is not None
                    else f"its {backend} all-to-all a stated model (sim/cost/expert_parallel.py)"
                    if backend == "allgather_reducescatter" else
                    f"its {backend} all-to-all a stated model (sim/cost/expert_parallel.py; {why})")
            return dataclasses.replace(spec, notice=(
                f"step costs are estimated (roofline), not measured: data_parallel_size {engine.data_parallel_size} "
                f"with expert parallelism has no measured profile; {said}"))
        if name not in ("roofline", "unit"):
            raise ScenarioError(f"{w('cost_model')}: with engine.data_parallel_size > 1 the steps are priced "
                                "by the roofline with expert parallelism's all-to-all (no measured profile "
                                "covers DP/EP yet); use roofline or leave cost_model out")
    if v is None:
        return cost.default_cost_model(model, hw, engine.tensor_parallel_size, w("cost_model"),
                                       engine.kv_cache_dtype)
    if isinstance(v, dict) and "profile" in v:
        if engine.pipeline_parallel_size > 1:
            raise ScenarioError(f"{w('cost_model.profile')}: a profile prices the whole model's iterations; "
                                "with engine.pipeline_parallel_size > 1 each stage is priced on its own "
                                "layers: use cost_model: measured (composed per stage) or roofline")
        v = {**v, "profile": _existing_path(v["profile"], "cost_model.profile", w, base_dir,
                                            "a path to a profile .yaml")}
    return cost.check_kv_cache_dtype(cost.parse_cost_model(v, model, hw, engine.tensor_parallel_size,
                                                           w("cost_model")), engine.kv_cache_dtype, w("cost_model"))


def _parse_slo(v: Any, w: Where, path: str = "slo", percentile: float | None = None) -> SLOConfig | None:
    """The slo section (`path`: where it sits; a class's: slo.classes.<name>, which takes no ITL
    target and inherits the scenario's `percentile`)."""
    if v is None:
        return None
    top = path == "slo"
    metrics = SLO_METRICS if top else tuple(k for k in SLO_METRICS if k != "itl_ms")
    if not top and isinstance(v, dict) and v.get("itl_ms") is not None:
        raise ScenarioError(f"{w(path + '.itl_ms')}: not per class (ITL is judged over every token stream at once)")
    m = _section(v, path, w, (*metrics, "percentile", *(("classes",) if top else ())))
    pct = _num(_or(m.get("percentile"), percentile if percentile is not None else SLOConfig.percentile),
               w(f"{path}.percentile"), 0, 100, open_lo=True, open_hi=True)
    limits: dict[str, float] = {}
    own: list[tuple[str, float]] = []
    for k in metrics:
        if m.get(k) is None:
            continue
        value, at = split_target(m[k])
        limits[k] = _num(value, w(f"{path}.{k}"), 0, open_lo=True, cap=MAX_SECONDS * 1e3)
        if at is not None:
            own.append((k, _num(at, w(f"{path}.{k}") + " (the percentile after @p)", 0, 100,
                                open_lo=True, open_hi=True)))
    if not limits:
        raise ScenarioError(f"{w(path)}: give at least one of {', '.join(metrics)} (milliseconds; "
                            "e.g. ttft_ms: 500 or tpot_ms: 50@p95)" + (", or leave slo out" if top else ""))
    classes: list[tuple[str, SLOConfig]] = []
    if top and m.get("classes") is not None:
        if not isinstance(m["classes"], dict) or not m["classes"]:
            raise ScenarioError(f"{w('slo.classes')}: {m['classes']!r} is not a mapping of workload class names to "
                                "their SLO, e.g. {batch: {e2el_ms: 600000}}")
        for name, section in m["classes"].items():
            parsed = _parse_slo(section, w, f"slo.classes.{name}", pct)
            if parsed is None:
                raise ScenarioError(f"{w(f'slo.classes.{name}')}: empty; give its targets, e.g. {{e2el_ms: 600000}}")
            classes.append((str(name), parsed))
    return SLOConfig(percentile=pct, percentiles=tuple(own), classes=tuple(classes), **limits)


def split_target(v: Any) -> tuple[Any, Any]:
    """500 -> (500, None); "100@p95" -> ("100", "95"): a target and its own percentile, as written."""
    if isinstance(v, str) and "@" in v:
        value, _, at = v.partition("@")
        at = at.strip()
        return _float(value.strip()), _float(at[1:] if at[:1] in "pP" else at)
    return v, None


def _float(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return text  # _num says what is wrong with it
