"""Measured vs simulated: a `vllm bench serve` result beside a servesim run of the same requests.

    table = compare(bench_doc, run)      # rows: metric, statistic, measured, simulated, error
    path = compare_plot(table, run, "compare.png")

The benchmark's aggregate keys are vLLM's (mean_/median_/p99_ ttft, tpot, itl, e2el in ms,
request_throughput, output_throughput); where an aggregate is missing and the per-request lists
are there (ttfts, itls in seconds) it is computed from them. Error = simulated / measured - 1.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .analysis import Run

METRICS = ("ttft", "tpot", "itl", "e2el")
STATS = (("mean", "mean"), ("median", "p50"), ("p99", "p99"))  # vLLM's name, summary.json's


def _measured(doc: dict, metric: str, stat: str) -> float | None:
    value = doc.get(f"{stat}_{metric}_ms")
    if isinstance(value, (int, float)):
        return float(value)
    per_request = {"ttft": doc.get("ttfts"),
                   "itl": [g for gaps in doc.get("itls") or [] for g in (gaps or [])]}.get(metric)
    if per_request:
        values = np.asarray([v for v in per_request if v is not None], dtype=float) * 1e3
        return float({"mean": np.mean, "median": np.median,
                      "p99": lambda v: np.percentile(v, 99)}[stat](values)) if len(values) else None
    return None


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
    return table


def compare_plot(table: pd.DataFrame, run: Run, path: str | Path) -> Path:
    """Measured and simulated side by side per latency metric and statistic, log scale, each pair
    labelled with its error."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lat = table[table["metric"].str.endswith("(ms)") & table["measured"].notna() & table["simulated"].notna()]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(lat) + 2), 4.4))
    x = np.arange(len(lat))
    ax.bar(x - 0.2, lat["measured"], 0.4, label="measured (vllm bench serve)", color="tab:gray")
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
    ax.set_title(f"{run.summary.get('scenario')} ({rec.get('model')}, {rec.get('hardware')}, {cost}): "
                 "measured vs simulated", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
