"""Request trace files -> one table, auto-detected or forced (`workload.format`): generic CSV, Azure
LLM trace CSV, Mooncake JSONL, Vidur's trace CSV, a `vllm bench serve --save-result` JSON, or any CSV
with a column mapping (`workload.columns`).

    read_trace(path: Path, fmt=None, columns=None, time_unit="s") -> pd.DataFrame
        columns arrival_s (float64, s; NaN when the file has no arrival times: a vLLM benchmark
        without start_times, whose `attrs` then carry its request_rate and burstiness),
        prompt_tokens, output_tokens, priority (int64), sorted by arrival; Mooncake traces with
        hash_ids also `prefix`

Detection looks at the content, not the extension: a file that is one JSON object with
`input_lens` is a vLLM benchmark result, one whose first character is `{` otherwise JSONL, anything
else a CSV recognised by its header. Every error is a one-line ScenarioError naming
the file and, for a bad value, its line (1-based as an editor counts; a CSV header is line 1).
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from sim.config.checks import MAX_SECONDS, MAX_TOKENS, check_input_file, json_object
from sim.config.errors import ScenarioError

# The three accepted layouts: (arrival column, prompt column, output column) as the file spells them.
GENERIC = ("arrival_s", "prompt_tokens", "output_tokens")      # seconds; optional `priority` column
AZURE = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")      # wall clock '2023-11-16 18:15:46.6805900'
MOONCAKE = ("timestamp", "input_length", "output_length")      # milliseconds; optional `hash_ids`
MOONCAKE_BLOCK_TOKENS = 512  # tokens per Mooncake hash_ids block
VIDUR = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")  # seconds (Vidur's trace generator)
BLIS = ("arrived_at", "prefill_tokens", "decode_tokens")           # seconds (BLIS --workload traces)
# BLIS trace v2's data CSV (its YAML header file is not needed): microsecond clock, server-reported
# prompt length when recorded, a shared-prefix group and length, vllm_priority when set
BLIS_V2 = ("arrival_time_us", "input_tokens", "output_tokens")
VLLM_BENCH = ("input_lens", "output_lens")                      # + start_times, or request_rate
AGENT_SESSIONS = ("session_id", "prompt_tokens", "output_tokens")  # + start_s, tool_s
TOKEN_KEYS = ("tokens", "num_tokens", "token_count")  # a ShareGPT turn's token count, by any of these
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def shown(path: Path) -> str:
    """`path` as the user should read it in a message: relative to the working directory if inside it."""
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def read_trace(path: Path, fmt: str | None = None, columns: dict | None = None,
               time_unit: str = "s", hash_block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> pd.DataFrame:
    """The requests in the trace at `path`, validated, in arrival order (a stable sort keeps ties).
    `fmt` forces a format (FORMATS); `columns` maps arrival / prompt_tokens / output_tokens
    [/ priority] to a CSV's own column names, its arrivals numbers in `time_unit` or timestamps."""
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
    if columns is not None:
        table = _read_mapped(path, name, columns, time_unit, hash_block_tokens)
    elif fmt is not None and TRACE_FORMATS[fmt].detect is not None:  # a whole-file format, forced
        table = _read_whole(TRACE_FORMATS[fmt], path, name, hash_block_tokens)
    elif fmt is None and (found := next((f for f in TRACE_FORMATS.values()
                                         if f.detect is not None and f.detect(path, head)), None)):
        table = _read_whole(found, path, name, hash_block_tokens)
    else:
        table = _read_csv(path, name, fmt, hash_block_tokens)
    if len(table) == 0:
        raise ScenarioError(f"{name}: the trace has no requests")
    arrival = table["arrival_s"].to_numpy()
    if not np.isnan(arrival).all() and not np.all(np.diff(arrival) >= 0):
        attrs = table.attrs
        table = table.sort_values("arrival_s", kind="stable", ignore_index=True)
        table.attrs = attrs
    return table


def _read_whole(f: TraceFormat, path: Path, name: str, hash_block_tokens: int) -> pd.DataFrame:
    return f.read(path, name, hash_block_tokens) if f.block_ids else f.read(path, name)


# vLLM's log line: "INFO 11-24 06:48:39 [file.py:65] message" (its default format; a custom
# format that keeps "LEVEL MM-DD HH:MM:SS[.fff]" before the message reads too), then the
# request logger's two lines (--enable-log-requests; the first only at DEBUG level)
# Read in steps, each a linear scan (one regex with two lazy `.*?` backtracked cubically on a long
# line of repeated fragments: 13 KB took 0.7 s, a 120 KB line minutes): the first time stamp, then
# the first marker after it, then the first field after that.
_LOG_TIME = re.compile(r"(?:DEBUG|INFO|WARNING)\s+(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d(?:[.,]\d+)?)\b")
_LOG_DETAILS = (re.compile(r"Request (\S+) details: "), "prompt_token_ids: ", re.compile(r"\[[^\]]*\]|None"))
_LOG_RECEIVED = (re.compile(r"Received request (\S+): params: \w*Params\("), "max_tokens=", re.compile(r"\d+|None"))


def _log_fields(line: str, parts) -> tuple[str, ...] | None:
    """(month, day, h, m, s, request id, field) of a request-logger line, or None."""
    marker, key, value = parts
    time = _LOG_TIME.search(line)
    if time is None:
        return None
    found = marker.search(line, time.end())
    if found is None:
        return None
    at = line.find(key, found.end())
    if at < 0:
        return None
    field = value.match(line, at + len(key))
    return None if field is None else (*time.groups(), found[1], field[0])


def _is_vllm_log(path: Path) -> bool:
    """A text file with vLLM request-logger lines ("Received request ...: params: SamplingParams")."""
    with open(path, "rb") as f:
        head = f.read(1 << 20)
    return b"Received request " in head and b"SamplingParams(" in head


def _read_vllm_log(path: Path, name: str) -> pd.DataFrame:
    """A vLLM server log (`vllm serve --enable-log-requests`, with `--log-level DEBUG` or
    VLLM_LOGGING_LEVEL=DEBUG): each request's arrival is the time of its "Received request" line
    (vLLM's default format has whole seconds: requests in one second arrive together), its prompt
    the length of the prompt_token_ids its DEBUG "details" line lists, its output the max_tokens of
    its SamplingParams (exact for benchmark traffic with ignore_eos; otherwise an upper bound, as
    the log has no completion lengths). Log dates carry no year: times count from the first line
    and a month that goes backwards starts the next year."""
    import datetime as dt

    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise ScenarioError(f"{name}: cannot read the log ({e.strerror})") from None
    prompts: dict[str, int] = {}
    # (line, request id, month, day, h, m, s, max_tokens)
    rows: list[tuple[int, str, str, str, str, str, str, str]] = []
    for line_no, line in enumerate(text.splitlines(), start=1):
        if "Request " in line and " details: " in line:
            found = _log_fields(line, _LOG_DETAILS)
            if found:
                ids = found[6]
                if ids == "None":
                    raise ScenarioError(f"{name}:{line_no}: request {found[5]} has prompt_token_ids None; "
                                        "its prompt length is not in the log")
                prompts[found[5]] = ids.count(",") + 1 if ids.strip("[] ") else 0
        elif "Received request " in line:
            found = _log_fields(line, _LOG_RECEIVED)
            if found:
                if found[6] != "None" and len(found[6]) > len(str(MAX_TOKENS)):
                    raise ScenarioError(f"{name}:{line_no}: max_tokens of {len(found[6])} digits is more "
                                        f"than {MAX_TOKENS:,} tokens")
                month, day, h, m, sec, rid, max_tokens = found
                rows.append((line_no, rid, month, day, h, m, sec, max_tokens))
    if not rows:
        raise ScenarioError(f"{name}: no 'Received request' lines (start vllm serve with --enable-log-requests)")
    year, last_month, times, prompt, output, lines = 2000, 0, [], [], [], []
    for line_no, rid, month, day, h, m, sec, max_tokens in rows:
        if rid not in prompts:
            raise ScenarioError(f"{name}:{line_no}: request {rid} has no 'details' line with its "
                                "prompt_token_ids; run vllm serve at DEBUG level (--log-level DEBUG or "
                                "VLLM_LOGGING_LEVEL=DEBUG) with --enable-log-requests")
        if max_tokens == "None":
            raise ScenarioError(f"{name}:{line_no}: request {rid} has max_tokens None; its output "
                                "length is not in the log")
        year += int(month) < last_month  # (a log that runs over New Year)
        last_month = int(month)
        whole, _, frac = sec.replace(",", ".").partition(".")
        try:
            stamp = dt.datetime(year, int(month), int(day), int(h), int(m), int(whole), tzinfo=dt.timezone.utc)
        except ValueError:
            raise ScenarioError(f"{name}:{line_no}: '{month}-{day} {h}:{m}:{sec}' is not a valid log time "
                                "(expected MM-DD HH:MM:SS)") from None
        times.append(stamp.timestamp() + (float("0." + frac) if frac else 0.0))
        prompt.append(prompts[rid])
        output.append(int(max_tokens))
        lines.append(line_no)
    seconds = np.asarray(times) - min(times)
    df = pd.DataFrame({"Received request": seconds, "prompt_token_ids": prompt, "max_tokens": output})
    return _table(seconds, df, tuple(df.columns), np.asarray(lines), name)


def _is_bench(path: Path) -> bool:
    """One JSON object with input_lens: a vllm bench serve result (JSONL holds one per line)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False
    return isinstance(doc, dict) and "input_lens" in doc


def _read_bench(path: Path, name: str) -> pd.DataFrame:
    """`vllm bench serve --save-result --save-detailed`: per-request input_lens, output_lens and
    start_times (seconds on the client's clock; made relative to the first). Without start_times
    the arrivals are NaN and attrs carry request_rate and burstiness (build_workload draws them)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ScenarioError(f"{name}: not a valid vllm bench serve JSON ({type(e).__name__})") from None
    if not isinstance(doc, dict) or any(not isinstance(doc.get(k), list) for k in VLLM_BENCH):
        raise ScenarioError(f"{name}: a vllm bench serve result needs the lists input_lens and output_lens "
                            "(run it with --save-result --save-detailed)")
    n = len(doc["input_lens"])
    if len(doc["output_lens"]) != n:
        raise ScenarioError(f"{name}: input_lens has {n} entries but output_lens {len(doc['output_lens'])}")
    df = pd.DataFrame({"input_lens": doc["input_lens"], "output_lens": doc["output_lens"]})
    lines = np.arange(n)  # messages name the entry (0-based index into the lists)
    starts = doc.get("start_times")
    if isinstance(starts, list) and len(starts) == n and n:
        arrival = _seconds(pd.Series(starts), lines, name, "start_times entry", allow_negative=True)
        table = _table(arrival, df, ("start_times", *VLLM_BENCH), lines, name)
    else:
        rate = doc.get("request_rate")
        if isinstance(rate, bool) or (not isinstance(rate, (int, float)) and rate not in ("inf", "Infinity")):
            raise ScenarioError(f"{name}: has no start_times and no request_rate to draw arrivals from")
        rate = float(rate)
        # (inf: all at once, as vllm bench serve sends them; else a rate whose gaps the clock resolves)
        if math.isnan(rate) or not (rate == math.inf or 1e-6 <= rate <= 1e6):
            raise ScenarioError(f"{name}: request_rate {rate:g} is not inf or a rate in [1e-06, 1e+06] req/s")
        burst = doc.get("burstiness", 1.0)
        burst = 1.0 if burst is None else burst
        if isinstance(burst, bool) or not isinstance(burst, (int, float)) or not 1e-3 <= burst <= 1e3:
            raise ScenarioError(f"{name}: burstiness {burst!r} is not a number in [0.001, 1000] (1: Poisson)")
        table = _table(np.full(n, np.nan), df, ("start_times", *VLLM_BENCH), lines, name)
        table.attrs.update(request_rate=rate, burstiness=float(burst))
    for key in ("ttfts", "itls", "errors"):  # measured per request: kept for servesim compare
        if isinstance(doc.get(key), list) and len(doc[key]) == n:
            table.attrs[key] = doc[key]
    return table


def _read_sharegpt(path: Path, name: str) -> pd.DataFrame:
    """ShareGPT-style JSON (a list of {"conversations": [{"from": "human"|"gpt", "value": ...}]})
    whose turns carry token counts (one of TOKEN_KEYS): the prompt is a conversation's first human
    turn, the output the reply after it, as vllm bench serve's ShareGPT loader pairs them. It has no
    arrival times: arrivals are NaN, so it serves as an empirical length distribution
    (`prompt_tokens: {dist: empirical, trace: ...}`), not as a replay."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ScenarioError(f"{name}: not a valid ShareGPT JSON ({type(e).__name__})") from None
    if not isinstance(doc, list):
        raise ScenarioError(f"{name}: a ShareGPT file is a JSON list of conversations")
    prompts, outputs = [], []
    for i, conv in enumerate(doc):
        turns = conv.get("conversations") if isinstance(conv, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue  # vLLM's loader skips these too
        first, reply = turns[0], turns[1]
        counts = [next((t.get(k) for k in TOKEN_KEYS if isinstance(t, dict) and k in t), None) for t in (first, reply)]
        if any(c is None for c in counts):
            raise ScenarioError(f"{name}: conversation {i} has no token counts (a turn needs one of "
                                f"{', '.join(TOKEN_KEYS)}); tokenize it first, e.g. run vllm bench serve on it "
                                "and import that result")
        prompts.append(counts[0])
        outputs.append(counts[1])
    df = pd.DataFrame({"prompt": prompts, "output": outputs})
    return _table(np.full(len(df), np.nan), df, ("", "prompt", "output"), np.arange(len(df)), name)


def _read_mapped(path: Path, name: str, columns: dict, time_unit: str, hash_block_tokens: int) -> pd.DataFrame:
    """Any CSV whose columns `columns` names: arrival (numbers in time_unit, e.g. epoch seconds, or
    ISO 8601 timestamps), prompt_tokens, output_tokens, optionally priority. Arrivals become seconds
    after the earliest."""
    df, lines = _frame(path, name)
    missing = [c for c in columns.values() if c not in df.columns]
    if missing:
        raise ScenarioError(f"{name}: workload.columns names {missing[0]!r}, which the header "
                            f"{','.join(df.columns)!r} does not have")
    col = df[columns["arrival"]]
    numbers = pd.to_numeric(col, errors="coerce")
    if numbers.notna().all():
        values = numbers.to_numpy(dtype=np.float64) * TIME_UNITS[time_unit]
        _check_clock(values, time_unit, name, columns["arrival"])
        arrival = _seconds(pd.Series(values - values.min()), lines, name, columns["arrival"])
    else:
        arrival = _wall_clock(col, lines, name, label=columns["arrival"])
    cols = (columns["arrival"], columns["prompt_tokens"], columns["output_tokens"])
    priority = (_ints(df[columns["priority"]], lines, name, columns["priority"], -np.inf)
                if "priority" in columns else None)
    table = _table(arrival, df, cols, lines, name, priority)
    if "hash_ids" in columns:
        table["prefix"] = _hash_column(df[columns["hash_ids"]], lines, name, columns["hash_ids"], hash_block_tokens)
        _check_prefix_blocks(table, lines, name, columns["hash_ids"])
    return table


# No clock a trace is written in reads past this many seconds: 1e11 s is ~3,170 years after 1970,
# while epoch milliseconds today (~1.8e12) or microseconds read as seconds land far beyond it
_CLOCK_LIMIT_S = 1e11


def _check_clock(seconds: np.ndarray, time_unit: str, name: str, label: str) -> None:
    """Arrivals that, read in `time_unit`, lie thousands of years after 1970 are in a finer unit
    (epoch ms read as s once made a 290 s trace span 290,076 s at 0.01 req/s): refused, with the
    unit they fit."""
    finite = np.abs(seconds[np.isfinite(seconds)])
    largest = float(finite.max()) if len(finite) else 0.0
    if largest < _CLOCK_LIMIT_S:
        return
    units = list(TIME_UNITS)
    raw = largest / TIME_UNITS[time_unit]
    fits = next((u for u in units[units.index(time_unit) + 1:]
                 if raw * TIME_UNITS[u] < _CLOCK_LIMIT_S), units[-1])
    years = largest / (365.25 * 86400)
    raise ScenarioError(f"{name}: {label} {raw:.6g} read in {time_unit} is {years:,.0f} years after 1970, "
                        f"not a clock; epoch {fits}? set workload.time_unit: {fits} (allowed: {', '.join(units)})")


def _refuse_wall_clock(col: pd.Series, lines: np.ndarray, name: str) -> None:
    """arrival_s counts seconds from the trace's start. Times past servesim's bound that span less
    than it are a wall clock (Unix time, or epoch ms): said so, with the mapping that makes a clock
    relative to its first arrival (and reads its unit), instead of "not at most 1e9 s"."""
    values = pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    if not np.isfinite(values).all() or not len(values) or values.max() <= MAX_SECONDS:
        return  # (bad cells and plain spans: _seconds says what is wrong)
    if values.max() - values.min() > MAX_SECONDS and values.max() < _CLOCK_LIMIT_S:
        return  # a span past the bound: _seconds refuses it as one
    i = int(np.argmax(values))
    raise ScenarioError(
        f"{name}:{lines[i]}: arrival_s {values[i]:.15g} looks like a clock time (seconds or ms since 1970), "
        "but arrival_s counts seconds from the trace's start; map the columns instead, which reads a clock "
        "relative to its first arrival: workload.columns: {arrival: arrival_s, prompt_tokens: prompt_tokens, "
        "output_tokens: output_tokens} (and workload.time_unit: ms, us or ns for a finer clock)")


def _hash_column(col: pd.Series, lines: np.ndarray, name: str, label: str, block_tokens: int) -> list:
    """A CSV column of prompt block ids (integers separated by spaces, '|' or ';', each naming
    `block_tokens` tokens, chained as Mooncake's hash_ids are); an empty cell: no shared prefix."""
    out: list = []
    for value, line in zip(col.tolist(), lines.tolist()):
        if value is None or (isinstance(value, float) and np.isnan(value)):
            out.append(None)
            continue
        parts = re.split(r"[\s|;]+", str(value).strip())
        try:
            ids = tuple(int(p) for p in parts if p)
        except ValueError:
            raise ScenarioError(f"{name}:{line}: {label} {value!r} is not block ids (integers separated by "
                                "spaces, '|' or ';')") from None
        out.append((ids, block_tokens) if ids else None)
    return out


def read_lengths(path: Path, column: str) -> np.ndarray:
    """One column of token counts from any CSV (an empirical length distribution's `columns:`):
    int64, each an integer in [1, MAX_TOKENS], else an error naming the file and line."""
    path = Path(path)
    name = shown(path)
    check_input_file(path, "trace", name)
    df, lines = _frame(path, name)
    if column not in df:
        raise ScenarioError(f"{name}: no column {column!r} (the header is {','.join(df.columns)!r})")
    if not len(df):
        raise ScenarioError(f"{name}: no rows to draw lengths from")
    return _ints(df[column], lines, name, column, 1)


TEXT_COLUMNS = ("session_id", "adapter")  # ids: kept as written (sessions, LoRA adapters)


def _frame(path: Path, name: str) -> tuple[pd.DataFrame, np.ndarray]:
    """The CSV as strings-or-numbers, blank lines dropped, with each row's file line."""
    try:
        # skip_blank_lines=False keeps row i on file line i + 2, so messages can name the line;
        # only an empty field counts as missing ('nan' is reported as the bad value it is).
        # ids are text, never numbers: pandas would read 007, 7 and 0007 (or 01, 1 and 1.0) as one
        # low_memory=False: one pass over the whole file, so a column's type is read once (in
        # chunks, a bad cell past the first ~10^5 rows made pandas print a DtypeWarning as well)
        df = pd.read_csv(path, skip_blank_lines=False, skipinitialspace=True, low_memory=False,
                         keep_default_na=False, na_values=[""], dtype=dict.fromkeys(TEXT_COLUMNS, str))
    except pd.errors.ParserError as e:
        raise ScenarioError(f"{name}:{_parser_detail(str(e))}") from None
    except (UnicodeDecodeError, pd.errors.EmptyDataError):
        raise ScenarioError(f"{name}: unknown trace format; expected {ACCEPTED}") from None
    df.columns = [str(c).strip() for c in df.columns]
    lines = np.arange(len(df)) + 2
    blank = df.isna().all(axis=1).to_numpy()
    df, lines = df[~blank].reset_index(drop=True), lines[~blank]
    return df, lines


def _read_csv(path: Path, name: str, fmt: str | None = None,
              hash_block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> pd.DataFrame:
    """A CSV trace: `fmt`'s, or the first of TRACE_FORMATS whose columns its header holds."""
    df, lines = _frame(path, name)
    have = set(df.columns)
    for key, f in TRACE_FORMATS.items():
        if f.detect is None and fmt in (None, key) and set(f.columns) <= have:
            return f.read(df, lines, name, hash_block_tokens)
    header = ",".join(df.columns)
    if fmt is not None:
        raise ScenarioError(f"{name}: workload.format {fmt} needs the columns "
                            f"{','.join(TRACE_FORMATS[fmt].columns)}; the header is {header!r}")
    raise ScenarioError(f"{name}: unknown trace format (header {header!r}); expected {ACCEPTED}")


def _read_generic(df: pd.DataFrame, lines: np.ndarray, name: str, hash_block_tokens: int) -> pd.DataFrame:
    _refuse_wall_clock(df["arrival_s"], lines, name)
    arrival = _seconds(df["arrival_s"], lines, name, "arrival_s")
    priority = _ints(df["priority"], lines, name, "priority", -np.inf) if "priority" in df else None
    table = _table(arrival, df, GENERIC, lines, name, priority)
    if "hash_ids" in df:  # prompt block ids: what prefix caching matches on
        table["prefix"] = _hash_column(df["hash_ids"], lines, name, "hash_ids", hash_block_tokens)
        _check_prefix_blocks(table, lines, name, "hash_ids")
    if "adapter" in df:  # the LoRA adapter each request names (any text; blank: the base model)
        named = df["adapter"].notna().to_numpy()
        codes, names = pd.factorize(df["adapter"].astype(str).where(named))
        table["adapter"] = np.where(named, codes, -1).astype(np.int64)
        table.attrs["adapters"] = [str(n) for n in names]
    return table


def _read_agent_sessions(df: pd.DataFrame, lines: np.ndarray, name: str, _: int = 0) -> pd.DataFrame:
    """An agent's sessions, one row per LLM call, each session's calls in order: session_id, the
    call's whole prompt as sent (prompt_tokens: the session's context so far and the new tokens),
    output_tokens; optional start_s (when the session starts: its first row's, s) and tool_s (how
    long the tool runs after this call before the session's next, s; default 0). No arrival times:
    replayed closed loop, a call sent when its session's previous call has finished and its tool has
    run (sim/workload/sessions.py). `session` numbers the sessions in order of first appearance."""
    ids = df["session_id"]
    missing = ids.isna().to_numpy()
    if missing.any():
        _fail(ids, lines, name, "session_id", ~missing, "a session id")
    prompt = _ints(df["prompt_tokens"], lines, name, "prompt_tokens", 1)
    output = np.maximum(_ints(df["output_tokens"], lines, name, "output_tokens", 0), 1)  # (as _table)
    zeros = np.zeros(len(df))
    tool = _seconds(df["tool_s"].fillna(0), lines, name, "tool_s") if "tool_s" in df else zeros
    session, _ = pd.factorize(ids.astype(str))
    start = zeros
    if "start_s" in df:  # read on each session's first row (later rows may leave it blank)
        first = np.unique(session, return_index=True)[1]
        at = _seconds(df["start_s"].iloc[first].reset_index(drop=True), lines[first], name, "start_s")
        start = at[session]
        # a later row may repeat its session's start or leave it blank; another time there would be
        # read as that call's arrival, which a session's calls do not have (they follow each other)
        given = pd.to_numeric(df["start_s"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        odd = np.flatnonzero(~np.isnan(given) & (given != start))
        if odd.size:
            i = int(odd[0])
            raise ScenarioError(
                f"{name}:{lines[i]}: start_s {given[i]:g} differs from the start of session {str(ids.iloc[i])!r}, "
                f"{start[i]:g} s on line {lines[first[session[i]]]}: start_s is when a session starts, on its "
                "first row; its later calls follow their previous one (plus tool_s). Calls with their own "
                "arrival times are a CSV trace (docs/workload.md)")
    table = pd.DataFrame({"arrival_s": np.full(len(df), np.nan), "prompt_tokens": prompt, "output_tokens": output,
                          "priority": np.zeros(len(df), dtype=np.int64), "session": session.astype(np.int64),
                          "start_s": start, "tool_s": tool})
    table.attrs["agent_sessions"] = True
    return table


def _read_arrived_at(cols: tuple[str, str, str]) -> Callable[..., pd.DataFrame]:
    """Vidur's and BLIS's CSVs: seconds in arrived_at, then their own prompt and output columns."""
    def read(df: pd.DataFrame, lines: np.ndarray, name: str, _: int) -> pd.DataFrame:
        return _table(_seconds(df["arrived_at"], lines, name, "arrived_at"), df, cols, lines, name)
    return read


def _read_azure(df: pd.DataFrame, lines: np.ndarray, name: str, _: int) -> pd.DataFrame:
    return _table(_wall_clock(df["TIMESTAMP"], lines, name), df, AZURE, lines, name)


def _read_blis_v2(df: pd.DataFrame, lines: np.ndarray, name: str, _: int = 0) -> pd.DataFrame:
    """BLIS (inference-sim) trace v2 data: arrival_time_us (microseconds on any clock: made
    relative to the earliest), the prompt as the server counted it (server_input_tokens, when
    recorded, > 0) else input_tokens, output_tokens, vllm_priority when present, and a shared prefix
    per prefix_group: the first prefix_length tokens of every request in a group are the same (one
    system prompt each). Every row is replayed, failed ones (status error / timeout) included: they
    were sent. Session rounds are replayed at their recorded times as they are (no context growth)."""
    # microseconds on any clock (epoch in real traces): relative to the earliest, then seconds
    arrival = _seconds(df["arrival_time_us"], lines, name, "arrival_time_us", unit=1e-6, allow_negative=True) / 1e6
    prompt = df["input_tokens"]
    if "server_input_tokens" in df:
        server = pd.to_numeric(df["server_input_tokens"], errors="coerce")
        prompt = prompt.where(~(server > 0), server)
    frame = pd.DataFrame({"arrival_time_us": arrival, "input_tokens": prompt, "output_tokens": df["output_tokens"]})
    priority = (_ints(df["vllm_priority"], lines, name, "vllm_priority", 0) if "vllm_priority" in df else None)
    table = _table(arrival, frame, tuple(frame.columns), lines, name, priority)
    if "prefix_group" in df and "prefix_length" in df:
        length = _ints(df["prefix_length"].fillna(0), lines, name, "prefix_length", 0)
        groups = df["prefix_group"].tolist()
        shared = [g is not None and not (isinstance(g, float) and np.isnan(g)) and str(g) != "" and n > 0
                  for g, n in zip(groups, length.tolist())]
        if any(shared):  # one unit per group: its system prompt (or the whole prompt, if shorter)
            table["prefix"] = [(((("blis", str(g)),), int(min(n, p))) if ok else None)
                               for g, n, p, ok in zip(groups, length.tolist(), table["prompt_tokens"].tolist(), shared)]
    return table


def blis_v2_timings(path: Path) -> tuple[pd.DataFrame, int]:
    """What a BLIS trace v2 measured, for `servesim compare`: the requests with status ok, each
    one's send_time_us, first_chunk_time_us and last_chunk_time_us in seconds (microseconds on any
    clock, so not made relative) and output_tokens, checked as the trace reader checks its own
    columns (a bad cell is one error naming the file's line); with the count of rows not ok."""
    name = shown(path)
    df, lines = _frame(path, name)
    ok = (df["status"].astype(str).str.strip() == "ok").to_numpy()
    df, lines = df[ok].reset_index(drop=True), lines[ok]
    times = {}
    for c in ("send_time_us", "first_chunk_time_us", "last_chunk_time_us"):
        us = pd.to_numeric(df[c], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        good = np.isfinite(us) & (us >= 0)
        if not good.all():
            _fail(df[c], lines, name, c, good, "a non-negative number (microseconds)")
        times[c] = us
    origin = times["send_time_us"].min() if len(df) else 0.0  # epoch us in real traces: exact in float64
    times = {c: (us - origin) / 1e6 for c, us in times.items()}
    for before, after in (("send_time_us", "first_chunk_time_us"), ("first_chunk_time_us", "last_chunk_time_us")):
        order = times[after] >= times[before]
        if not order.all():
            _fail(df[after], lines, name, after, order, f"at or after {before} (a request ok)")
    frame = pd.DataFrame({**times, "output_tokens": _ints(df["output_tokens"], lines, name, "output_tokens", 0)})
    return frame, int((~ok).sum())


def _parser_detail(message: str) -> str:
    """pandas' "... Expected 3 fields in line 7, saw 4" (file lines) -> "7: expected 3 fields, saw 4"."""
    found = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", message)
    if found:
        return f"{found[2]}: expected {found[1]} fields, saw {found[3]}"
    return f" not a valid CSV ({message.strip().splitlines()[-1]})"


def _read_jsonl(path: Path, name: str, hash_block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> pd.DataFrame:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ScenarioError(f"{name}: unknown trace format; expected {ACCEPTED}") from None
    rows = text.splitlines()
    kept = [i for i, row in enumerate(rows) if row.strip()]
    try:  # one C-speed parse of the whole file; the per-line loop below only runs to find an error
        records = json.loads("[" + ",".join(rows[i] for i in kept) + "]")
    except (ValueError, RecursionError):  # (ValueError: bad JSON, or an int of 4300+ digits)
        records = []
    if len(records) != len(kept) or not all(isinstance(r, dict) for r in records):
        records = [_json_object(rows[i], i + 1, name) for i in kept]
    df = pd.DataFrame(records, columns=list(MOONCAKE))
    lines = np.asarray(kept, dtype=np.int64) + 1
    arrival = _seconds(df["timestamp"], lines, name, "timestamp", unit=1e-3) / 1000.0  # ms -> s
    table = _table(arrival, df, MOONCAKE, lines, name)
    ids = [r.get("hash_ids") for r in records]
    if any(v is not None for v in ids):  # each id workload.hash_block_tokens tokens (Mooncake's: 512)
        table["prefix"] = [_hash_ids(v, line, name, hash_block_tokens) for v, line in zip(ids, lines.tolist())]
        _check_prefix_blocks(table, lines, name, "hash_ids")
    return table


def _check_prefix_blocks(table: pd.DataFrame, lines: np.ndarray, name: str, label: str) -> None:
    """A request's block ids name its prompt's blocks (Mooncake's: exactly ceil(prompt / 512)); more
    ids than the prompt has blocks cannot be right, and a cell of a million of them only ran the
    machine out of memory later: refused, naming the line."""
    prompt = table["prompt_tokens"].to_numpy()
    for i, p in enumerate(table["prefix"].tolist()):
        if p is None:
            continue
        ids, block_tokens = p
        most = -(-int(prompt[i]) // block_tokens)
        if len(ids) > most:
            raise ScenarioError(f"{name}:{lines[i]}: {label} names {len(ids):,} blocks of {block_tokens} tokens, "
                                f"more than its {int(prompt[i]):,}-token prompt has ({most})")


def _hash_ids(value, line: int, name: str, block_tokens: int = MOONCAKE_BLOCK_TOKENS):
    """Mooncake's `hash_ids`: one chained id per block of the prompt (512 tokens in Mooncake's
    traces; the prefix identity prefix caching matches on), as (ids, block_tokens); None when absent."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ScenarioError(f"{name}:{line}: hash_ids is not a list of integers")
    return (tuple(value), block_tokens)


def _json_object(row: str, line: int, name: str) -> dict:
    return json_object(row, f"{name}:{line}", "a request record",
                       f"a JSON object with keys {', '.join(MOONCAKE)}")


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
        what = {1.0: "a positive integer", 0.0: "a non-negative integer"}.get(lo, "an integer")
        _fail(col, lines, name, label, ok, what)
    ok = values <= MAX_TOKENS
    if not ok.all():
        _fail(col, lines, name, label, ok, f"at most {MAX_TOKENS} tokens, the most servesim accepts")
    return values.astype(np.int64)


def _seconds(col: pd.Series, lines: np.ndarray, name: str, label: str, unit: float = 1.0,
             allow_negative: bool = False) -> np.ndarray:
    """`col` as float64 with every value finite, >= 0 and at most MAX_SECONDS (in the file's own
    time unit: `unit` seconds); allow_negative: a clock whose origin is arbitrary (made relative to
    its earliest value)."""
    values = pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    if allow_negative and np.isfinite(values).all():
        values = values - values.min()
    ok = np.isfinite(values) & (values >= 0)
    if not ok.all():
        _fail(col, lines, name, label, ok, "a non-negative number")
    ok = values * unit <= MAX_SECONDS
    if not ok.all():
        _fail(col, lines, name, label, ok, f"at most {MAX_SECONDS:g} s, the longest span servesim accepts")
    return values


def _wall_clock(col: pd.Series, lines: np.ndarray, name: str, label: str = "TIMESTAMP") -> np.ndarray:
    """Azure timestamps -> seconds after the earliest one (float64; 7 fractional digits = 100 ns)."""
    try:
        stamps = pd.to_datetime(col, format="ISO8601", errors="coerce")
    except (ValueError, TypeError) as e:  # e.g. timestamps in several time zones
        raise ScenarioError(f"{name}: {label}: cannot be read as one clock ({str(e).splitlines()[0]}); "
                            f"write every timestamp in one time zone") from None
    ok = stamps.notna().to_numpy()
    if not ok.all():
        _fail(col, lines, name, label, ok, "a timestamp like '2023-11-16 18:15:46.6805900'")
    offsets_ns = (stamps - stamps.min()).to_numpy().astype("timedelta64[ns]").astype(np.int64)
    offsets = offsets_ns / 1e9
    ok = offsets <= MAX_SECONDS
    if not ok.all():
        _fail(col, lines, name, label, ok, f"within {MAX_SECONDS:g} s of the earliest")
    return offsets  # integer ns / 1e9 rounds once, so 4.314579 s reads back as 4.314579


def _fail(col: pd.Series, lines: np.ndarray, name: str, label: str, ok: np.ndarray, what: str):
    i = int(np.argmin(ok))  # the first False
    raw = col.iloc[i]
    if raw is None or raw is pd.NA or (isinstance(raw, float) and np.isnan(raw)):
        raise ScenarioError(f"{name}:{lines[i]}: {label} is missing (expected {what})")
    raise ScenarioError(f"{name}:{lines[i]}: {label} {str(raw)!r} is not {what}")


class TraceFormat(NamedTuple):
    """One entry of TRACE_FORMATS: how a kind of trace file is recognised and read.

    A whole-file format has `detect(path, head)` (head: the file's first bytes, leading blanks
    dropped) and `read(path, name)` (with `block_ids`: `read(path, name, hash_block_tokens)`, its
    block ids each that many tokens); a CSV format has the header `columns` that identify it and
    `read(frame, lines, name, hash_block_tokens)` over the parsed CSV (lines: each row's file line).
    Either returns the table read_trace documents."""
    read: Callable[..., pd.DataFrame]
    detect: Callable[[Path, bytes], bool] | None = None
    columns: tuple[str, ...] = ()
    accepted: str = ""  # how an "unknown trace format" message names it
    block_ids: bool = False  # a whole-file format whose prefix block ids take workload.hash_block_tokens


# workload.format's names. Detection tries the whole-file formats first, then the CSVs, each in
# this order. Adding a format: its reader (here or in a module of its own) and one line here.
TRACE_FORMATS: dict[str, TraceFormat] = {
    "generic": TraceFormat(_read_generic, None, GENERIC, "CSV header arrival_s,prompt_tokens,output_tokens[,priority]"),
    "azure": TraceFormat(_read_azure, None, AZURE, "Azure CSV header TIMESTAMP,ContextTokens,GeneratedTokens"),
    "vidur": TraceFormat(_read_arrived_at(VIDUR), None, VIDUR,
                         "Vidur CSV header arrived_at,num_prefill_tokens,num_decode_tokens"),
    "blis": TraceFormat(_read_arrived_at(BLIS), None, BLIS, "BLIS CSV header arrived_at,prefill_tokens,decode_tokens"),
    "blis_v2": TraceFormat(_read_blis_v2, None, BLIS_V2,
                           "BLIS trace v2 CSV with arrival_time_us,input_tokens,output_tokens"),
    "vllm_log": TraceFormat(_read_vllm_log, lambda path, head: _is_vllm_log(path), (),
                            "a vLLM server log with --enable-log-requests at DEBUG level"),
    "sharegpt": TraceFormat(_read_sharegpt, lambda path, head: head.startswith(b"["), (),
                            "a ShareGPT JSON list whose turns carry token counts"),
    "vllm_bench": TraceFormat(_read_bench, lambda path, head: head.startswith(b"{") and _is_bench(path), (),
                              "a vllm bench serve result JSON with input_lens and output_lens"),
    "mooncake": TraceFormat(_read_jsonl, lambda path, head: head.startswith(b"{"), (),
                            "Mooncake JSONL with keys timestamp,input_length,output_length", block_ids=True),
    "agent_sessions": TraceFormat(_read_agent_sessions, None, AGENT_SESSIONS,
                                  "agent sessions CSV header session_id,prompt_tokens,output_tokens[,start_s,tool_s]"),
}
FORMATS = tuple(TRACE_FORMATS)
ACCEPTED = (", ".join(f.accepted for f in TRACE_FORMATS.values())
            + "; any other CSV with workload.columns (docs/workload.md)")
