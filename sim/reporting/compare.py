"""Measured vs simulated: a `vllm bench serve` result (or a BLIS trace v2 of a real run) beside a
servesim run of the same requests.

    doc = measured_doc(path)             # the measurement, in vllm bench serve's keys
    table = compare(doc, run)            # rows: metric, statistic, measured, simulated, error
    path = compare_plot(table, run, "compare.png")

The benchmark's aggregate keys are vLLM's (mean_/median_/p99_ ttft, tpot, itl, e2el in ms,
request_throughput, output_throughput); where an aggregate is missing and the per-request lists
are there (ttfts, itls in seconds; tpots, e2els for a BLIS trace) it is computed from them.
Error = simulated / measured - 1.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from sim.config.errors import ScenarioError
from sim.files import plain_text, save_figure
from sim.reporting.analysis import Run
from sim.workload.traces import BLIS_V2, blis_v2_timings

METRICS = ("ttft", "tpot", "itl", "e2el")
STATS = (("mean", "mean"), ("median", "p50"), ("p99", "p99"))  # vLLM's name, summary.json's


def _measured(doc: dict, metric: str, stat: str) -> float | None:
    value = doc.get(f"{stat}_{metric}_ms")
    if isinstance(value, (int, float)):
        return float(value)
    # (vLLM's --save-detailed names each request's end-to-end latency `latencies`; e2els: BLIS's, ours)
    e2els = doc.get("e2els") if doc.get("e2els") is not None else doc.get("latencies")
    per_request = {"ttft": doc.get("ttfts"), "tpot": doc.get("tpots"), "e2el": e2els,
                   "itl": [g for gaps in doc.get("itls") or [] for g in (gaps or [])]}.get(metric)
    if per_request:
        values = np.asarray([v for v in per_request if v is not None], dtype=float) * 1e3
        return float({"mean": np.mean, "median": np.median,
                      "p99": lambda v: np.percentile(v, 99)}[stat](values)) if len(values) else None
    return None


def measured_doc(path: Path) -> dict:
    """The measurement in `path`: a `vllm bench serve --save-result` JSON as it is, or a BLIS trace
    v2 data CSV (`blis observe` of a real server) turned into the same keys. ScenarioError if
    neither, or if it carries no measured latencies."""
    import json


    path = Path(path)
    text = path.read_text(encoding="utf-8", errors="replace")
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError):
            raise ScenarioError(f"{path}: not valid JSON, or nested too deeply (expected vllm bench serve "
                                "--save-result output)") from None
        if not isinstance(doc, dict) or not any(k.endswith("_ttft_ms") or k == "ttfts" for k in doc):
            raise ScenarioError(f"{path}: no measured latencies (mean_ttft_ms, ... or ttfts); expected vllm "
                                "bench serve --save-result output")
        _check_bench(doc, path)
        return {"source": "vllm bench serve", **doc}
    header = text.split("\n", 1)[0].split(",")
    timing = ("send_time_us", "first_chunk_time_us", "last_chunk_time_us", "status")
    if not set(BLIS_V2 + timing) <= {h.strip() for h in header}:
        raise ScenarioError(f"{path}: not a JSON file (vllm bench serve --save-result output) nor a BLIS trace "
                            f"v2 CSV with {', '.join(BLIS_V2 + timing)}")
    return blis_v2_doc(*blis_v2_timings(path))


# vllm bench serve's per-request lists (seconds; token counts), one entry per request each
# (latencies: each request's end-to-end time, written with --save-detailed)
PER_REQUEST = ("ttfts", "itls", "input_lens", "output_lens", "latencies")


def _check_bench(doc: dict, path: Path) -> None:
    """What the comparison and the overhead fit read of a bench result, as vLLM writes it: its
    summary statistics (`*_ms`, `*_throughput`) numbers, its per-request lists (also `tpots`,
    `e2els` where present) lists of numbers >= 0 (itls: a list of gaps per request), the
    per-request ones one entry per request each. A hand-edited or damaged one is one error naming
    the key and the entry (a string in ttfts was a traceback)."""
    for key, value in doc.items():
        if (key.endswith("_ms") or key.endswith("_throughput")) and value is not None and not _number(value):
            raise ScenarioError(f"{path}: {key}: {value!r:.40} is not a finite number >= 0")
    counts: dict[str, int] = {}
    for key in (*PER_REQUEST, "tpots", "e2els"):
        values = doc.get(key)
        if values is None:
            continue
        if not isinstance(values, list):
            raise ScenarioError(f"{path}: {key}: {type(values).__name__} where vllm bench serve writes a list")
        for i, v in enumerate(values):
            if key == "itls":
                if not isinstance(v, list) or not all(_number(g) for g in v):
                    raise ScenarioError(f"{path}: itls[{i}]: {v!r:.40} is not a list of gaps >= 0 (s)")
            elif not _number(v) and not (v is None and key in ("tpots", "e2els")):
                raise ScenarioError(f"{path}: {key}[{i}]: {v!r:.40} is not a finite number >= 0")
        if key in PER_REQUEST:
            counts[key] = len(values)
    if len(set(counts.values())) > 1:
        (a, n), (b, m) = next((x, y) for x in counts.items() for y in counts.items() if x[1] != y[1])
        raise ScenarioError(f"{path}: {a} has {n} entries but {b} {m}: vllm bench serve writes one per request "
                            "in each (a damaged or edited file)")


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def blis_v2_doc(ok: pd.DataFrame, failed: int) -> dict:
    """A BLIS trace v2's measured latencies in vllm bench serve's keys, from its requests with
    status ok (sim/workload/traces.blis_v2_timings, seconds): TTFT = first chunk - send, E2EL = last
    chunk - send, TPOT = (E2EL - TTFT) / (output tokens - 1) for outputs of 2+ tokens (vLLM's
    definition), throughput = completed requests (output tokens) / (last chunk - first send). No
    per-token times: no ITL."""
    send, first, last = (ok[c].to_numpy(np.float64) for c in
                         ("send_time_us", "first_chunk_time_us", "last_chunk_time_us"))
    ttft, e2el = first - send, last - send
    out_tokens = ok["output_tokens"].to_numpy(np.int64)
    many = out_tokens > 1
    span = float(last.max() - send.min()) if len(ok) else 0.0
    return {"source": "BLIS trace v2", "ttfts": ttft.tolist(), "e2els": e2el.tolist(),
            "tpots": ((e2el[many] - ttft[many]) / (out_tokens[many] - 1)).tolist(),
            "request_throughput": len(ok) / span if span > 0 else None,
            "output_throughput": float(out_tokens.sum()) / span if span > 0 else None,
            "completed": len(ok), "failed": failed}


def compare(doc: dict, run: Run) -> pd.DataFrame:
    rows = []
    s = run.summary
    for metric in METRICS:
        sim = s.get(f"{metric}_ms") or {}
        for stat, key in STATS:
            rows.append((f"{metric.upper()} (ms)", stat, _measured(doc, metric, stat), sim.get(key)))
    for key, label in (("request_throughput", "requests/s"), ("output_throughput", "output tokens/s")):
        m = doc.get(key)
        rows.append((label, "", float(m) if isinstance(m, (int, float)) else None, s.get(key)))
    table = pd.DataFrame(rows, columns=["metric", "statistic", "measured", "simulated"])
    ok = table["measured"].notna() & table["simulated"].notna() & (table["measured"] != 0)
    table["error"] = np.where(ok, table["simulated"] / table["measured"].where(ok, 1.0) - 1, np.nan)
    table.attrs["source"] = doc.get("source", "vllm bench serve")
    # requests on each side, for the figure's n: what the measurement completed, what was simulated
    table.attrs["n_measured"] = doc.get("completed")
    table.attrs["n_simulated"] = s.get("completed")
    return table


@plain_text
def compare_plot(table: pd.DataFrame, run: Run, path: str | Path) -> Path:
    """Measured and simulated side by side per latency metric and statistic, log scale, each pair
    labelled with its error."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lat = table[table["metric"].str.endswith("(ms)") & table["measured"].notna() & table["simulated"].notna()]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(lat) + 2), 4.4))
    x = np.arange(len(lat))
    source = table.attrs.get("source", "vllm bench serve")
    ax.bar(x - 0.2, lat["measured"], 0.4, label=f"measured ({source})", color="tab:gray")
    ax.bar(x + 0.2, lat["simulated"], 0.4, label="simulated (servesim)", color="tab:blue")
    for i, (m, sim, err) in enumerate(zip(lat["measured"], lat["simulated"], lat["error"])):
        ax.annotate(f"{err:+.0%}", (i, max(m, sim)), textcoords="offset points", xytext=(0, 4),
                    ha="center", fontsize=8)
    ax.set_xticks(x, [f"{a.split()[0]}\n{b}" for a, b in zip(lat["metric"], lat["statistic"])], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("ms (log scale)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    rec = run.summary.get("run") or {}
    cost = (rec.get("cost_model") or {}).get("name", "?")
    measured, simulated = (table.attrs.get(k) or "?" for k in ("n_measured", "n_simulated"))
    n = f"n = {measured} measured, {simulated} simulated requests"
    ax.set_title(f"{run.summary.get('scenario')} ({rec.get('model')}, {rec.get('hardware')}, {cost}): "
                 f"measured vs simulated\n{n}", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return Path(path)
