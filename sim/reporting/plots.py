"""Standard figures of a run (or several side by side), from its output files.

Every function returns a `matplotlib.figure.Figure` built without pyplot (no global state; PNGs are
rendered by the Agg canvas), so notebooks can show it and `save_plots` can write it. The data work
(loading a run folder, slot assignment) is in `sim/reporting/analysis.py`.

    slot_timeline   which request holds which batch slot at each iteration (the "elevator" picture)
    batch_kv        batch size, KV blocks in use and waiting requests over time
    latency_cdfs    TTFT / TPOT / E2E distributions, one line per run
    compare_bars    throughput and latency percentiles, one bar per run
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .analysis import (
    Run,
    load_run,
    replica_iterations,
    slot_assignment,
    slot_utilization_from_slots,
)
from ..errors import ScenarioError

MAX_TIMELINE_REQUESTS = 300   # requests drawn in a slot timeline before it is cut (title says so)
LABELLED_REQUESTS = 40        # up to this many drawn requests, bars carry their request id
_PADDING = {"facecolor": "#d9d9d9", "edgecolor": "#8c8c8c", "hatch": "///", "linewidth": 0.3}
_PALETTE = [f"C{i}" for i in range(10)]


def slot_timeline(run: Run, replica: int = 0, max_requests: int = MAX_TIMELINE_REQUESTS) -> Figure:
    """One row per batch slot, x in iterations: a coloured bar while a request computes in the slot,
    hatched grey while a static batch keeps a finished row as padding, white while the slot is idle.
    Only the first `max_requests` requests (by start) are drawn; the x axis then stops where the
    next one starts, so everything shown is complete."""
    slots = slot_assignment(run, replica)
    iters = replica_iterations(run, replica)
    capacity = run.max_num_seqs
    util = slot_utilization_from_slots(slots, iters, capacity)
    x_end, note = iters, ""
    if len(slots) > max_requests:
        x_end = int(slots["start_it"].iloc[max_requests])
        note = f"\nfirst {max_requests} of {len(slots)} requests shown (iterations 0-{x_end})"
        slots = slots.iloc[:max_requests]
    n_slots = max(capacity, int(slots["slot"].max()) + 1 if len(slots) else 1)
    fig = Figure(figsize=(11, min(10.0, 2.2 + 0.22 * n_slots)), layout="constrained")
    ax = fig.add_subplot()
    for slot, rows in slots.groupby("slot"):
        work = list(zip(rows["start_it"], rows["end_it"] - rows["start_it"]))
        colours = [_PALETTE[int(r) % len(_PALETTE)] for r in rows["request_id"]]
        ax.broken_barh(work, (slot - 0.42, 0.84), facecolors=colours, edgecolor="white", linewidth=0.3)
        pad = rows[rows["hold_it"] > rows["end_it"]]
        if len(pad):
            ax.broken_barh(list(zip(pad["end_it"], pad["hold_it"] - pad["end_it"])), (slot - 0.42, 0.84),
                           **_PADDING)
    if len(slots) <= LABELLED_REQUESTS:
        for r in slots.itertuples():
            if r.end_it - r.start_it >= 0.04 * max(x_end, 1):
                ax.text((r.start_it + r.end_it) / 2, r.slot, f"req {r.request_id}", ha="center",
                        va="center", fontsize=8, color="white")
    ax.set_xlim(0, max(x_end, 1))
    ax.set_ylim(n_slots - 0.5, -0.5)
    if n_slots <= 32:
        ax.set_yticks(range(n_slots))
    ax.set_xlabel("iteration (engine step)")
    ax.set_ylabel(f"batch slot (max_num_seqs = {capacity})")
    ax.grid(axis="x", alpha=0.3)
    kind = "static batching" if run.is_static else "iteration-level batching"
    where = f", replica {replica} of {run.replicas}" if run.replicas > 1 else ""
    preempted = int((slots["preemptions"] > 0).sum())
    if preempted:
        note += f"\n{preempted} preempted requests drawn from first scheduling to finish"
    ax.set_title(f"{run.name}: batch slots over iterations ({kind}{where}) - "
                 f"slot utilisation {util:.1%}{note}")
    handles = [Patch(facecolor="C0", label="request computing (colour = request)"),
               Patch(facecolor="white", edgecolor="#8c8c8c", label="idle slot")]
    if run.is_static:
        handles.insert(1, Patch(**_PADDING, label="finished, held as padding until batch ends"))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8, frameon=False)
    return fig


def _step_xy(start: np.ndarray, end: np.ndarray, value: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A piecewise-constant curve through the rows, dropping to 0 in idle gaps between them."""
    gap = np.flatnonzero(start[1:] > end[:-1] + 1e-9 * np.maximum(1.0, end[:-1]))
    s = np.concatenate((start, end[gap]))
    e = np.concatenate((end, start[gap + 1]))
    v = np.concatenate((value.astype(float), np.zeros(len(gap))))
    order = np.argsort(s, kind="stable")
    s, e, v = s[order], e[order], v[order]
    return np.column_stack((s, e)).ravel(), np.column_stack((v, v)).ravel()


def batch_kv(run: Run) -> Figure:
    """Batch size, KV blocks in use and queue length over time, one line per replica (simulated
    seconds for a simulation, seconds since the engine started for a real engine's run)."""
    fig = Figure(figsize=(11, 7.5), layout="constrained")
    axes = fig.subplots(3, 1, sharex=True)
    steps = run.steps
    for rep, s in steps.groupby("replica"):
        start = s["start_s"].to_numpy(float)
        end = start + s["duration_s"].to_numpy(float)
        label = f"replica {rep}" if run.replicas > 1 else None
        for ax, col in zip(axes, ("num_seqs", "kv_blocks_used", "waiting")):
            x, y = _step_xy(start, end, s[col].to_numpy())
            ax.plot(x, y, lw=0.9, label=label)
    axes[0].axhline(run.max_num_seqs, color="k", ls="--", lw=0.8, label=f"max_num_seqs = {run.max_num_seqs}")
    total = int(steps["kv_blocks_total"].max()) if len(steps) else 0
    axes[1].axhline(total, color="k", ls="--", lw=0.8, label=f"KV blocks available = {total:,}")
    axes[0].set_ylabel("batch size\n(sequences)")
    axes[1].set_ylabel("KV blocks in use\n(blocks)")
    axes[2].set_ylabel("waiting\n(requests)")
    axes[2].set_xlabel("time since the run started (s)")
    s = run.summary
    axes[0].set_title(f"{run.name}: batch size (slot utilisation {s.get('slot_utilization', 0):.1%}), "
                      f"KV cache (utilisation {s.get('kv_utilization', 0):.1%}, "
                      f"waste {s.get('kv_waste', 0):.1%}) and queue over time")
    for ax in axes:
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    for ax in axes[:2]:
        ax.legend(loc="upper right", fontsize=8)
    return fig


_CDF_METRICS = (("ttft_s", "TTFT", 1e3, "ms"), ("tpot_s", "TPOT", 1e3, "ms"), ("e2e_s", "E2E latency", 1, "s"))


def latency_cdfs(runs: Sequence[Run]) -> Figure:
    """Empirical CDFs of TTFT, TPOT (ms) and end-to-end latency (s) over completed requests; the
    x axis turns logarithmic when a metric spans more than two decades."""
    fig = Figure(figsize=(13, 4.2), layout="constrained")
    axes = fig.subplots(1, 3, sharey=True)
    for ax, (col, title, scale, unit) in zip(axes, _CDF_METRICS):
        lo, hi = np.inf, 0.0
        for i, run in enumerate(runs):
            v = np.sort(run.requests[col].dropna().to_numpy(float) * scale)
            if not len(v):
                continue
            p50, p99 = np.percentile(v, [50, 99])
            ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", color=f"C{i % 10}",
                    label=f"{run.name}: p50 {p50:.3g}, p99 {p99:.3g} {unit}" if len(runs) > 1
                    else f"p50 {p50:.3g}, p99 {p99:.3g} {unit}")
            lo, hi = min(lo, v[v > 0].min(initial=np.inf)), max(hi, v[-1])
        if np.isfinite(lo) and hi > 100 * lo:
            ax.set_xscale("log")
        ax.axhline(0.99, color="grey", ls=":", lw=0.8)
        ax.set_xlabel(f"{title} ({unit})")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="lower right", fontsize=7)
        else:  # e.g. TPOT when every output is one token
            ax.text(0.5, 0.5, f"no {title} values", ha="center", va="center", transform=ax.transAxes)
    axes[0].set_ylabel("fraction of requests")
    axes[0].set_ylim(0, 1.01)
    fig.suptitle(("latency CDFs: " + ", ".join(r.name for r in runs)) if len(runs) > 1
                 else f"{runs[0].name}: latency CDFs (dotted line: p99)")
    return fig


_BAR_PANELS = (("output_throughput", None, "output throughput", "tokens/s"),
               ("request_throughput", None, "request throughput", "requests/s"),
               # slot utilisation alone flatters static batching: its padded rows are computed but
               # not counted as busy, so padding waste goes beside it
               (None, ("slot_utilization", "padding_waste"), "slots and padding", "%"),
               ("ttft_ms", ("p50", "p99"), "TTFT", "ms"),
               ("tpot_ms", ("p50", "p99"), "TPOT", "ms"),
               ("e2el_ms", ("p50", "p99"), "E2E latency", "ms"))


def _num(v: float) -> str:
    """3 significant figures without scientific notation: 1,560 / 26.8 / 0.0143."""
    if not np.isfinite(v):
        return "-"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def compare_bars(runs: Sequence[Run]) -> Figure:
    """Throughput (top row) and latency p50/p99 (bottom row), one bar (pair) per run."""
    fig = Figure(figsize=(13, 7), layout="constrained")
    axes = fig.subplots(2, 3).ravel()
    names = [r.name for r in runs]
    x = np.arange(len(runs))
    for ax, (key, pcts, title, unit) in zip(axes, _BAR_PANELS):
        if pcts is None:
            vals = np.array([float(r.summary.get(key) or 0.0) for r in runs])
            if unit == "%":
                vals = vals * 100
            bars = ax.bar(x, vals, color=[f"C{i % 10}" for i in range(len(runs))])
            ax.bar_label(bars, labels=[_num(v) for v in vals], fontsize=8)
        else:
            width = 0.8 / len(pcts)
            for j, p in enumerate(pcts):
                if key is None:  # top-level fractions, in %
                    vals = np.array([float(r.summary.get(p) or 0.0) * 100 for r in runs])
                else:
                    vals = np.array([float((r.summary.get(key) or {}).get(p) or np.nan) for r in runs])
                bars = ax.bar(x + (j - (len(pcts) - 1) / 2) * width, vals, width,
                              label=p.replace("_", " ").replace("utilization", "utilisation"), color="#9ecae1" if j == 0 else "#3182bd")
                ax.bar_label(bars, labels=[_num(v) for v in vals], fontsize=7)
            ax.legend(fontsize=8)
        ax.set_title(title)
        ax.set_ylabel(f"{title} ({unit})")
        ax.set_xticks(x, names, rotation=20 if len(runs) > 3 else 0, ha="right" if len(runs) > 3 else "center")
        ax.margins(y=0.15)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("throughput (higher is better) and latency percentiles (lower is better)")
    return fig


def _labels(paths: Sequence[Path], runs: Sequence[Run]) -> None:
    """Name each run by its folder, or by its full path when folder names collide."""
    names = [p.name for p in paths]
    for p, r in zip(paths, runs):
        r.name = p.name if names.count(p.name) == 1 else str(p)


def save_plots(run_dir: str | Path, compare: Sequence[str | Path] = (), out: str | Path | None = None,
               max_requests: int = MAX_TIMELINE_REQUESTS) -> list[Path]:
    """Write the standard PNGs of `run_dir` (and, with `compare`, the side-by-side ones) into `out`
    (default RUN_DIR/plots). Returns the files written; bad folders raise ScenarioError."""
    paths = [Path(run_dir), *map(Path, compare)]
    runs = [load_run(p) for p in paths]
    same = next((p for i, p in enumerate(paths) if p.resolve() in [q.resolve() for q in paths[:i]]), None)
    if same is not None:
        raise ScenarioError(f"--compare {same}: given twice (or it is RUN_DIR); compare different runs")
    _labels(paths, runs)
    out = Path(out) if out is not None else paths[0] / "plots"
    out.mkdir(parents=True, exist_ok=True)
    main = runs[0]
    figures = {"slot_timeline": slot_timeline(main, max_requests=max_requests),
               "batch_kv": batch_kv(main),
               "latency_cdf": latency_cdfs([main])}
    if len(runs) > 1:
        figures["compare_bars"] = compare_bars(runs)
        figures["compare_cdf"] = latency_cdfs(runs)
    written = []
    for name, fig in figures.items():
        path = out / f"{name}.png"
        fig.savefig(path, dpi=110)
        written.append(path)
    return written
