"""Reading runs back and deriving what the figures need: which batch slot each request held at each
iteration, summaries side by side, and small helpers the notebooks use to build variants.

A `Run` is one `servesim run` output (requests.csv, steps.csv, summary.json), read from its folder
(`load_run`) or taken straight from `simulate()` (`Run.from_result`). Nothing here plots.
"""
from __future__ import annotations

import heapq
import warnings
from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.config.errors import ScenarioError
from sim.outputs import REQUESTS, STEPS, check_frame, read_summary
from sim.runtime.metrics import RENAMED, REQUEST_COLUMNS, Frame, weighted_sum
from sim.runtime.recorder import STEP_COLUMNS

RUN_FILES = ("requests.csv", "steps.csv", "summary.json")


@dataclass
class Run:
    name: str                 # label in legends and titles
    requests: pd.DataFrame    # requests.csv
    steps: pd.DataFrame       # steps.csv
    summary: dict             # summary.json

    @classmethod
    def from_result(cls, result, name: str | None = None) -> Run:
        """A `sim.simulate.SimResult` as a Run, without writing files."""
        return cls(name or result.summary.get("scenario", "run"), result.requests, result.steps,
                   result.summary)

    @property
    def replicas(self) -> int:
        return int(self.steps["replica"].max()) + 1 if len(self.steps) else 1

    @property
    def is_static(self) -> bool:
        """Only static batching computes padding (padded prompts, finished rows), so padded tokens
        identify it. A static run without any padding has no idle-but-held slots to draw anyway."""
        return bool((self.steps["padded_tokens"] > 0).any())

    @property
    def max_num_seqs(self) -> int:
        """engine.max_num_seqs as summary.json records it; for run folders written before it did,
        recovered from slot_utilization (= seq-iterations / (max_num_seqs x iterations)), or the
        largest batch seen."""
        recorded = (self.summary.get("run") or {}).get("engine", {}).get("max_num_seqs")
        if isinstance(recorded, int) and recorded > 0:
            return recorded
        s = self.steps
        seq_iters = float((s["num_seqs"] * s["count"]).sum())
        iters = float(s["count"].sum())
        util = self.summary.get("slot_utilization") or 0.0
        largest = int(s["num_seqs"].max()) if len(s) else 1
        return max(largest, round(seq_iters / (util * iters))) if util > 0 and iters else largest


@contextmanager
def as_written(path: Path, kind: str) -> Iterator[None]:
    """Drawing or reporting a plan's or search's JSON (`kind`), which the figures and tables read
    as servesim wrote it: a hand-edited or damaged one (a key gone, a list where a number was) is
    one error naming the file and what was wrong there, not a traceback from deep in a figure."""
    try:
        yield
    except ScenarioError:
        raise
    except KeyError as e:
        raise ScenarioError(f"{path}: not {kind} as servesim writes it: no key {e.args[0]!r} where one "
                            "was expected; write it again with servesim plan") from None
    except (IndexError, TypeError, ValueError, AttributeError, StopIteration) as e:
        what = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ScenarioError(f"{path}: not {kind} as servesim writes it: a value of the wrong kind or "
                            f"missing ({what}); write it again with servesim plan") from None


def load_run(path: str | Path, name: str | None = None) -> Run:
    """Read a run folder, each file held to what servesim writes (sim/outputs.py): a
    missing folder or file, a missing column, a bad cell or a damaged summary is a ScenarioError
    naming the file and the line or key."""
    path = Path(path)
    if not path.exists():
        raise ScenarioError(f"{path}: no such run directory")
    if not path.is_dir():
        raise ScenarioError(f"{path}: not a directory (expected a run directory from `servesim run`)")
    missing = [f for f in RUN_FILES if not (path / f).is_file()]
    if missing:
        raise ScenarioError(f"{path / missing[0]}: missing; not a run directory "
                            f"(`servesim run` writes {', '.join(RUN_FILES)})")
    frames = {}
    for file, columns, spec in (("requests.csv", REQUEST_COLUMNS, REQUESTS), ("steps.csv", STEP_COLUMNS, STEPS)):
        try:
            df = pd.read_csv(path / file, low_memory=False)  # (one pass: no DtypeWarning for a bad cell)
            old = [c for c in df.columns if c in RENAMED and RENAMED[c] not in df.columns]
            if old:  # a folder an earlier release wrote: its columns under today's names too
                warnings.warn(f"{path / file}: written by an earlier servesim; column(s) {', '.join(old)} "
                              f"read as {', '.join(RENAMED[c] for c in old)}", FutureWarning, stacklevel=2)
                for c in old:
                    df[RENAMED[c]] = df[c]
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
            raise ScenarioError(f"{path / file}: unreadable CSV ({str(e).splitlines()[0]})") from None
        lacking = [c for c in columns if c not in df.columns]
        if lacking:
            raise ScenarioError(f"{path / file}: missing column(s) {', '.join(lacking)}")
        if df.empty:  # a run has at least one request and one iteration
            raise ScenarioError(f"{path / file}: a header and no rows; not a complete run")
        frames[file] = Frame(check_frame(df, spec, path / file))  # (sim/outputs.py)
    summary = read_summary(path / "summary.json")
    return Run(name or path.name, frames["requests.csv"], frames["steps.csv"], summary)


# ---- slots ----

def iteration_of(steps: pd.DataFrame, times: np.ndarray, replica: int = 0) -> np.ndarray:
    """Map simulated times (s) to iteration indices of one replica: an iteration's start time maps
    to its index, an end time to the index after it. Inside a fast-forwarded row the iterations are
    taken as equally long; requests only join or leave at row boundaries, where this is exact.
    Times in an idle gap map to the next iteration."""
    s = steps[steps["replica"] == replica]
    start, dur = s["start_s"].to_numpy(float), s["duration_s"].to_numpy(float)
    count = s["count"].to_numpy(np.int64)
    first = np.concatenate(([0], np.cumsum(count)[:-1]))
    times = np.asarray(times, dtype=float)
    tol = 1e-9 * np.maximum(1.0, np.abs(times))
    row = np.clip(np.searchsorted(start, times + tol, side="right") - 1, 0, max(len(s) - 1, 0))
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(dur[row] > 0, (times - start[row]) / dur[row], 1.0)
    return np.rint(first[row] + count[row] * np.clip(frac, 0.0, 1.0)).astype(np.int64)


def slot_assignment(run: Run, replica: int = 0) -> pd.DataFrame:
    """Which batch slot each request of `replica` occupies, by interval colouring (greedy in order
    of start: lowest free slot), with intervals in iterations:

    start_it  first iteration the request is scheduled in (arrival + queue)
    end_it    one past its last iteration (finish)
    hold_it   one past the last iteration its slot stays taken: for static batching the end of its
              batch (finished rows keep computing padding), otherwise end_it
    slot      0-based slot index; never more slots than the busiest iteration needs

    A preempted request is drawn from its first scheduling to its finish (the files do not say when
    it was out)."""
    rq = run.requests[(run.requests["replica"] == replica) & run.requests["finish_s"].notna()]
    start_s = (rq["arrival_s"] + rq["queue_s"]).to_numpy(float)
    # the engine's own finish where request handling follows it (frontend, scheduling lag: the
    # default cost model); finish_s is then later than the request's last iteration
    finish = rq["engine_finish_s"] if "engine_finish_s" in rq.columns else rq["finish_s"]
    out = pd.DataFrame({"request_id": rq["request_id"].to_numpy(),
                        "start_it": iteration_of(run.steps, start_s, replica),
                        "end_it": iteration_of(run.steps, finish.to_numpy(float), replica),
                        "preemptions": rq["preemptions"].to_numpy()})
    if run.is_static:  # a batch = the requests that started together; it ends with its longest
        out["hold_it"] = out.groupby("start_it")["end_it"].transform("max")
    else:
        out["hold_it"] = out["end_it"]
    out = out.sort_values(["start_it", "request_id"], kind="stable").reset_index(drop=True)
    out["slot"] = _colour(out["start_it"].to_numpy(), out["hold_it"].to_numpy())
    return out


def _colour(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Interval colouring of half-open [start, end) intervals sorted by start: optimal (uses as many
    colours as the maximum overlap)."""
    busy: list[tuple[int, int]] = []   # (end, slot)
    free: list[int] = []
    slots = np.empty(len(starts), dtype=np.int64)
    for i, (a, b) in enumerate(zip(starts.tolist(), ends.tolist())):
        while busy and busy[0][0] <= a:
            heapq.heappush(free, heapq.heappop(busy)[1])
        slot = heapq.heappop(free) if free else len(busy)
        slots[i] = slot
        heapq.heappush(busy, (b, slot))
    return slots


def replica_iterations(run: Run, replica: int = 0) -> int:
    return int(run.steps.loc[run.steps["replica"] == replica, "count"].sum())


def slot_utilization_from_slots(slots: pd.DataFrame, iterations: int, max_num_seqs: int) -> float:
    """Useful slot-iterations / (max_num_seqs x iterations): equals summary.json's slot_utilization
    for one replica whenever no request was preempted."""
    useful = float((slots["end_it"] - slots["start_it"]).sum())
    return useful / (max_num_seqs * iterations) if iterations else 0.0


# ---- tables ----

def summary_row(run: Run) -> dict:
    """The headline numbers of one run, flat (latencies in ms)."""
    s = run.summary
    row: dict[str, Any] = {"run": run.name}
    for key in ("completed", "duration_s", "request_throughput", "output_throughput",
                "total_token_throughput", "preemptions", "slot_utilization", "kv_utilization",
                "kv_waste", "padding_waste"):
        row[key] = s.get(key)
    for metric in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):  # as results.csv names them (summary.json's, flat)
        for p in ("mean", "p50", "p90", "p99"):
            row[f"{metric}.{p}"] = (s.get(metric) or {}).get(p)
    if "prefix_cache_hit_rate" in s:  # runs with prefix caching on
        row["prefix_cache_hit_rate"] = s["prefix_cache_hit_rate"]
    goodput = s.get("goodput")
    if isinstance(goodput, dict):
        row["goodput_rps"] = goodput.get("requests_per_s")
        row["slo_met"] = goodput.get("met")
    return row


def summary_frame(runs: Iterable[Run] | Mapping, names: Sequence[str] | None = None) -> pd.DataFrame:
    """One summary_row per run. Given a mapping whose keys are tuples (e.g. (scheduler, rate)),
    the index is built from them, named by `names`. Last release's column names (ttft_p99_ms)
    still answer, with a FutureWarning (sim/runtime/metrics.RENAMED)."""
    if isinstance(runs, Mapping):
        keys, rows = list(runs), [summary_row(r) for r in runs.values()]
        df = Frame(rows).drop(columns="run")
        if keys and isinstance(keys[0], tuple):
            df.index = pd.MultiIndex.from_tuples(keys, names=names)
        else:
            df.index = pd.Index(keys, name=names[0] if names else None)
        return df
    return Frame([summary_row(r) for r in runs]).set_index("run")


def max_itl(run: Run) -> float:
    """The longest iteration that had a decode in it (s): the worst stall a running request saw
    (recompute preemptions aside)."""
    it = iteration_times(run.steps) if run.replicas == 1 else pd.concat(
        [iteration_times(run.steps, r) for r in range(run.replicas)])
    it = it[it["decode_tokens"] > 0]
    return float(it["iteration_s"].max()) if len(it) else 0.0


def time_weighted_mean(steps: pd.DataFrame, column: str) -> float:
    """Mean of a steps.csv column over busy time (each row weighted by its duration)."""
    d = steps["duration_s"].to_numpy(float)
    return float(weighted_sum(steps[column].to_numpy(float), d) / d.sum()) if d.sum() > 0 else 0.0


def iteration_times(steps: pd.DataFrame, replica: int = 0) -> pd.DataFrame:
    """Per row: start time and the mean duration of one of its iterations (s). Every decode in an
    iteration waits that long for its next token, so this is the inter-token latency over time."""
    s = steps[steps["replica"] == replica]
    return pd.DataFrame({"start_s": s["start_s"].to_numpy(float),
                         "iteration_s": (s["duration_s"] / s["count"]).to_numpy(float),
                         "prefill_tokens": s["prefill_tokens"].to_numpy(),
                         "decode_tokens": s["decode_tokens"].to_numpy(),
                         "num_seqs": s["num_seqs"].to_numpy()})


# ---- variants (notebooks, sweeps) ----

def scenario_workload(scenario_path: str | Path, overrides: Iterable[str] = ()):
    """The requests a scenario would simulate (its seeded workload), to reuse or modify."""
    from sim.scenario import load_scenario
    from sim.workload.generators import build_workload

    sc = load_scenario(scenario_path, overrides=list(overrides))
    return build_workload(sc.workload, np.random.default_rng(sc.seed))


def _simulate_variant(scenario_path, overrides, workload, name) -> Run:
    from sim.scenario import load_scenario
    from sim.simulate import simulate

    sc = load_scenario(scenario_path, overrides=list(overrides))
    return Run.from_result(simulate(sc, workload=workload), name=name)


def simulate_variants(scenario_path: str | Path, variants: Mapping[Hashable, Iterable[str]],
                      common: Iterable[str] = (), workload=None, workers: int = 1) -> dict:
    """Run `scenario_path` once per variant, each with `common` then its own `--set` overrides
    (validated like the CLI's); `workload` replaces the scenario's requests in every variant.
    Returns {label: Run} in the order given; workers > 1 runs them in processes."""
    from sim.planning.parallel import run_parallel

    labels = list(variants)
    args = [(scenario_path, [*common, *variants[k]], workload,
             "/".join(map(str, k)) if isinstance(k, tuple) else str(k)) for k in labels]
    done = dict(run_parallel(_simulate_variant, args, workers=workers))
    return {k: done[i] for i, k in enumerate(labels)}


def repeat_workload(workload, copies: int):
    """`copies` back-to-back copies of the same requests at the same arrival times."""
    from sim.workload.generators import Workload

    arrays = [np.tile(a, copies) for a in (workload.arrival_s, workload.prompt_tokens,
                                           workload.output_tokens, workload.priority)]
    order = np.argsort(arrays[0], kind="stable")
    return Workload(*(a[order] for a in arrays))


def with_extra_request(workload, at_s: float, prompt_tokens: int, output_tokens: int):
    """A copy of `workload` with one more request (e.g. a long prompt) arriving at `at_s`; returns
    (workload, the new request's id)."""
    from sim.workload.generators import Workload

    arrival = np.append(workload.arrival_s, float(at_s))
    order = np.argsort(arrival, kind="stable")
    w = Workload(arrival_s=arrival[order],
                 prompt_tokens=np.append(workload.prompt_tokens, prompt_tokens)[order],
                 output_tokens=np.append(workload.output_tokens, output_tokens)[order],
                 priority=np.append(workload.priority, 0)[order])
    return w, int(np.flatnonzero(order == len(arrival) - 1)[0])


def sequences_that_fit(budget, prompt_tokens: int, output_tokens: int, max_output_tokens: int) -> dict:
    """How many sequences of this shape a KV cache (`sim.presets.memory.MemoryBudget`) holds at once.
    Contiguous (static batching): each reserves prompt + the longest possible output up front.
    Paged: each holds whole blocks of the tokens it has so far: at its end, and on average over
    its decode (half its output)."""
    def blocks(tokens: float) -> int:
        return -(-int(tokens) // budget.block_size)

    return {"contiguous": budget.max_tokens // (prompt_tokens + max_output_tokens),
            "paged, at the end": budget.num_gpu_blocks // blocks(prompt_tokens + output_tokens),
            "paged, on average": budget.num_gpu_blocks // blocks(prompt_tokens + output_tokens / 2)}


# ---- a fleet over time (engine.autoscaling) ----

def fleet_timeline(run: Run, bins: int = 288) -> pd.DataFrame:
    """An autoscaled run (summary.json's `autoscaling`) in `bins` equal stretches of its clock:
    t_s (each stretch's start), the arrival rate in it (req/s), replicas held and serving at its
    start (held: from the decision to start to the release; serving: from the end of the cold start
    to the decision to drain), and the p99 TTFT (ms) of the requests that arrived in it (NaN: none).
    ScenarioError when the run has no autoscaling."""
    fleet = run.summary.get("autoscaling")
    if not isinstance(fleet, dict) or not fleet.get("spans"):
        raise ScenarioError(f"{run.name}: not an autoscaled run (summary.json has no autoscaling spans)")
    rq = run.requests
    end = max(float(rq["finish_s"].max()), max(s["end_s"] or 0.0 for s in fleet["spans"]))
    edges = np.linspace(0.0, end, bins + 1)
    t = edges[:-1]
    cold = float(fleet.get("cold_start_s") or 0.0)
    spans = fleet["spans"]
    start = np.array([s["start_s"] for s in spans])
    stop = np.array([s["end_s"] if s["end_s"] is not None else end for s in spans])
    drain = np.array([s["drain_s"] if s.get("drain_s") is not None else stop[i] for i, s in enumerate(spans)])
    # replicas held from 0 (the fleet's first) serve from 0: no cold start before the run
    ready = np.where(start > 0, start + cold, start)
    held = ((start[None, :] <= t[:, None]) & (t[:, None] < stop[None, :])).sum(axis=1)
    serving = ((ready[None, :] <= t[:, None]) & (t[:, None] < drain[None, :])).sum(axis=1)
    arrival = rq["arrival_s"].to_numpy(float)
    which = np.clip(np.searchsorted(edges, arrival, side="right") - 1, 0, bins - 1)
    width = edges[1] - edges[0] if end > 0 else 1.0
    rate = np.bincount(which, minlength=bins) / width
    ttft = rq["ttft_s"].to_numpy(float) * 1e3
    p99 = np.full(bins, np.nan)
    order = np.argsort(which, kind="stable")
    groups = np.split(ttft[order], np.flatnonzero(np.diff(which[order])) + 1) if len(order) else []
    for b, g in zip(np.unique(which[order]), groups):
        g = g[np.isfinite(g)]
        if len(g):
            p99[b] = np.percentile(g, 99)
    return Frame({"t_s": t, "arrival_rate": rate, "held": held, "serving": serving, "ttft_ms.p99": p99})
