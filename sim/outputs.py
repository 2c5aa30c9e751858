"""One reader for the files servesim writes and is handed back (`report`, `plot`, `export`,
`compare`, a sweep's resume): each file held to what servesim writes there, so that a folder a full
disk cut short, a copy broke or a hand edit changed is one error naming the file, the line or key
and what was wrong, never a traceback from deep in a figure and never a silent wrong number.

What servesim writes (and so what is read back):
- requests.csv, steps.csv: the columns below, every cell a finite number; a count is a whole
  number within 2**53; a time or token count is >= 0; an empty cell only where the run leaves one
  (a time that never came: a request not finished). request_id is unique.
- summary.json: strict JSON (no NaN or Infinity: `sim.simulate.finite` writes null instead), an
  object whose keys servesim writes have their kinds (SUMMARY).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.config.checks import read_json_object
from sim.config.errors import ScenarioError

WHOLE_MAX = 2 ** 53  # a count beyond this is not one servesim wrote (float64 holds whole numbers exactly to here)


@dataclass(frozen=True)
class Column:
    """One CSV column as servesim writes it."""
    whole: bool = False        # a count or an id: a whole number
    empty: bool = False        # may be empty (a time that never came)
    low: float = 0.0           # least value (a replica of a shed request is -1)


_TIME, _OPTIONAL_TIME, _COUNT = Column(), Column(empty=True), Column(whole=True)
REQUESTS = {"request_id": _COUNT, "arrival_s": _TIME, "prompt_tokens": _COUNT, "output_tokens": _COUNT,
            "first_token_s": _OPTIONAL_TIME, "finish_s": _OPTIONAL_TIME, "ttft_s": _OPTIONAL_TIME,
            "tpot_s": _OPTIONAL_TIME, "e2el_s": _OPTIONAL_TIME, "e2e_s": _OPTIONAL_TIME, "queue_s": _OPTIONAL_TIME,
            "preemptions": _COUNT, "replica": Column(whole=True, low=-1),
            # written by some runs only (request handling after the engine; a gateway's shed)
            "engine_finish_s": _OPTIONAL_TIME, "frontend_s": _OPTIONAL_TIME, "stall_s": _OPTIONAL_TIME}
STEPS = {"replica": _COUNT, "start_s": _TIME, "duration_s": _TIME, "count": Column(whole=True, low=1),
         "num_seqs": _COUNT, "prefill_tokens": _COUNT, "decode_tokens": _COUNT, "padded_tokens": _COUNT,
         "kv_blocks_used": _COUNT, "kv_blocks_total": _COUNT, "waiting": _COUNT, "kv_blocks_cached": _COUNT}
SLACK = 1e-9  # s: a time a float subtraction made a hair below 0 is still a time servesim wrote


def check_frame(df: pd.DataFrame, columns: dict[str, Column], path: Path) -> pd.DataFrame:
    """`df` (read from `path`) with each known column numeric and within what servesim writes;
    ScenarioError naming the file, line (the header is line 1) and column of the first bad cell."""
    for name, spec in columns.items():
        if name not in df.columns:
            continue
        raw = df[name]
        values = raw if raw.dtype.kind in "biuf" else pd.to_numeric(raw, errors="coerce")
        a = values.to_numpy(dtype=float)
        given = raw.notna().to_numpy()  # (an empty cell, or "nan", reads as NaN)
        finite = np.isfinite(a)
        with np.errstate(invalid="ignore"):
            checks = ((np.isnan(a) & given, "is not a number"),
                      (np.isinf(a), "is not a finite number"),
                      (~given & (not spec.empty), "is empty (a line cut short?)"),
                      (finite & (a < spec.low - (0 if spec.whole else SLACK)), f"is below {spec.low:g}"),
                      (finite & spec.whole & (np.abs(a) > WHOLE_MAX), "is too large to be a count servesim wrote"),
                      (finite & spec.whole & (a != np.floor(a)), "is not a whole number"))
        for mask, reason in checks:
            if mask.any():
                _refuse(path, raw, name, mask, reason)
        df[name] = values
    if "request_id" in df.columns and df["request_id"].duplicated().any():
        row = int(np.flatnonzero(df["request_id"].duplicated().to_numpy())[0])
        raise ScenarioError(f"{path}: line {row + 2}: request_id {int(df['request_id'].iloc[row])} appears "
                            "twice; not as servesim writes it")
    return df


def _refuse(path: Path, raw: pd.Series, name: str, mask: np.ndarray, reason: str) -> None:
    row = int(np.flatnonzero(mask)[0])
    cell = "" if pd.isna(raw.iloc[row]) else str(raw.iloc[row])
    shown = cell if len(cell) <= 40 else cell[:40] + "..."
    what = f"{shown!r} " if cell else ""
    raise ScenarioError(f"{path}: line {row + 2}, column {name}: {what}{reason}; not as servesim writes it")


# summary.json: the kinds of the keys servesim writes (absent keys are not checked: earlier
# releases wrote fewer). "a number or null": null is a statistic of no requests.
_NUMBER, _NUMBER_OR_NULL, _WHOLE, _TEXT, _SECTION = "a number", "a number or null", "a whole number >= 0", "text", \
    "an object or null"
SUMMARY = {"scenario": _TEXT, "completed": _WHOLE, "duration_s": _NUMBER, "iterations": _WHOLE,
           "request_throughput": _NUMBER_OR_NULL, "output_throughput": _NUMBER_OR_NULL,
           "total_token_throughput": _NUMBER_OR_NULL, "preemptions": _WHOLE,
           **{k: _SECTION for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "energy", "error_band", "run",
                                    "admission", "autoscaling", "sessions", "lora", "kv_offloading", "faults")},
           **{k: _NUMBER_OR_NULL for k in ("slot_utilization", "kv_utilization", "kv_waste", "padding_waste",
                                           "mfu", "mbu", "prefix_cache_hit_rate")}}
REQUIRED = ("scenario", "completed", "duration_s")  # every run's summary has these (a real engine's too: no run)
LATENCY = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms")      # each: statistic -> ms (or null)


def read_json(path: Path, what: str) -> dict:
    """The JSON object servesim wrote at `path` (`what`: "a run summary", "a plan"), strict: NaN or
    Infinity is damage, since servesim writes null for a missing value."""
    return read_json_object(path, what, expected=f"a JSON object ({what})", strict=True)


def damaged_summary(folder: Path, key: str | None, e: Exception) -> ScenarioError:
    """A summary.json whose `key` section (None: some section) holds something servesim does not
    write there, found when a figure or page reads it (this reader holds each section to be an
    object, not its insides): one line naming the file and the section."""
    where = f"{Path(folder) / 'summary.json'}: " + (f"{key}: " if key else "")
    return ScenarioError(f"{where}not as servesim writes it ({type(e).__name__}: {str(e)[:80]}); write the run "
                         "again with servesim run")


def read_summary(path: Path) -> dict:
    """summary.json held to SUMMARY; ScenarioError naming the file and the key."""
    doc = read_json(path, "a run summary")
    for key in REQUIRED:
        if doc.get(key) is None:
            raise ScenarioError(f"{path}: no {key}; not a run summary as servesim writes it")
    for key, kind in SUMMARY.items():
        if key in doc and not _is(doc[key], kind):
            raise ScenarioError(f"{path}: {key}: {_shown(doc[key])} is not {kind}; not a run summary as servesim "
                                "writes it")
    for key in LATENCY:
        for stat, value in (doc.get(key) or {}).items():  # (a section: checked above)
            if not _is(value, _NUMBER_OR_NULL):
                raise ScenarioError(f"{path}: {key}.{stat}: {_shown(value)} is not {_NUMBER_OR_NULL}")
    goodput = doc.get("goodput")
    if not (goodput is None or isinstance(goodput, dict) or _is(goodput, _NUMBER)):
        raise ScenarioError(f"{path}: goodput: {_shown(goodput)} is not an object or a number")
    if not _is((doc.get("run") or {}).get("cost_model"), _SECTION):
        raise ScenarioError(f"{path}: run.cost_model: {_shown(doc['run']['cost_model'])} is not {_SECTION}")
    return doc


def _is(value: Any, kind: str) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return {_NUMBER: number, _NUMBER_OR_NULL: value is None or number, _TEXT: isinstance(value, str),
            _WHOLE: number and float(value).is_integer() and value >= 0,
            _SECTION: value is None or isinstance(value, dict)}[kind]


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:40] + "..."


# a sweep's results.csv: the columns every sweep writes before its grid keys and metrics
SWEEP_COLUMNS = ("run_id", "scenario", "scenario_sha256", "repeat", "seed", "error")
SWEEP_COUNTS = {"repeat": _COUNT, "seed": _COUNT}
_METRIC = Column(empty=True, low=-math.inf)  # a summary metric, flattened: a finite number, or empty


def check_results(rows: pd.DataFrame, numeric: list[str], path: Path) -> pd.DataFrame:
    """results.csv (read as text where it holds ids) with its columns there, its metric columns
    (`numeric`) finite numbers or empty, repeat and seed whole numbers and each run_id once."""
    lacking = [c for c in SWEEP_COLUMNS if c not in rows.columns]
    if lacking:
        raise ScenarioError(f"{path}: not a sweep results table as servesim writes it (no {lacking[0]} column)")
    check_frame(rows, {**{c: _METRIC for c in numeric}, **SWEEP_COUNTS}, path)
    twice = rows["run_id"].duplicated()
    if twice.any():
        row = int(np.flatnonzero(twice.to_numpy())[0])
        raise ScenarioError(f"{path}: line {row + 2}: run_id {rows['run_id'].iloc[row]} appears twice")
    return rows
