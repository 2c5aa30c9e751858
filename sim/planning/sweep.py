"""Parameter sweeps: the cartesian product of --grid values, one simulation per point and seed,
one row per run in DIR/results.csv.

    grid = parse_grid(["engine.max_num_seqs=64,128", "workload.arrival.rate=2,4"])
    result = run_sweep("scenarios/quickstart.yaml", grid, "runs/sweep", repeats=2)
    result.rows   # DataFrame: run_id, scenario, <grid keys>, repeat, seed, error, ttft_ms.p99, ...

Every point is validated (sim.scenario) before any run starts. A run's id hashes the scenario name,
its overrides (the fixed --set ones in order, then the grid's sorted by key) and its seed. Rows are
appended and fsynced as runs finish, so an interrupted sweep loses only the runs in flight; a rerun
into the same folder repairs a half-written last line and skips the ids already in the table.
A run that the simulator refuses (e.g. a request that cannot fit in the KV cache at that point) is
a result, not a crash: its row has the message in `error` and no metrics.
"""
from __future__ import annotations

import csv
import hashlib
import io
import itertools
import json
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from sim.config.checks import _int, check_out_dir
from sim.config.errors import ScenarioError
from sim.files import folder_lock, write_file
from sim.outputs import SWEEP_COLUMNS, check_results
from sim.planning.parallel import run_parallel
from sim.scenario import Scenario, load_scenario

RESULTS = "results.csv"  # run_id, scenario, scenario_sha256, <grid keys>, repeat, seed, error, metrics


@dataclass(frozen=True)
class SweepRun:
    """One simulation of a sweep: a grid point and one of its repeats."""

    run_id: str
    params: dict[str, Any]  # grid key -> value of this point
    repeat: int             # 0 .. repeats-1
    scenario: Scenario      # validated, with the point's overrides and seed applied


@dataclass
class SweepResult:
    path: Path              # DIR/results.csv
    rows: Any               # pandas DataFrame: this sweep's rows in grid order (done before or now)
    ran: int                # runs simulated by this call
    skipped: int            # runs found already done in the table


def parse_grid(items: Iterable[str]) -> dict[str, list]:
    """["k=v1,v2", ...] -> {"k": [v1, v2]}. Values are YAML, read as one flow list `[v1,v2]`, so
    quoted strings and {mappings} may hold commas."""
    grid: dict[str, list] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key, text = key.strip(), text.strip()
        if not sep or not all(p.strip() for p in key.split(".")):
            raise ScenarioError(f"--grid {item}: expected KEY=V1,V2,... with a dotted key, "
                                "e.g. --grid engine.max_num_seqs=64,128")
        if key in grid:
            raise ScenarioError(f"--grid {key}: given twice; list all its values in one --grid {key}=V1,V2")
        if key == "seed":
            raise ScenarioError("--grid seed: vary seeds with --seed and --repeats instead")
        if not text:
            raise ScenarioError(f"--grid {key}: empty list of values; expected --grid {key}=V1,V2,...")
        try:
            values = yaml.safe_load(f"[{text}]")
        except (yaml.YAMLError, ValueError, RecursionError):  # (ValueError: an int of 4300+ digits)
            values = None
        if not isinstance(values, list) or text.startswith(",") or text.endswith(","):
            shown = repr(text) if len(text) <= 80 else f"{text[:40]!r}... ({len(text)} characters)"
            raise ScenarioError(f"--grid {key}: {shown} is not a comma-separated list of YAML values "
                                "(empty values are not allowed)")
        texts = [yaml_text(v) for v in values]
        dup = next((t for i, t in enumerate(texts) if t in texts[:i]), None)
        if dup is not None:
            raise ScenarioError(f"--grid {key}: value {dup} is listed twice")
        clash = next((k for k in grid if k.startswith(key + ".") or key.startswith(k + ".")), None)
        if clash is not None:
            raise ScenarioError(f"--grid {key}: overlaps --grid {clash}; vary one or the other")
        grid[key] = values
    return grid


def yaml_text(value: Any) -> str:
    """One-line YAML for a value, as --set reads it back: 16, chunked, 'yes', {profile: p.yaml}."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 30).strip()
    return text[:-3].rstrip() if text.endswith("\n...") else text


MAX_SWEEP_RUNS = 10_000  # runs in one sweep without --force (each is a whole simulation)


def plan_sweep(scenario: str | Path, grid: Mapping[str, list], *, sets: Sequence[str] = (),
               seed: int | None = None, repeats: int = 1,
               force: bool = False) -> tuple[Scenario, list[SweepRun]]:
    """Validate every point and return the base scenario (the file with --set and --seed) and the
    runs in grid order (first key outermost, repeats innermost). Raises ScenarioError naming --set,
    --seed, --repeats or --grid KEY."""
    _int(repeats, "--repeats", lo=1, cap=MAX_SWEEP_RUNS)
    if not grid:
        raise ScenarioError("--grid: give at least one, e.g. --grid engine.max_num_seqs=64,128")
    points = math.prod(len(v) for v in grid.values())
    if points * repeats > MAX_SWEEP_RUNS and not force:  # said before any point is validated
        raise ScenarioError(f"--grid: {points} points x {repeats} repeats = {points * repeats} runs, "
                            f"more than the {MAX_SWEEP_RUNS} a sweep takes; split it, or pass "
                            f"--force to run them anyway")
    base = load_scenario(scenario, overrides=sets, seed=seed)
    canon_sets = [_canonical(s) for s in sets]
    runs = []
    for combo in itertools.product(*grid.values()):
        params = dict(zip(grid, combo))
        sc = _load_point(scenario, sets, params, base.seed)
        overrides = canon_sets + sorted(f"{k}={yaml_text(v)}" for k, v in params.items())
        for r in range(repeats):
            s = base.seed + r
            digest = hashlib.sha256(json.dumps([base.name, overrides, s]).encode()).hexdigest()[:12]
            runs.append(SweepRun(digest, params, r, replace(sc, seed=s)))
    return base, runs


def _canonical(item: str) -> str:
    key, _, text = item.partition("=")
    return f"{key.strip()}={yaml_text(yaml.safe_load(text) if text.strip() else None)}"


def _load_point(scenario, sets: Sequence[str], params: Mapping[str, Any], seed: int) -> Scenario:
    try:
        return load_scenario(scenario, overrides=[*sets, *(f"{k}={yaml_text(v)}" for k, v in params.items())],
                             seed=seed)
    except ScenarioError as e:
        msg = str(e)
        for key in params:  # config says "--set KEY" (or a parent path of it) for what the grid set
            msg = msg.replace(f"--set {key}", f"--grid {key}")
            for parent in itertools.accumulate(key.split("."), lambda a, b: f"{a}.{b}"):
                msg = msg.replace(f"--set {parent}:", f"--grid {parent}:")
        if "--grid" not in msg:
            point = ", ".join(f"{k}={yaml_text(v)}" for k, v in params.items())
            msg = f"--grid point {point}: {msg}"
        raise ScenarioError(msg) from None


def run_sweep(scenario: str | Path, grid: Mapping[str, list], out_dir: str | Path, *,
              sets: Sequence[str] = (), seed: int | None = None, repeats: int = 1,
              workers: int | None = None, cluster: str | None = None,
              progress: Callable[[int, int], None] | None = None, force: bool = False) -> SweepResult:
    """Run every point of `grid` not already in out_dir/results.csv; see the module docstring.
    `progress(done, total)` is called before the first run and after each one."""
    if workers is not None and (isinstance(workers, bool) or workers < 1):
        raise ScenarioError(f"--workers: {workers!r} is not an integer >= 1")
    if workers is not None and cluster is not None:
        raise ScenarioError("--workers: not used with --cluster (the cluster's workers run the sweep)")
    base, runs = plan_sweep(scenario, grid, sets=sets, seed=seed, repeats=repeats, force=force)
    out_dir = Path(out_dir)
    check_out_dir(out_dir)
    name = base.name  # the file's, even if --grid name=... renames runs
    sha = hashlib.sha256(Path(scenario).read_bytes()).hexdigest()[:12]
    out_dir.mkdir(parents=True, exist_ok=True)
    with folder_lock(out_dir, "sweep"):  # one writer per folder: a second sweep into it is refused
        table = ResultsTable(out_dir / RESULTS)
        lacking = [c for c in SWEEP_COLUMNS if table.columns and c not in table.columns]  # (sim/outputs.py)
        if lacking:
            raise ScenarioError(f"--out {out_dir}: {RESULTS} is not a sweep results table (no {lacking[0]} column); "
                                "use another --out")
        stale = next((r for r in table.rows
                      if r.get("scenario") == name and r.get("scenario_sha256") != sha), None)
        if stale is not None:
            raise ScenarioError(f"--out {out_dir}: {RESULTS} holds runs of another version of scenario "
                                f"{name!r} (scenario_sha256 {stale['scenario_sha256']}, {scenario} is now "
                                f"{sha}); use a new --out")
        done = {r["run_id"] for r in table.rows}
        todo = [r for r in runs if r.run_id not in done]
        if progress is not None:
            progress(len(runs) - len(todo), len(runs))
        results = run_parallel(_simulate, [(r.scenario,) for r in todo], workers=workers, cluster=cluster)
        for n, (i, summary) in enumerate(results if todo else (), 1):
            run = todo[i]
            if "error" not in summary:
                _write_json(out_dir / "runs" / run.run_id / "summary.json", summary)
            row = {"run_id": run.run_id, "scenario": name, "scenario_sha256": sha,
                   **{k: yaml_text(v) for k, v in run.params.items()},
                   "repeat": run.repeat, "seed": run.scenario.seed, "error": summary.pop("error", "")}
            summary.pop("scenario", None)
            fleet = summary.get("autoscaling")
            if isinstance(fleet, dict):  # a row per run: its fleet's totals; each change stays in its summary.json
                summary["autoscaling"] = {k: v for k, v in fleet.items() if k not in ("events", "spans")}
            table.append({**row, **flatten(summary)})
            if progress is not None:
                progress(len(runs) - len(todo) + n, len(runs))
        rows = read_results(table.path)
        order = {r.run_id: i for i, r in enumerate(runs)}
        rows = rows[rows["run_id"].isin(order)].sort_values("run_id", key=lambda s: s.map(order))
        return SweepResult(table.path, rows.reset_index(drop=True), len(todo), len(runs) - len(todo))


def _simulate(sc: Scenario) -> dict:
    """One run, on a worker: summary.json's dict, or {"error": message} for a refused scenario."""
    from sim.simulate import simulate

    try:
        return simulate(sc).summary
    except ScenarioError as e:
        return {"error": str(e)}


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"ttft_ms": {"p99": 1.0}} -> {"ttft_ms.p99": 1.0}."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def read_results(path: str | Path):
    """results.csv as a DataFrame, floats read back exactly as str() wrote them."""
    import pandas as pd

    exact = {"float_precision": "round_trip"} if int(pd.__version__.split(".")[0]) < 3 else {}  # 3: default
    try:
        rows = pd.read_csv(path, dtype={"run_id": str, "scenario": str, "scenario_sha256": str, "error": str},
                           keep_default_na=False, na_values=["", "nan"], low_memory=False, **exact)  # `null` stays
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError) as e:
        raise ScenarioError(f"{path}: unreadable sweep results ({str(e).splitlines()[0][:120]})") from None
    if "error" not in rows or "run_id" not in rows:
        raise ScenarioError(f"{path}: not a sweep results table (no run_id and error columns)")
    rows["error"] = rows["error"].fillna("")
    # (sim/outputs.py: the columns every sweep writes, its metrics finite numbers or empty, one row a run)
    return check_results(rows, [c for c in rows.columns if c.startswith(NUMERIC_RESULTS)], Path(path))


# results.csv columns (prefixes) that hold numbers: summary.json's metrics, flattened
NUMERIC_RESULTS = ("ttft_ms.", "tpot_ms.", "itl_ms.", "e2el_ms.", "queue_ms.", "request_throughput",
                   "output_throughput", "total_token_throughput", "goodput.", "completed", "duration_s",
                   "iterations", "preemptions", "repeat", "seed", "kv_", "mbu", "mfu")


class ResultsTable:
    """A CSV file that gains one fsynced row per finished run. Opening it drops a half-written last
    line (a kill mid-write) and any row whose field count is wrong. A row with a new column rewrites
    the file (atomically) with the wider header; cells missing from a row stay empty."""

    def __init__(self, path: Path):
        self.path, self.columns, self.rows = Path(path), [], []
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if not data.endswith(b"\n"):
            data = data[:data.rfind(b"\n") + 1]
        lines = list(csv.reader(io.StringIO(data.decode("utf-8", errors="replace"))))
        if not lines:  # empty, or killed while writing the header
            self.path.unlink()
            return
        if "run_id" not in lines[0]:
            raise ScenarioError(f"--out {self.path.parent}: {self.path.name} is not a sweep results table "
                                "(no run_id column); use another --out")
        self.columns = lines[0]
        self.rows = [dict(zip(self.columns, r)) for r in lines[1:] if len(r) == len(self.columns)]
        if data != self.path.read_bytes() or len(self.rows) != len(lines) - 1:
            self._rewrite()

    def append(self, row: Mapping[str, Any]) -> None:
        row = {k: _cell(v) for k, v in row.items()}
        new = [k for k in row if k not in self.columns]
        self.rows.append(row)
        if new or not self.path.exists() or self.path.is_symlink():  # (a planted link: replaced)
            self.columns += new
            self._rewrite()
            return
        # appended in place, never through a link (O_NOFOLLOW)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
        with os.fdopen(fd, "a", encoding="utf-8", newline="") as f:
            f.write(self._lines([row]))
            f.flush()
            os.fsync(f.fileno())

    def _lines(self, rows: Iterable[Mapping[str, str]], header: bool = False) -> str:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        if header:
            w.writerow(self.columns)
        w.writerows([r.get(c, "") for c in self.columns] for r in rows)
        return buf.getvalue()

    def _rewrite(self) -> None:
        write_file(self.path, self._lines(self.rows, header=True))


# a spreadsheet runs a cell that starts with one of these as a formula (CSV injection): such a text
# cell (a trace named =2+5.csv) is written with a leading apostrophe, which spreadsheets show as
# text (docs/sweep.md); numbers (-1.5) are written as they are
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _cell(v: Any) -> str:
    if v is None:
        return ""
    text = str(v)  # str(float) is repr: reads back to the same float
    if isinstance(v, str) and text.startswith(FORMULA_STARTS + ("'",)) and not _is_number(text):
        return "'" + text
    return text


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, json.dumps(obj, indent=2) + "\n")
