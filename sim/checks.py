"""The one validation vocabulary for every scenario section (model, hardware, engine, cost_model,
workload, slo) and CLI option: each validator checks one value and raises a one-line ScenarioError
in one style, `<file>: <key.path>: <value> is not <what is allowed>`:

    _int, _num, _bool, _choice, _text   one value
    _check_keys, check_fields, _section  the keys of a mapping (unknown keys get a "did you mean")
    _existing_path                        a file the scenario names

Numbers: YAML 1.1 (PyYAML) reads an exponent without a dot (`24e9`, `9e-1`) as a string; where a
real number is expected such a string is read as the number it spells, and an integer must be
written as one (the message says so).
"""
from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .errors import ScenarioError

Where = Callable[[str], str]  # key path -> "file.yaml: key.path" (or "--set key.path")


def _or(v: Any, default: Any) -> Any:
    """A key written with no value (YAML null) counts as absent, as in the workload section."""
    return default if v is None else v


def _show(v: Any) -> str:
    """A value as YAML spells it, for messages."""
    if v is None or isinstance(v, bool):
        return {None: "null", True: "true", False: "false"}[v]
    if isinstance(v, (dict, list)):
        return "a mapping" if isinstance(v, dict) else "a list"
    return repr(v)


def _number_hint(v: Any) -> str:
    if isinstance(v, str):
        try:
            float(v)
        except ValueError:
            return ""
        return " (YAML 1.1 reads 1e3 as a string; write 1000 or 1.0e+3)"
    return ""


_EXPONENT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")  # what YAML 1.1 leaves a string


def _int(v: Any, where: str, lo: int, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        allowed = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ScenarioError(f"{where}: {_show(v)} is not an integer {allowed}{_number_hint(v)}")
    return v


def _num(v: Any, where: str, lo: float, hi: float | None = None, open_lo: bool = False,
         open_hi: bool = False) -> float:
    if isinstance(v, str) and _EXPONENT.fullmatch(v.strip()):
        v = float(v)
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if not ok or v < lo or (open_lo and v == lo) or (hi is not None and (v > hi or open_hi and v == hi)):
        allowed = (f"{'>' if open_lo else '>='} {lo}" if hi is None else
                   f"in {'(' if open_lo else '['}{lo}, {hi}{')' if open_hi else ']'}")
        raise ScenarioError(f"{where}: {_show(v)} is not a number {allowed}{_number_hint(v)}")
    return float(v)


def _bool(v: Any, where: str) -> bool:
    if not isinstance(v, bool):
        raise ScenarioError(f"{where}: {_show(v)} is not true or false")
    return v


def _text(v: Any, where: str) -> str:
    if not isinstance(v, str) or not v:
        raise ScenarioError(f"{where}: {_show(v)} is not a non-empty string")
    return v


def _choice(v: Any, where: str, allowed: Iterable[str]) -> str:
    if not isinstance(v, str) or v not in allowed:
        raise ScenarioError(f"{where}: {_show(v)} is not one of {', '.join(allowed)}")
    return v


def _check_keys(m: dict, prefix: str, w: Where, allowed: Iterable[str]) -> None:
    for key in m:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            path = f"{prefix}.{key}" if prefix else str(key)
            raise ScenarioError(f"{w(path)}: unknown key{hint}; allowed: {', '.join(allowed)}")


def _section(v: Any, key: str, w: Where, allowed: tuple[str, ...]) -> dict:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ScenarioError(f"{w(key)}: {_show(v)} is not a mapping; allowed keys: {', '.join(allowed)}")
    _check_keys(v, key, w, allowed)
    return v


def _existing_path(v: Any, key: str, w: Where, base_dir: Path, what: str) -> Path:
    if not isinstance(v, str) or not v:
        raise ScenarioError(f"{w(key)}: {_show(v)} is not {what}")
    path = (base_dir / Path(v).expanduser()).absolute()
    if not path.exists():
        raise ScenarioError(f"{w(key)}: no such file {v!r} (looked in {base_dir})")
    return path


def check_fields(fields: Any, where: str, allowed: tuple[str, ...], required: tuple[str, ...]) -> None:
    """A mapping of dataclass fields at `where` ("file.yaml: model"): no unknown keys, none of the
    required ones missing."""
    at = f"{where}: " if where else ""
    if not isinstance(fields, dict):
        raise ScenarioError(f"{at}{_show(fields)} is not a mapping; allowed keys: {', '.join(allowed)}")
    _check_keys(fields, "", lambda key: f"{where}.{key}" if where else key, allowed)
    missing = [k for k in required if k not in fields]
    if missing:
        path = f"{where}.{missing[0]}" if where else missing[0]
        raise ScenarioError(f"{path}: missing; required: {', '.join(required)}")


def check_out_dir(out_dir: Path) -> None:
    """Refuse an --out that is a file, or lies under one, before any simulation runs."""
    existing = next(p for p in (out_dir, *out_dir.parents) if p.exists())
    if not existing.is_dir():
        where = "" if existing == out_dir else f"{existing} "
        raise ScenarioError(f"--out {out_dir}: {where}exists and is not a directory")
