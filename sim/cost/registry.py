"""Cost models: which one a scenario's `cost_model` names, its options checked, and the model built.
The per-iteration models themselves are in sim/cost/step_cost.py (compiled with the engine).

CONTRACT (owned by the cost-model engineer):
    CostModel Protocol: step_times(stats, steps=1) -> np.ndarray of seconds, shape [steps].
    COST_MODELS = {name: CostModelKind(option checker, builder, ..., measured?, summary)}
    parse_cost_model(spec, model, hardware, tensor_parallel_size, where="") -> CostModelSpec
        spec: "unit" | "roofline" | {"roofline": {constant: value}} | {"profile": Path}
    CostModelSpec.build(model, hardware, tensor_parallel_size) -> CostModel (no file I/O)
    load_profile(path, where="") -> StepProfile   (format: docs/cost_models.md)
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from sim.config.checks import MAX_STEP_SECONDS, _num, _section, check_input_file, load_yaml, parsed_once
from sim.config.errors import ScenarioError
from sim.cost import linear_attention, measured
from sim.cost.error_band import serving_error_band
from sim.cost.overheads import (
    OVERHEAD_KEYS,
    WHOLE_ITERATION_KEYS,
    EngineOverheads,
    check_serving_error,
    default_overheads,
    overheads_from_mapping,
    parse_overheads,
)

# the per-iteration models, importable from here as before (the contract above names them)
from sim.cost.step_cost import (
    CostModel,
    ProfileCost,
    RooflineCost,
    ScaledCost,
    StepProfile,
    UnitCost,
    WindowedCost,
    prefill_attention_work,
)
from sim.cost.table_cost import TableProfileCost
from sim.presets.hardware import HARDWARE_PRESETS, HardwareSpec, is_preset
from sim.presets.models import MODEL_PRESETS, ModelSpec

__all__ = ["COST_MODELS", "CostModel", "CostModelKind", "CostModelSpec", "PROFILE_FORMAT", "ProfileCost",
           "RooflineCost", "ScaledCost", "StepProfile", "UnitCost", "WindowedCost", "check_kv_cache_dtype",
           "default_cost_model", "describe", "load_profile", "make_cost_model", "parse_cost_model",
           "prefill_attention_work"]

PROFILE_FORMAT = "servesim-step-profile/v1"


def _fail(where: str, msg: str) -> ScenarioError:
    return ScenarioError(f"{where}: {msg}" if where else msg)


# ---- profile YAML parsing (format documented in docs/cost_models.md) ----

_META_REQUIRED = ("device", "model", "dtype", "tensor_parallel_size", "measured")
_META_OPTIONAL = ("torch", "triton", "date", "grid", "heldout_mape", "heldout_max_error", "notes",
                  "serving_error", "calibrated_on")
_TERMS = ("intercept", "total_tokens", "decode_context_sum", "prefill_attention_work", "num_seqs")


def _keys(value: Any, where: str, required: tuple, optional: tuple = ()) -> dict:
    allowed = required + optional
    if not isinstance(value, dict):
        raise _fail(where, f"must be a mapping with keys {', '.join(allowed)}")
    unknown = sorted(set(value) - set(allowed), key=str)
    if unknown:
        raise _fail(where, f"unknown key {unknown[0]!r}; allowed: {', '.join(allowed)}")
    missing = [k for k in required if k not in value]
    if missing:
        raise _fail(where, f"missing key {missing[0]!r}; required: {', '.join(required)}")
    return value


def _nonneg(value: Any, where: str) -> float:
    if isinstance(value, str):  # PyYAML reads 6e-11 (no dot) as a string
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _fail(where, f"must be a finite number, got {value!r}")
    if value < 0:
        raise _fail(where, f"must be >= 0, got {value!r}")
    return float(value)


def _check_metadata(meta: Any, where: str) -> dict:
    # attention (backend name) and time_split_ms (free-form, like grid): optional, added after v1
    # shipped; older files kept them under grid and still load.
    meta = _keys(meta, where, _META_REQUIRED, (*_META_OPTIONAL, "attention", "time_split_ms"))
    for key in ("device", "model", "dtype"):
        if not isinstance(meta[key], str) or not meta[key]:
            raise _fail(f"{where}.{key}", f"must be a non-empty string, got {meta[key]!r}")
    tp = meta["tensor_parallel_size"]
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise _fail(f"{where}.tensor_parallel_size", f"must be a positive integer, got {tp!r}")
    if not isinstance(meta["measured"], bool):
        raise _fail(f"{where}.measured", f"must be true or false, got {meta['measured']!r}")
    for key in ("heldout_mape", "heldout_max_error"):
        if meta.get(key) is not None:
            _nonneg(meta[key], f"{where}.{key}")
    mape = meta.get("heldout_mape")
    if mape is not None and mape >= 1:  # (steps 1 - MAPE as long: none at all; a percent written as one?)
        raise _fail(f"{where}.heldout_mape", f"{mape:g} is a fraction of the step time (0.05 = 5%); a held-out "
                                             "error of 100% or more brackets nothing")
    if meta.get("attention") is not None and not isinstance(meta["attention"], str):
        raise _fail(f"{where}.attention", f"must be a string, got {meta['attention']!r}")
    if meta.get("time_split_ms") is not None and not isinstance(meta["time_split_ms"], dict):
        raise _fail(f"{where}.time_split_ms", f"must be a mapping, got {meta['time_split_ms']!r}")
    if meta.get("serving_error") is not None:  # calibrate --from-bench --profile: the plan's band
        check_serving_error(meta["serving_error"], f"{where}.serving_error")
    return meta


def _check_curve(curve: Any, where: str) -> tuple[np.ndarray, np.ndarray]:
    curve = _keys(curve, where, ("knots", "seconds"))
    knots, secs = curve["knots"], curve["seconds"]
    for key, seq in (("knots", knots), ("seconds", secs)):
        if not isinstance(seq, list) or len(seq) < 2:
            raise _fail(f"{where}.{key}", "must be a list of at least 2 numbers")
    if len(knots) != len(secs):
        raise _fail(where, f"knots and seconds must have the same length, got {len(knots)} "
                           f"and {len(secs)}")
    k = np.array([_nonneg(v, f"{where}.knots[{i}]") for i, v in enumerate(knots)])
    s = np.array([_nonneg(v, f"{where}.seconds[{i}]") for i, v in enumerate(secs)])
    if np.any(np.diff(k) <= 0):
        raise _fail(f"{where}.knots", f"must be strictly increasing, got {knots}")
    if np.any(np.diff(s) < 0):
        raise _fail(f"{where}.seconds", f"must be non-decreasing (more tokens never cheaper), "
                                        f"got {secs}")
    return k, s


def load_profile(path: Path, where: str = ""):
    """A StepProfile (v1, fitted by calibrate/fit.py) or a TableProfile (v2, sim/cost/measured.py),
    read once while the file is unchanged (both are frozen: shared safely)."""
    path = Path(path)
    if not path.exists():
        raise _fail(where, f"profile file {path} not found")
    try:
        return parsed_once(path, _load_profile)
    except ScenarioError as e:  # (the file's own error, led by the key that named the file)
        if where and not str(e).startswith(where):
            raise ScenarioError(f"{where}: {e}") from None
        raise


def _load_profile(path: Path, where: str = ""):
    """Read and strictly validate a step-cost profile YAML. Errors name the file and key path."""
    path = Path(path)
    if not path.exists():
        raise _fail(where, f"profile file {path} not found")
    check_input_file(path, "profile")
    try:
        data = path.read_bytes()
        doc = load_yaml(data.decode("utf-8"), str(path))
    except (OSError, UnicodeDecodeError, ScenarioError) as exc:
        problem = str(exc).splitlines()[0].removeprefix(f"{path}:").strip()
        raise ScenarioError(f"{path}: not a readable YAML file ({problem})") from None
    if isinstance(doc, dict) and doc.get("format") == measured.FORMAT:
        return measured.load_table_profile(path, doc, data)
    doc = _keys(doc, str(path), ("format", "metadata", "model"))
    if doc["format"] != PROFILE_FORMAT:
        raise ScenarioError(f"{path}: format: got {doc['format']!r}; allowed: {PROFILE_FORMAT}, "
                            f"{measured.FORMAT}")
    meta = _check_metadata(doc["metadata"], f"{path}: metadata")
    terms = _keys(doc["model"], f"{path}: model", _TERMS, ("engine_overheads",))
    knots, seconds = _check_curve(terms["total_tokens"], f"{path}: model.total_tokens")
    coef = {k: _nonneg(terms[k], f"{path}: model.{k}") for k in _TERMS if k != "total_tokens"}
    # its iterations were timed whole (the engine's host work in them): no host floor on top
    overheads = (overheads_from_mapping(terms["engine_overheads"], f"{path}: model.engine_overheads",
                                        WHOLE_ITERATION_KEYS) if "engine_overheads" in terms else None)
    return StepProfile(knots=knots, seconds=seconds, metadata=meta, source=path,
                       sha256=hashlib.sha256(data).hexdigest(), overheads=overheads, **coef)


# ---- the registry: name -> how to build that model from a scenario's `cost_model` value ----

_ROOFLINE_KWARGS = ("compute_efficiency", "bandwidth_efficiency", "interconnect_efficiency",
                    "allreduce_latency_s", "overhead_s", "overhead_per_seq_s")


def _unit_options(options: Any, where: str, hardware: HardwareSpec, tp: int, model=None) -> dict:
    return {}


def _roofline_options(options: Any, where: str, hardware: HardwareSpec, tp: int, model=None) -> dict:
    at = f"{where}.roofline"
    options = _section(options, at, lambda path: path, _ROOFLINE_KWARGS)
    kwargs = {k: _num(v, f"{at}.{k}", 0, 1, open_lo=True) if k.endswith("_efficiency")
              else _num(v, f"{at}.{k}", 0, cap=MAX_STEP_SECONDS) for k, v in options.items()}
    if tp > 1 and hardware.interconnect_bandwidth <= 0:
        raise _fail(where, f"roofline needs {hardware.name}.interconnect_bandwidth > 0 for "
                           f"tensor_parallel_size={tp}")
    return kwargs


def _profile_options(options: Any, where: str, hardware: HardwareSpec, tp: int, model=None) -> dict:
    """Reads the profile now: a malformed one is a config error, not a crash mid-run."""
    profile = load_profile(Path(options), f"{where}.profile" if where else "profile")
    fitted_tp = profile.metadata["tensor_parallel_size"]
    if fitted_tp != tp:
        raise ScenarioError(f"{profile.source}: metadata.tensor_parallel_size is {fitted_tp} "
                            f"but the scenario runs tensor_parallel_size={tp}; "
                            f"use a profile fitted at that size")
    out: dict = {"profile": profile}
    if isinstance(profile, measured.TableProfile):  # kernel time: the engine's overheads on top
        _check_profile_matches(profile, model, hardware)
        out["overheads"] = profile.overheads or default_overheads()
    elif profile.overheads is not None:  # whole iterations: request handling, the lag, a server's adder
        out["overheads"] = profile.overheads
    return out


def _check_profile_matches(profile, model, hardware: HardwareSpec) -> None:
    """A kernel-table (v2) profile prices one model on one GPU: another model's or GPU's is refused,
    naming both (an H100 profile pricing an H200 in a GPU search, or a Qwen profile a Llama run,
    went through silently). A model is the profile's when its name is, or when it is the preset of
    that name field for field (a config.json read under another name)."""
    meta = profile.metadata
    gpu = meta.get("hardware")
    if gpu is not None and gpu != hardware.name and not (gpu in HARDWARE_PRESETS and is_preset(
            replace(hardware, name=gpu))):
        raise ScenarioError(f"{profile.source}: a profile of {gpu} kernel timings, but the scenario runs "
                            f"on {hardware.name}; compose one for {hardware.name} (servesim calibrate "
                            f"--from-tables) or use cost_model: measured")
    name = meta.get("model")
    preset = MODEL_PRESETS.get(name) if isinstance(name, str) else None
    same = model is None or name == model.name or (preset is not None and replace(preset, name=model.name) == model)
    if not same:
        raise ScenarioError(f"{profile.source}: a profile of {name}, but the scenario's model is {model.name}; "
                            f"use that model's profile, or cost_model: measured (composed for any model)")


_MEASURED_KWARGS = ("cpu_overhead_s", "cpu_overhead_per_seq_s", *OVERHEAD_KEYS)


def _measured_options(options: Any, where: str, hardware: HardwareSpec, tp: int, model=None) -> dict:
    """The step profile of the scenario's model x GPU x TP, read or composed now, and the
    scenario's engine-overhead tuning (sim/cost/overheads.py; defaults fitted to real vLLM). The
    profile: the shipped one (sim/profiles/) of a preset model, else composed from the GPU's
    kernel tables (sim/tables/) for any model the composer covers (a config.json's)."""
    options = _section(options, f"{where}.measured", lambda path: path, _MEASURED_KWARGS)
    kwargs = {k: _num(v, f"{where}.measured.{k}", 0, cap=MAX_STEP_SECONDS) if k != "async_scheduling" else v
              for k, v in options.items()}
    overheads = parse_overheads(kwargs, default_overheads(), f"{where}.measured")

    if not is_preset(hardware):  # (its price aside: a price never changes a step's cost)
        raise _fail(where, f"measured: kernel tables exist for preset GPUs only, and "
                           f"{hardware.name!r} is not one (or differs from it beyond its price); use roofline")
    # a model read from a config.json is its preset's when every field but the name agrees
    # (tests/fixtures/hf_configs/ Mixtral-8x7B is mixtral-8x7b)
    name = next((n for n, m in MODEL_PRESETS.items() if m == replace(model, name=n)), None)
    path = measured.shipped_profile(name, hardware.name, tp) if name is not None else None
    if path is not None:
        profile = load_profile(path, f"{where}.measured")
    else:
        from sim.cost.composer import composed_profile
        profile = composed_profile(model, hardware, tp, where)
    return {"profile": profile, **{k: v for k, v in kwargs.items() if k not in OVERHEAD_KEYS},
            "overheads": overheads}


def _build_profile(kw, m, hw, tp):
    profile = kw["profile"]
    if isinstance(profile, measured.TableProfile):
        return TableProfileCost(profile, kw.get("cpu_overhead_s"),
                                         kw.get("cpu_overhead_per_seq_s"), kw.get("kv_cache_dtype", "auto"),
                                         kw.get("overheads"), tp)
    overheads = kw.get("overheads")  # (a v1 profile's: no floor, WHOLE_ITERATION_KEYS)
    return ProfileCost(profile) if overheads is None else ProfileCost(profile, overheads.step_floor_and_adder(tp)[1])


@dataclass(frozen=True)
class CostModelKind:
    """One entry of COST_MODELS."""
    options: Any        # (options as written, where, hardware, tp, model) -> kwargs; raises ScenarioError
    build: Any          # (kwargs, model, hardware, tp) -> CostModel
    takes: type | None  # type of the options as written: None (a bare name), dict or a path
    measured: bool      # are its step times measured (True) or estimated (False)?
    summary: str        # one line for --help and docs


COST_MODELS: dict[str, CostModelKind] = {
    "unit": CostModelKind(_unit_options, lambda kw, m, hw, tp: UnitCost(), None, False,
                          "every iteration lasts 1.0 (time counts iterations)"),
    "roofline": CostModelKind(_roofline_options, lambda kw, m, hw, tp: RooflineCost(m, hw, tp, **kw),
                              dict, False, "datasheet peaks x efficiencies + overheads (an estimate)"),
    "profile": CostModelKind(_profile_options, _build_profile, str, True,
                             "a step profile YAML: fitted (v1) or tabulated from kernel tables (v2)"),
    "measured": CostModelKind(_measured_options, _build_profile, dict, True,
                              "the shipped profile from published kernel timings of the "
                              "scenario's model, GPU and TP (the default where one exists)"),
}
_ALLOWED = ("measured, {measured: {frontend_s: S, host_per_iteration_s: S, ...}}, roofline, "
            "{roofline: {constant: value}}, "
            "{profile: PATH}, unit")


@dataclass(frozen=True)
class CostModelSpec:
    """A scenario's `cost_model`, validated and resolved once (a profile is read when the scenario
    loads); `build` makes the model for one simulation without touching any file."""
    name: str        # a key of COST_MODELS
    options: dict    # validated options: roofline constants, {"profile": StepProfile}, or {}
    notice: str | None = None  # set when the default fell back to an estimate: say so once
    scale: float = 1.0  # every step this many times as long (the planner's cost-error band)

    @property
    def profile(self) -> StepProfile | None:
        return self.options.get("profile")

    @property
    def overheads(self) -> EngineOverheads | None:
        """The engine overheads on top of a measured profile's kernel time; on a fitted (v1)
        profile, whose iterations were timed whole, those it carries (calibrate --from-bench
        --profile: no host floor). None: nothing on top (roofline, unit, other v1 profiles)."""
        return self.options.get("overheads")

    def build(self, model: ModelSpec, hardware: HardwareSpec, tensor_parallel_size: int,
              kv_cache_dtype: str = "auto", data_parallel_size: int = 1) -> CostModel:
        """The model for one simulation; `kv_cache_dtype` (the engine's) prices KV reads where the
        model estimates them (roofline) and picks a measured profile's attention grids;
        `data_parallel_size` > 1: one DP rank's steps with the experts spread over every rank's GPUs
        (the roofline's; the scenario allows no other)."""
        options = self.options if kv_cache_dtype == "auto" else {**self.options, "kv_cache_dtype": kv_cache_dtype}
        if data_parallel_size > 1 and self.name == "roofline":
            options = {**options, "data_parallel_size": data_parallel_size}
        built = COST_MODELS[self.name].build(options, model, hardware, tensor_parallel_size)
        if model.sliding_layers:
            built = WindowedCost(built, model.sliding_layers / model.num_layers, model.sliding_window)
        if model.linear_attention is not None and self.name != "unit":  # (unit: one per step, whatever runs)
            kernels, _ = linear_attention.kernels_for(model, hardware, tensor_parallel_size)
            built = linear_attention.LinearAttentionCost(built, kernels, model.linear_attention.layers)
        return built if self.scale == 1.0 else ScaledCost(built, self.scale)

    def as_yaml(self) -> Any:
        """The spec as a scenario writes it (profile paths absolute)."""
        tuning = {k: v for k, v in self.options.items() if k not in ("profile", "overheads")}
        if self.name == "measured":  # the overheads in force, written out: the run repeats whatever
            assert self.overheads is not None  # (measured always carries them)
            return {"measured": {**tuning, **self.overheads.as_dict()}}  # the defaults become
        if self.profile is not None:
            return {"profile": str(self.profile.source)}
        return {self.name: tuning} if tuning else self.name

    def provenance(self) -> dict:
        """What summary.json says about where the step times came from."""
        out = {"name": self.name, "measured": COST_MODELS[self.name].measured}
        if self.profile is not None:
            meta = self.profile.metadata
            out.update(profile=str(self.profile.source), sha256=self.profile.sha256,
                       device=meta["device"], model=meta["model"],
                       measured=bool(meta.get("measured", False)),
                       heldout_mape=meta.get("heldout_mape"))
            if "source" in meta:
                out["source"] = meta["source"]
        tuning = {k: v for k, v in self.options.items() if k not in ("profile", "overheads")}
        if tuning:
            out["options"] = tuning
        if self.overheads is not None:
            out["engine_overheads"] = self.overheads.as_dict()
        out["error_band"] = self.error_band()
        if self.scale != 1.0:
            out["scale"] = self.scale
        return out

    def error_band(self) -> dict | None:
        """How far real iterations were from this model's, measured against real serving: step-time
        factors `slower` (>= 1) and `faster` (<= 1) that bracket the real step (10th and 90th
        percentile of the held-out error), and their `basis`; None where the model was never
        checked against a real server (the roofline, unit, a profile without such a check).

        A kernel-table (v2) profile's own interpolation error (`heldout_mape`: the profile against
        the tables it was tabulated from) says nothing about real serving and is not used here."""
        profile = self.profile
        if profile is not None and profile.metadata.get("serving_error") is not None:
            return profile.metadata["serving_error"]  # calibrate --from-bench: the user's server
        if isinstance(profile, measured.TableProfile):
            # the default overheads carry their held-out error; a profile's own, never checked, none
            return serving_error_band() if profile.overheads is None else None
        mape = profile.metadata.get("heldout_mape") if profile is not None else None
        if mape:  # a v1 profile fitted to timed iterations of a real engine: its held-out error
            return {"slower": 1 + mape, "faster": max(0.0, 1 - mape),
                    "basis": f"the profile's held-out MAPE ({mape:.1%}) against the engine it was fitted on"}
        return None


def describe(provenance: dict | None) -> str:
    """One line on where step costs came from, from CostModelSpec.provenance() as summary.json
    and plan.json record it: measured, or estimated, and from what."""
    c = provenance
    if not c:
        return "not recorded"
    if c.get("profile") and c.get("measured"):
        if c.get("source"):  # composed from published kernel tables (sim/cost/measured.py)
            return (f"measured: {c.get('device')} kernel timings ({c['source']}), "
                    f"profile {Path(c['profile']).name}")
        return f"measured: steps timed on {c.get('device')}, profile {Path(c['profile']).name}"
    if c.get("profile"):
        return f"profile {c['profile']} (fitted on {c.get('device')}, not measured on a GPU)"
    return {"roofline": "estimated with the roofline (datasheet peaks x efficiencies), not measured",
            "unit": "unit (every iteration lasts 1.0; times count iterations)"}.get(c["name"], c["name"])


def parse_cost_model(spec: Any, model: ModelSpec, hardware: HardwareSpec,
                     tensor_parallel_size: int, where: str = "") -> CostModelSpec:
    """Validate a scenario's `cost_model` value ("unit" | "roofline" | {"roofline": {...}} |
    {"profile": PATH}); `where` is e.g. "chat.yaml: cost_model". Raises ScenarioError listing the
    valid specs."""
    if isinstance(spec, CostModelSpec):
        return spec
    name, options = spec, None
    if isinstance(spec, dict) and len(spec) == 1:
        name, options = next(iter(spec.items()))
    kind = COST_MODELS.get(name) if isinstance(name, str) else None
    takes = type(None) if kind is None or kind.takes is None else kind.takes
    if kind is None or not (isinstance(options, takes) or (takes is dict and options is None)
                            or (takes is str and isinstance(options, Path))):
        raise _fail(where, f"unknown cost model {spec!r}; allowed: {_ALLOWED}")
    return CostModelSpec(name, kind.options(options, where, hardware, tensor_parallel_size, model))


def default_cost_model(model: ModelSpec, hardware: HardwareSpec, tensor_parallel_size: int,
                       where: str = "", kv_cache_dtype: str = "auto") -> CostModelSpec:
    """What a scenario without `cost_model` gets: the measured profile of its model x GPU x TP
    (with attention timed at its KV-cache dtype) where one is shipped, else the roofline estimate
    with a notice saying so."""
    try:
        return check_kv_cache_dtype(parse_cost_model("measured", model, hardware, tensor_parallel_size, where),
                                    kv_cache_dtype, where)
    except ScenarioError as e:
        spec = parse_cost_model("roofline", model, hardware, tensor_parallel_size, where)
        fp8 = " with an FP8 KV cache" if kv_cache_dtype != "auto" else ""
        why = str(e).removeprefix(f"{where}: " if where else "").removeprefix("measured: ")
        return CostModelSpec("roofline", spec.options, notice=(
            f"step costs are estimated (roofline), not measured: no measured profile for "
            f"{model.name} on {hardware.name} at tensor_parallel_size={tensor_parallel_size}{fp8} ({why})"))


def check_kv_cache_dtype(spec: CostModelSpec, kv_cache_dtype: str, where: str = "") -> CostModelSpec:
    """`spec`, if it can price the engine's KV-cache dtype: a measured (v2) profile needs attention
    timed with that cache (ScenarioError naming the profile otherwise); the other models can."""
    if isinstance(spec.profile, measured.TableProfile):
        try:
            spec.profile.attention(kv_cache_dtype)
        except ScenarioError as e:
            raise _fail(where, str(e)) from None
    return spec


def make_cost_model(spec: Any, model: ModelSpec, hardware: HardwareSpec,
                    tensor_parallel_size: int, where: str = "") -> CostModel:
    """Build a cost model from a scenario's `cost_model` value (or a parsed CostModelSpec)."""
    return parse_cost_model(spec, model, hardware, tensor_parallel_size, where).build(
        model, hardware, tensor_parallel_size)
