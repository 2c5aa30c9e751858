"""Measured step costs: `servesim-step-profile/v2` files (table-lookup terms) and the shipped ones.

A v2 profile is one model x GPU x tensor-parallel size, tabulated by calibrate/measured.py from
kernel timings measured on that GPU (sim/tables/, imported from NVIDIA AIConfigurator). An
iteration with T scheduled tokens, S sequences, n decodes with context sum C, and b prefill chunks
whose causal (query, key) pairs sum to P costs, in seconds:

    cpu.per_iteration + cpu.per_sequence x S            CPU/framework time (cited default, tunable)
  + tokens(T)        linear layers, norms/activation, TP all-reduces: piecewise-linear in T
  + sequences(S)     LM head: piecewise-linear in S
  + decode(n, C / n)                 bilinear over (decodes, mean KV length)
  + prefill(b, sqrt(2 P / b))        bilinear over (chunks, length with the same pairs)

With `engine.kv_cache_dtype: fp8` the two attention terms come from the profile's optional
`fp8_kv_cache` section (the same two grids, timed with an FP8 KV cache), where the tables had such
rows; without it a scenario asking for FP8 KV is refused (sim/cost/registry.py).

Past the last point of any axis the last point is scaled in proportion (work grows linearly), as
the composer does, so the profile reproduces the composition it was tabulated from. Shipped
profiles live in sim/profiles/<gpu>/<model>-tp<N>.yaml; `shipped_profile` finds one.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sim.config.errors import ScenarioError
from sim.cost.overheads import EngineOverheads, check_serving_error, overheads_from_mapping
from sim.cost.table_cost import Curve, Grid

FORMAT = "servesim-step-profile/v2"
PROFILES = Path(__file__).resolve().parents[1] / "profiles"  # sim/profiles
_META_KEYS = ("device", "model", "dtype", "tensor_parallel_size", "measured", "source",
              "heldout_mape", "heldout_max_error", "heldout_shapes", "notes", "extrapolated",
              "tables", "hardware", "kv_cache_dtypes", "serving_error", "calibrated_on")


def _fail(where: str, msg: str) -> ScenarioError:
    return ScenarioError(f"{where}: {msg}")


def _numbers(value: Any, where: str, *, increasing: bool = False) -> np.ndarray:
    if not isinstance(value, list) or not value:
        raise _fail(where, "must be a non-empty list of numbers")
    try:
        arr = np.array(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise _fail(where, "must be a list of numbers") from None
    if not np.isfinite(arr).all() or (arr < 0).any():
        raise _fail(where, "must hold finite numbers >= 0")
    if increasing and (np.diff(arr) <= 0).any():
        raise _fail(where, "must be strictly increasing")
    return arr


def _mapping(value: Any, where: str, keys: tuple[str, ...]) -> dict:
    if not isinstance(value, dict) or set(value) != set(keys):
        raise _fail(where, f"must be a mapping with keys {', '.join(keys)}")
    return value


def parse_curve(value: Any, where: str) -> Curve:
    """A profile's {knots, seconds} mapping as a Curve (sim/cost/table_cost.py)."""
    m = _mapping(value, where, ("knots", "seconds"))
    x = _numbers(m["knots"], f"{where}.knots", increasing=True)
    y = _numbers(m["seconds"], f"{where}.seconds")
    if len(x) != len(y) or len(x) < 2:
        raise _fail(where, "knots and seconds must have the same length, at least 2")
    return Curve(x, y)


def parse_grid(value: Any, where: str, a_name: str, b_name: str) -> Grid:
    """A profile's {a_name, b_name, seconds} mapping as a Grid (sim/cost/table_cost.py)."""
    m = _mapping(value, where, (a_name, b_name, "seconds"))
    a = _numbers(m[a_name], f"{where}.{a_name}", increasing=True)
    b = _numbers(m[b_name], f"{where}.{b_name}", increasing=True)
    table = m["seconds"]
    if not isinstance(table, list) or len(table) != len(a):
        raise _fail(f"{where}.seconds", f"must be {len(a)} rows (one per {a_name})")
    rows = tuple(Curve(b, _numbers(r, f"{where}.seconds[{i}]")) for i, r in enumerate(table))
    if any(len(r.ys) != len(b) for r in rows):
        raise _fail(f"{where}.seconds", f"every row must have {len(b)} values (one per {b_name})")
    return Grid(a, rows)


@dataclass(frozen=True)
class TableProfile:
    tokens: Curve
    sequences: Curve
    decode_attention: Grid
    prefill_attention: Grid
    cpu_per_iteration: float
    cpu_per_sequence: float
    metadata: dict
    source: Path
    sha256: str = ""
    fp8_kv_cache: tuple[Grid, Grid] | None = None  # (decode, prefill) with an FP8 KV cache
    # the engine overheads on top of the kernel time, where the profile carries its own (fitted to
    # the user's server: calibrate --from-bench); None: the fitted defaults (sim/cost/overheads.py)
    overheads: EngineOverheads | None = None

    def attention(self, kv_cache_dtype: str = "auto") -> tuple[Grid, Grid]:
        """(decode, prefill) attention grids for the engine's KV-cache dtype (fp8, fp8_e4m3 and
        fp8_e5m2 all read the FP8 rows: one byte per element either way)."""
        if kv_cache_dtype == "auto":
            return self.decode_attention, self.prefill_attention
        if self.fp8_kv_cache is None:
            raise ScenarioError(f"{self.source}: has no FP8 KV-cache attention (its kernel tables time "
                                f"a bf16 KV cache only); use engine.kv_cache_dtype: auto, or cost_model: "
                                f"roofline")
        return self.fp8_kv_cache


def load_table_profile(path: Path, doc: dict, data: bytes) -> TableProfile:
    where = str(path)
    if set(doc) != {"format", "metadata", "model"}:
        raise _fail(where, "must be a mapping with keys format, metadata, model")
    meta = doc["metadata"]
    if not isinstance(meta, dict) or not {"device", "model", "tensor_parallel_size"} <= set(meta):
        raise _fail(f"{where}: metadata", "must name device, model and tensor_parallel_size")
    unknown = sorted(set(meta) - set(_META_KEYS))
    if unknown:
        raise _fail(f"{where}: metadata", f"unknown key {unknown[0]!r}; allowed: {', '.join(_META_KEYS)}")
    tp = meta["tensor_parallel_size"]
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise _fail(f"{where}: metadata.tensor_parallel_size", f"must be a positive integer, got {tp!r}")
    if meta.get("serving_error") is not None:  # calibrate --from-bench: the error against the user's server
        check_serving_error(meta["serving_error"], f"{where}: metadata.serving_error")
    keys = ("tokens", "sequences", "decode_attention", "prefill_attention", "cpu_overhead")
    optional = tuple(k for k in ("fp8_kv_cache", "engine_overheads")
                     if isinstance(doc["model"], dict) and k in doc["model"])
    m = _mapping(doc["model"], f"{where}: model", keys + optional)
    overheads = (overheads_from_mapping(m["engine_overheads"], f"{where}: model.engine_overheads")
                 if "engine_overheads" in m else None)
    fp8 = None
    if "fp8_kv_cache" in m:
        f = _mapping(m["fp8_kv_cache"], f"{where}: model.fp8_kv_cache", ("decode_attention", "prefill_attention"))
        fp8 = (parse_grid(f["decode_attention"], f"{where}: model.fp8_kv_cache.decode_attention", "batch", "context"),
               parse_grid(f["prefill_attention"], f"{where}: model.fp8_kv_cache.prefill_attention", "chunks", "length"))
    cpu = _mapping(m["cpu_overhead"], f"{where}: model.cpu_overhead", ("per_iteration", "per_sequence"))
    per_it, per_seq = (_numbers([cpu[k]], f"{where}: model.cpu_overhead.{k}")[0]
                       for k in ("per_iteration", "per_sequence"))
    return TableProfile(
        tokens=parse_curve(m["tokens"], f"{where}: model.tokens"),
        sequences=parse_curve(m["sequences"], f"{where}: model.sequences"),
        decode_attention=parse_grid(m["decode_attention"], f"{where}: model.decode_attention",
                                    "batch", "context"),
        prefill_attention=parse_grid(m["prefill_attention"], f"{where}: model.prefill_attention",
                                     "chunks", "length"),
        cpu_per_iteration=float(per_it), cpu_per_sequence=float(per_seq), metadata=meta,
        source=path, sha256=hashlib.sha256(data).hexdigest(), fp8_kv_cache=fp8, overheads=overheads)


def shipped_profile(model: str, hardware: str, tensor_parallel_size: int) -> Path | None:
    """The shipped v2 profile for these presets, if one exists."""
    path = PROFILES / hardware / f"{model}-tp{tensor_parallel_size}.yaml"
    return path if path.is_file() else None


def shipped_index() -> dict[str, dict[str, list[int]]]:
    """hardware preset -> model preset -> TP sizes with a shipped profile."""
    out: dict[str, dict[str, list[int]]] = {}
    for path in sorted(PROFILES.glob("*/*-tp*.yaml")):
        model, _, tp = path.stem.rpartition("-tp")
        out.setdefault(path.parent.name, {}).setdefault(model, []).append(int(tp))
    return out



