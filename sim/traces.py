"""Request trace files -> one table: generic CSV, Azure LLM trace CSV or Mooncake JSONL, auto-detected.

    read_trace(path: Path) -> pd.DataFrame   columns arrival_s (float64, s), prompt_tokens,
                                             output_tokens, priority (int64), sorted by arrival;
                                             Mooncake traces with hash_ids also `prefix`

Detection looks at the content, not the extension: a file whose first character is `{` is JSONL,
anything else is a CSV recognised by its header. Every error is a one-line ScenarioError naming
the file and, for a bad value, its line (1-based as an editor counts; a CSV header is line 1).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd

from .checks import MAX_SECONDS, MAX_TOKENS, check_input_file
from .errors import ScenarioError

# The three accepted layouts: (arrival column, prompt column, output column) as the file spells them.
GENERIC = ("arrival_s", "prompt_tokens", "output_tokens")      # seconds; optional `priority` column
AZURE = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")      # wall clock '2023-11-16 18:15:46.6805900'
MOONCAKE = ("timestamp", "input_length", "output_length")      # milliseconds; optional `hash_ids`
MOONCAKE_BLOCK_TOKENS = 512  # tokens per Mooncake hash_ids block
ACCEPTED = ("CSV header arrival_s,prompt_tokens,output_tokens[,priority], "
            "Azure CSV header TIMESTAMP,ContextTokens,GeneratedTokens, "
            "or Mooncake JSONL with keys timestamp,input_length,output_length")


def shown(path: Path) -> str:
    """`path` as the user should read it in a message: relative to the working directory if inside it."""
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def read_trace(path: Path) -> pd.DataFrame:
    """The requests in the trace at `path`, validated, in arrival order (a stable sort keeps ties)."""
    path = Path(path)
    name = shown(path)
    check_input_file(path, "trace", name)
    try:
        with open(path, "rb") as f:
            head = f.read(4096).lstrip()
    except OSError as e:
        raise ScenarioError(f"{name}: cannot read the trace ({e.strerror})") from None
    if not head:
        raise ScenarioError(f"{name}: the trace is empty")
    table = _read_jsonl(path, name) if head.startswith(b"{") else _read_csv(path, name)
    if len(table) == 0:
        raise ScenarioError(f"{name}: the trace has no requests")
    if not np.all(np.diff(table["arrival_s"].to_numpy()) >= 0):
        table = table.sort_values("arrival_s", kind="stable", ignore_index=True)
    return table


def _read_csv(path: Path, name: str) -> pd.DataFrame:
    try:
        # skip_blank_lines=False keeps row i on file line i + 2, so messages can name the line;
        # only an empty field counts as missing ('nan' is reported as the bad value it is).
        df = pd.read_csv(path, skip_blank_lines=False, skipinitialspace=True,
                         keep_default_na=False, na_values=[""])
    except pd.errors.ParserError as e:
        raise ScenarioError(f"{name}:{_parser_detail(str(e))}") from None
    except (UnicodeDecodeError, pd.errors.EmptyDataError):
        raise ScenarioError(f"{name}: unknown trace format; expected {ACCEPTED}") from None
    df.columns = [str(c).strip() for c in df.columns]
    lines = np.arange(len(df)) + 2
    blank = df.isna().all(axis=1).to_numpy()
    df, lines = df[~blank].reset_index(drop=True), lines[~blank]
    if set(GENERIC) <= set(df.columns):
        arrival = _seconds(df["arrival_s"], lines, name, "arrival_s")
        priority = _ints(df["priority"], lines, name, "priority", -np.inf) if "priority" in df else None
        return _table(arrival, df, GENERIC, lines, name, priority)
    if set(AZURE) <= set(df.columns):
        return _table(_wall_clock(df["TIMESTAMP"], lines, name), df, AZURE, lines, name)
    header = ",".join(df.columns)
    raise ScenarioError(f"{name}: unknown trace format (header {header!r}); expected {ACCEPTED}")


def _parser_detail(message: str) -> str:
    """pandas' "... Expected 3 fields in line 7, saw 4" (file lines) -> "7: expected 3 fields, saw 4"."""
    found = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", message)
    if found:
        return f"{found[2]}: expected {found[1]} fields, saw {found[3]}"
    return f" not a valid CSV ({message.strip().splitlines()[-1]})"


def _read_jsonl(path: Path, name: str) -> pd.DataFrame:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ScenarioError(f"{name}: unknown trace format; expected {ACCEPTED}") from None
    rows = text.splitlines()
    kept = [i for i, row in enumerate(rows) if row.strip()]
    try:  # one C-speed parse of the whole file; the per-line loop below only runs to find an error
        records = json.loads("[" + ",".join(rows[i] for i in kept) + "]")
    except (json.JSONDecodeError, RecursionError):
        records = []
    if len(records) != len(kept) or not all(isinstance(r, dict) for r in records):
        records = [_json_object(rows[i], i + 1, name) for i in kept]
    df = pd.DataFrame(records, columns=list(MOONCAKE))
    lines = np.asarray(kept, dtype=np.int64) + 1
    arrival = _seconds(df["timestamp"], lines, name, "timestamp", unit=1e-3) / 1000.0  # ms -> s
    table = _table(arrival, df, MOONCAKE, lines, name)
    ids = [r.get("hash_ids") for r in records]
    if any(v is not None for v in ids):
        table["prefix"] = [_hash_ids(v, line, name) for v, line in zip(ids, lines.tolist())]
    return table


def _hash_ids(value, line: int, name: str):
    """Mooncake's `hash_ids`: one chained id per 512-token block of the prompt (the prefix identity
    prefix caching matches on), as (ids, MOONCAKE_BLOCK_TOKENS); None when absent."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ScenarioError(f"{name}:{line}: hash_ids is not a list of integers")
    return (tuple(value), MOONCAKE_BLOCK_TOKENS)


def _json_object(row: str, line: int, name: str) -> dict:
    try:
        record = json.loads(row)
    except json.JSONDecodeError as e:
        raise ScenarioError(f"{name}:{line}: not valid JSON ({e.msg})") from None
    except RecursionError:
        raise ScenarioError(f"{name}:{line}: nested too deeply to be a request record") from None
    if not isinstance(record, dict):
        raise ScenarioError(f"{name}:{line}: expected a JSON object with keys {', '.join(MOONCAKE)}")
    return record


def _table(arrival: np.ndarray, df: pd.DataFrame, cols: tuple[str, str, str], lines: np.ndarray,
           name: str, priority: np.ndarray | None = None) -> pd.DataFrame:
    prompt = _ints(df[cols[1]], lines, name, cols[1], 1)
    # Output 0 happens in real traces (a request that produced nothing, e.g. stopped or failed). Its
    # prefill was still served, and the prefill step emits the first token, so 1 is the closest
    # servable request: prompt load and arrival pattern kept, no decode iterations.
    output = np.maximum(_ints(df[cols[2]], lines, name, cols[2], 0), 1)
    if priority is None:
        priority = np.zeros(len(df), dtype=np.int64)
    return pd.DataFrame({"arrival_s": arrival, "prompt_tokens": prompt,
                         "output_tokens": output, "priority": priority})


def _ints(col: pd.Series, lines: np.ndarray, name: str, label: str, lo: float) -> np.ndarray:
    """`col` as int64 with every value an integer in [lo, MAX_TOKENS], else an error naming the
    first bad line (so nothing overflows int64 or hangs the scheduler)."""
    values = pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    ok = np.isfinite(values) & (values == np.floor(values)) & (values >= lo)
    if not ok.all():
        what = {1: "a positive integer", 0: "a non-negative integer"}.get(lo, "an integer")
        _fail(col, lines, name, label, ok, what)
    ok = values <= MAX_TOKENS
    if not ok.all():
        _fail(col, lines, name, label, ok, f"at most {MAX_TOKENS} tokens, the most servesim accepts")
    return values.astype(np.int64)


def _seconds(col: pd.Series, lines: np.ndarray, name: str, label: str, unit: float = 1.0) -> np.ndarray:
    """`col` as float64 with every value finite, >= 0 and at most MAX_SECONDS (in the file's own
    time unit: `unit` seconds)."""
    values = pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    ok = np.isfinite(values) & (values >= 0)
    if not ok.all():
        _fail(col, lines, name, label, ok, "a non-negative number")
    ok = values * unit <= MAX_SECONDS
    if not ok.all():
        _fail(col, lines, name, label, ok, f"at most {MAX_SECONDS:g} s, the longest span servesim accepts")
    return values


def _wall_clock(col: pd.Series, lines: np.ndarray, name: str) -> np.ndarray:
    """Azure timestamps -> seconds after the earliest one (float64; 7 fractional digits = 100 ns)."""
    try:
        stamps = pd.to_datetime(col, format="ISO8601", errors="coerce")
    except (ValueError, TypeError) as e:  # e.g. timestamps in several time zones
        raise ScenarioError(f"{name}: TIMESTAMP: cannot be read as one clock ({str(e).splitlines()[0]}); "
                            f"write every timestamp in one time zone") from None
    ok = stamps.notna().to_numpy()
    if not ok.all():
        _fail(col, lines, name, "TIMESTAMP", ok, "a timestamp like '2023-11-16 18:15:46.6805900'")
    offsets_ns = (stamps - stamps.min()).to_numpy().astype("timedelta64[ns]").astype(np.int64)
    offsets = offsets_ns / 1e9
    ok = offsets <= MAX_SECONDS
    if not ok.all():
        _fail(col, lines, name, "TIMESTAMP", ok, f"within {MAX_SECONDS:g} s of the earliest")
    return offsets  # integer ns / 1e9 rounds once, so 4.314579 s reads back as 4.314579


def _fail(col: pd.Series, lines: np.ndarray, name: str, label: str, ok: np.ndarray, what: str):
    i = int(np.argmin(ok))  # the first False
    raw = col.iloc[i]
    if raw is None or raw is pd.NA or (isinstance(raw, float) and np.isnan(raw)):
        raise ScenarioError(f"{name}:{lines[i]}: {label} is missing (expected {what})")
    raise ScenarioError(f"{name}:{lines[i]}: {label} {str(raw)!r} is not {what}")
