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

import textwrap
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from sim.config.errors import ScenarioError
from sim.files import plain_text, save_figure
from sim.outputs import damaged_summary, read_json, read_summary
from sim.reporting.analysis import (
    Run,
    as_written,
    iteration_of,
    load_run,
    replica_iterations,
    slot_assignment,
    slot_utilization_from_slots,
)

MAX_TIMELINE_REQUESTS = 300   # requests drawn in a slot timeline before it is cut (title says so)
LABELLED_REQUESTS = 40        # up to this many drawn requests, bars carry their request id
MAX_TIMELINE_SLOTS = 64       # rows of a slot timeline: past this a row is a stripe (the busiest are drawn)
_PADDING = {"facecolor": "#d9d9d9", "edgecolor": "#8c8c8c", "hatch": "///", "linewidth": 0.3}
_PALETTE = [f"C{i}" for i in range(10)]


def describe(run: Run) -> str:
    """'chat (llama-3-8b, h100-sxm, roofline)': what a figure's title says the run is."""
    rec = run.summary.get("run") or {}
    parts = [str(p) for p in (rec.get("model"), rec.get("hardware"), (rec.get("cost_model") or {}).get("name")) if p]
    return f"{run.name} ({', '.join(parts)})" if parts else run.name


def timeline_window(slots, iters: int, max_requests: int, window_its: tuple[int, int] | None = None
                    ) -> tuple[int, int, str]:
    """(first iteration, end iteration, why) of the slot timeline: the user's window, the whole run
    when it has at most `max_requests` requests, else the busiest stretch: the `max_requests`
    consecutive requests (by start) that start within the fewest iterations."""
    if window_its is not None:
        return window_its[0], window_its[1], "the window asked for"
    if len(slots) <= max_requests:
        return 0, iters, ""
    starts = slots["start_it"].to_numpy()
    spans = starts[max_requests:] - starts[:-max_requests]
    i = int(np.argmin(spans))
    return int(starts[i]), int(starts[i + max_requests]), f"the busiest stretch of {max_requests} requests"


def slot_timeline(run: Run, replica: int = 0, max_requests: int = MAX_TIMELINE_REQUESTS,
                  window_s: tuple[float, float] | None = None) -> Figure:
    """One row per batch slot, x in iterations: a coloured bar while a request computes in the slot,
    hatched grey while a static batch keeps a finished row as padding, white while the slot is idle.
    A run of more than `max_requests` requests is drawn over a window, the busiest stretch (or
    `window_s`: seconds since the first arrival), and the title says which."""
    slots = slot_assignment(run, replica)
    iters = replica_iterations(run, replica)
    capacity = run.max_num_seqs
    util = slot_utilization_from_slots(slots, iters, capacity)
    t0 = float(run.requests["arrival_s"].min()) if len(run.requests) else 0.0
    its: tuple[int, int] | None = None
    if window_s is not None:
        first, last = (int(i) for i in iteration_of(run.steps, np.asarray(window_s) + t0, replica))
        its = (first, last)
    x_start, x_end, why = timeline_window(slots, iters, max_requests, its)
    note = ""
    if why:
        inside = (slots["start_it"] < x_end) & (slots["hold_it"] > x_start)
        times = _iteration_times(run, replica, (x_start, x_end)) - t0
        note = (f"\n{why}: iterations {x_start:,}-{x_end:,} (t = {times[0]:.1f}-{times[1]:.1f} s), "
                f"{int(inside.sum())} of {len(slots)} requests")
        slots = slots[inside]
    used = int(slots["slot"].max()) + 1 if len(slots) else 1
    # rows no request reaches are not drawn (a chat run uses 40 of 256 slots): the label says so
    n_slots = capacity if used > 0.75 * capacity or capacity <= 16 else max(used + 1, 8)
    busiest = ""
    if n_slots > MAX_TIMELINE_SLOTS:  # hundreds of rows are stripes: the busiest, in slot order, said
        work = (slots["end_it"] - slots["start_it"]).groupby(slots["slot"]).sum()
        keep = np.sort(work.sort_values(ascending=False, kind="stable").index[:MAX_TIMELINE_SLOTS].to_numpy())
        slots = slots[slots["slot"].isin(keep)].assign(slot=lambda f: np.searchsorted(keep, f["slot"]))
        busiest = f"the {len(keep)} busiest of {used} slots used"  # (keep: their slot ids, ascending)
        note += f"\n{busiest} (most iterations computing), in slot order"
        n_slots = len(keep)
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
    ax.set_xlim(x_start, max(x_end, x_start + 1))
    ax.set_ylim(n_slots - 0.5, -0.5)
    if busiest:  # rows are ranks among the slots kept: the ticks name the slots themselves
        rows_shown = range(0, n_slots, 8)
        ax.set_yticks(list(rows_shown), [str(int(keep[i])) for i in rows_shown])
    elif n_slots <= 32:
        ax.set_yticks(range(n_slots))
    ax.set_xlabel("iteration (engine step)")
    ax.set_ylabel(f"batch slot: {busiest} (max_num_seqs = {capacity})" if busiest else
                  f"batch slot (max_num_seqs = {capacity})" if n_slots >= capacity else
                  f"batch slot: {used} used (max_num_seqs = {capacity})")
    ax.grid(axis="x", alpha=0.3)
    kind = "static batching" if run.is_static else "iteration-level batching"
    where = f", replica {replica} of {run.replicas}" if run.replicas > 1 else ""
    preempted = int((slots["preemptions"] > 0).sum())
    if preempted:
        note += f"\n{preempted} preempted requests drawn from first scheduling to finish"
    ax.set_title(f"{describe(run)}: batch slots over iterations ({kind}{where})\n"
                 f"slot utilisation {util:.1%} over the run{note}")  # (one line was cut at the figure's edge)
    handles = [Patch(facecolor="C0", label="a request computing (colours cycle: neighbouring requests differ)"),
               Patch(facecolor="white", edgecolor="#8c8c8c", label="idle slot")]
    if run.is_static:
        handles.insert(1, Patch(**_PADDING, label="finished, held as padding until batch ends"))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8, frameon=False)
    return fig


def _iteration_times(run: Run, replica: int, its: tuple[int, int]) -> np.ndarray:
    """Start times (s) of iterations `its` of a replica (the end of the run past the last)."""
    s = run.steps[run.steps["replica"] == replica]
    ends = np.cumsum(s["count"].to_numpy())
    out = []
    for it in its:
        row = int(np.searchsorted(ends, it, side="right"))
        if row >= len(s):
            out.append(float(s["start_s"].iloc[-1] + s["duration_s"].iloc[-1]) if len(s) else 0.0)
            continue
        first = ends[row] - s["count"].iloc[row]
        out.append(float(s["start_s"].iloc[row] + s["duration_s"].iloc[row] * (it - first) / s["count"].iloc[row]))
    return np.asarray(out)


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
    """Batch size, KV blocks in use and queue length over time, one line per replica, in seconds
    since the first request arrived (a replayed trace's clock may start anywhere)."""
    fig = Figure(figsize=(11, 7.5), layout="constrained")
    axes = fig.subplots(3, 1, sharex=True)
    steps = run.steps
    t0 = float(run.requests["arrival_s"].min()) if len(run.requests) else 0.0
    for rep, s in steps.groupby("replica"):
        start = s["start_s"].to_numpy(float) - t0
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
    axes[2].set_xlabel("time since the first request arrived (s)")
    waiting = float(steps["waiting"].max()) if len(steps) else 0.0
    axes[2].set_ylim(0, max(1.0, waiting) * 1.1)  # an empty queue is a flat 0, not a 0-0.05 axis
    axes[2].yaxis.set_major_locator(MaxNLocator(integer=True))
    s = run.summary
    axes[0].set_title(f"{describe(run)}: batch size, KV cache and queue over time\n"
                      f"slot utilisation {s.get('slot_utilization', 0):.1%}, KV utilisation "
                      f"{s.get('kv_utilization', 0):.1%}, KV waste {s.get('kv_waste', 0):.1%}")
    for ax in axes:
        ax.grid(alpha=0.3)
    for ax in axes[:2]:
        ax.set_ylim(bottom=0)
        ax.legend(loc="upper right", fontsize=8)
    return fig


def fleet_plot(run: Run, bins: int = 288) -> Figure:
    """An autoscaled run over its clock (in hours past 2 h): the arrival rate, the replicas held
    and serving, the p99 TTFT of each stretch's arrivals with the SLO target
    (analysis.fleet_timeline)."""
    from sim.reporting.analysis import fleet_timeline

    f = fleet_timeline(run, bins)
    hours = float(f["t_s"].iloc[-1]) > 7200
    x = f["t_s"] / 3600 if hours else f["t_s"]
    fig = Figure(figsize=(11, 7.5), layout="constrained")
    axes = fig.subplots(3, 1, sharex=True)
    axes[0].plot(x, f["arrival_rate"], lw=1.0, color="C0")
    axes[0].set_ylabel("arrivals\n(req/s)")
    axes[1].step(x, f["held"], where="post", lw=1.2, color="C1", label="held (starting, serving, draining)")
    axes[1].step(x, f["serving"], where="post", lw=1.0, color="C2", ls="--", label="serving")
    a = run.summary["autoscaling"]
    limits = (run.summary.get("run") or {}).get("engine", {}).get("autoscaling") or {}
    if limits.get("max_replicas"):
        axes[1].axhline(limits["max_replicas"], color="k", lw=0.8, ls=":",
                        label=f"max_replicas = {limits['max_replicas']}")
    axes[1].set_ylabel("replicas")
    axes[1].yaxis.set_major_locator(MaxNLocator(integer=True))
    axes[1].set_ylim(bottom=0)
    axes[1].legend(loc="upper left", fontsize=8)
    axes[2].plot(x, f["ttft_ms.p99"], lw=1.0, color="C3", label="p99 TTFT of the arrivals in each stretch")
    target = ((run.summary.get("goodput") or {}).get("ttft_ms") or {}).get("target")
    if target:
        axes[2].axhline(target, color="red", ls="--", lw=0.8, label=f"SLO TTFT {target:g} ms")
    axes[2].set_ylabel("p99 TTFT\n(ms)")
    axes[2].set_ylim(bottom=0)
    axes[2].legend(loc="upper left", fontsize=8)
    axes[2].set_xlabel("time (h)" if hours else "time (s)")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].set_title(f"{describe(run)}: the fleet over the run ({len(f)} stretches)\n"
                      f"{a['gpu_hours']:,.1f} GPU-hours (${a['usd']:,.0f}), {a['mean_replicas']:.2f} replicas held on "
                      f"average, at most {a['peak_replicas']}: {a['saving_vs_static_max']:.0%} less than "
                      f"{limits.get('max_replicas', '?')} all the time")
    return fig


_CDF_METRICS = (("ttft_s", "TTFT", 1e3, "ms", "ttft_ms"), ("tpot_s", "TPOT", 1e3, "ms", "tpot_ms"),
                ("e2el_s", "E2E latency", 1, "s", "e2el_ms"))


def latency_cdfs(runs: Sequence[Run]) -> Figure:
    """Empirical CDFs of TTFT, TPOT (ms) and end-to-end latency (s) over completed requests; the
    x axis turns logarithmic when a metric spans more than two decades; a run's SLO target (its
    summary's goodput) is a vertical line with its percentile marked."""
    fig = Figure(figsize=(13, 4.2), layout="constrained")
    axes = fig.subplots(1, 3, sharey=True)
    for ax, (col, title, scale, unit, slo_key) in zip(axes, _CDF_METRICS):
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
        for i, run in enumerate(runs if np.isfinite(lo) else ()):  # (no values: no panel to mark)
            slo = ((run.summary.get("goodput") or {}).get(slo_key))
            if isinstance(slo, dict) and slo.get("target"):
                target = slo["target"] / 1e3 * scale  # ms -> this panel's unit
                pct = slo.get("percentile", run.summary["goodput"].get("percentile", 99))
                ax.axvline(target, color=f"C{i % 10}", ls="--", lw=1,
                           label=f"SLO p{pct:g} <= {target:g} {unit}" + (f" ({run.name})" if len(runs) > 1 else ""))
                ax.plot([target], [pct / 100], marker="o", color=f"C{i % 10}", ms=4)
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
    fig.suptitle(("latency CDFs: " + ", ".join(describe(r) for r in runs)) if len(runs) > 1
                 else f"{describe(runs[0])}: latency CDFs (dotted line: p99; dashed: the SLO)")
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
                              label=p.replace("_", " ").replace("utilization", "utilisation"),
                              color="#9ecae1" if j == 0 else "#3182bd")
                ax.bar_label(bars, labels=[_num(v) for v in vals], fontsize=7)
            ax.legend(fontsize=8)
        ax.set_title(title)
        ax.set_ylabel(f"{title} ({unit})")
        ax.set_xticks(x, names, rotation=20 if len(runs) > 3 else 0, ha="right" if len(runs) > 3 else "center")
        ax.margins(y=0.15)
        if key is not None and key.endswith("_ms"):  # latencies spread over decades between engines
            shown = [b.get_height() for b in ax.patches if np.isfinite(b.get_height()) and b.get_height() > 0]
            if shown and max(shown) > 10 * min(shown):
                ax.set_yscale("log")
                ax.set_ylabel(f"{title} ({unit}, log scale)")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("throughput (higher is better) and latency percentiles (lower is better): "
                 + ", ".join(describe(r) for r in runs))
    return fig


def _labels(paths: Sequence[Path], runs: Sequence[Run]) -> None:
    """Name each run by its folder, or by its full path when folder names collide."""
    names = [p.name for p in paths]
    for p, r in zip(paths, runs):
        r.name = p.name if names.count(p.name) == 1 else str(p)


@plain_text
def save_plots(run_dir: str | Path, compare: Sequence[str | Path] = (), out: str | Path | None = None,
               max_requests: int = MAX_TIMELINE_REQUESTS, window_s: tuple[float, float] | None = None) -> list[Path]:
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
    figures = {"slot_timeline": slot_timeline(main, max_requests=max_requests, window_s=window_s),
               "batch_kv": batch_kv(main),
               "latency_cdf": latency_cdfs([main])}
    if isinstance(main.summary.get("autoscaling"), dict):  # an autoscaled fleet: it over the run
        figures.update(_section_figures(paths[0], "autoscaling", lambda: {"fleet": fleet_plot(main)}))
    from sim.features.registry import FEATURES

    for key, feature in FEATURES.items():  # a feature's own figures (sim/features/), where its section is
        if isinstance(main.summary.get(key), dict):
            figures.update(_section_figures(paths[0], key, lambda f=feature: f.figures(main)))
    if len(runs) > 1:
        figures["compare_bars"] = compare_bars(runs)
        figures["compare_cdf"] = latency_cdfs(runs)
        for i, run in enumerate(runs[1:], 1):  # each compared run's own timeline
            figures[f"slot_timeline_{i}"] = slot_timeline(run, max_requests=max_requests, window_s=window_s)
    written = []
    for name, fig in figures.items():
        path = out / f"{name}.png"
        save_figure(fig, path, dpi=110)
        written.append(path)
    return written


def _section_figures(folder: Path, key: str, draw) -> dict:
    """draw()'s figures of summary.json's section `key`; a section edited out of shape (the one
    reader holds a section to be an object, not its insides) is one line naming the file and key,
    not a traceback from deep in the figure."""
    try:
        return draw()
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise damaged_summary(folder, key, e) from None


# ---------------------------------------------------------------- sweeps and plans

def sweep_columns(rows) -> list[str]:
    """A sweep's grid keys: the results.csv columns between scenario_sha256 and repeat."""
    cols = list(rows.columns)
    return cols[cols.index("scenario_sha256") + 1: cols.index("repeat")]


_METRIC_NAMES = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "itl_ms": "ITL", "e2el_ms": "E2E latency"}
_COLUMN_NAMES = {"request_throughput": "request throughput (req/s)",
                 "output_throughput": "output throughput (tokens/s)",
                 "total_token_throughput": "total throughput (tokens/s)", "slot_utilization": "slot utilisation",
                 "kv_utilization": "KV cache utilisation", "goodput.requests_per_s": "goodput (req/s meeting the SLO)",
                 "workload.arrival.rate": "arrival rate (req/s)"}


def readable(column: str) -> str:
    """A results.csv column as an axis says it: ttft_ms.p99 -> p99 TTFT (ms); a knob keeps its name."""
    metric, _, stat = column.partition(".")
    if metric in _METRIC_NAMES and stat:
        return f"{stat} {_METRIC_NAMES[metric]} (ms)"
    return _COLUMN_NAMES.get(column, column)


@plain_text
def sweep_plot(rows, x: str | None = None, y: str = "ttft_ms.p99", hue: str | None = None,
               title: str = "sweep") -> Figure:
    """`y` against the grid key `x`, one line per value of the grid key `hue` (default: the other
    grid key), the mean over repeats with their min-max band; log y when it spans more than a
    decade; the SLO target as a dashed line when `y` is a latency the SLO sets."""
    import pandas as pd

    keys = sweep_columns(rows)
    x = x or keys[0]
    if hue is None:
        hue = next((str(k) for k in keys if k != x), None)
    for flag, col in (("--x", x), ("--y", y)) + ((("--hue", hue),) if hue else ()):
        if col not in rows.columns:
            allowed = ", ".join(keys) if flag != "--y" else "a metric column of results.csv, e.g. ttft_ms.p99"
            raise ScenarioError(f"{flag}: {col!r} is not a column of the sweep; allowed: {allowed}")
    # runs without an error: NaN as pandas reads the table, "" as read_results gives it
    ok = rows[rows["error"].isna() | rows["error"].astype(str).eq("")] if "error" in rows else rows
    fig = Figure(figsize=(9, 5.2), layout="constrained")
    ax = fig.add_subplot()
    groups = ok.groupby(hue) if hue else [(None, ok)]
    for i, (h, part) in enumerate(groups):
        stats = part.groupby(x)[y].agg(["mean", "min", "max"]).sort_index()
        xs = pd.to_numeric(pd.Series(stats.index), errors="coerce")
        xv = xs.to_numpy() if xs.notna().all() else np.arange(len(stats))
        label = f"{hue} = {h}" if hue else y
        ax.plot(xv, stats["mean"], "o-", color=f"C{i % 10}", ms=4, label=label)
        if (stats["max"] > stats["min"]).any():
            ax.fill_between(xv, stats["min"], stats["max"], color=f"C{i % 10}", alpha=0.15)
        if not xs.notna().all():
            ax.set_xticks(xv, [str(v) for v in stats.index])
        elif len(xv) <= 12 and np.all(xv == np.round(xv)):  # a few whole-number grid values: tick those
            ax.set_xticks(xv, [str(int(v)) for v in xv])
    values = ok[y].to_numpy(float)
    values = values[np.isfinite(values) & (values > 0)]
    if len(values) and values.max() > 10 * values.min():
        ax.set_yscale("log")
    metric, _, pct = y.partition(".")
    target = f"goodput.{metric}.target"
    if target in ok and ok[target].notna().any() and pct.startswith("p"):
        slo_pct = ok.get(f"goodput.{metric}.percentile")
        t = float(ok[target].dropna().iloc[0])
        same = slo_pct is not None and float(slo_pct.dropna().iloc[0]) == float(pct[1:])
        own = "" if same or slo_pct is None else f" (at p{float(slo_pct.dropna().iloc[0]):g}, not {pct})"
        ax.axhline(t, color="red", ls="--", lw=1, label=f"SLO {metric[:-3].upper()} {t:g} ms" + own)
    ax.set_xlabel(readable(x))
    ax.set_ylabel(readable(y) + (" (log scale)" if ax.get_yscale() == "log" else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    reps = int(ok.groupby(keys).size().max()) if len(ok) else 0
    text = (f"{title}: {readable(y)} vs {readable(x)}" + (f", one line per {hue}" if hue else "")
            + (f" (mean of {reps} repeats, band: min-max)" if reps > 1 else ""))
    ax.set_title(textwrap.fill(text, 110), fontsize=10)  # long scenario and key names: two lines
    return fig


@plain_text
def save_folder_plots(folder: str | Path, out: str | Path | None = None, x: str | None = None,
                      y: str | None = None, hue: str | None = None) -> list[Path]:
    """The figures of a sweep folder (results.csv: `y` vs `x` per `hue`), a plan folder (plan.json:
    latency vs load and the engine curve) or a configuration search (search.json: cost vs latency)."""
    folder = Path(folder)
    out = Path(out) if out is not None else folder
    out.mkdir(parents=True, exist_ok=True)
    if (folder / "results.csv").is_file():
        from sim.planning.sweep import read_results  # (numbers checked: one error naming a bad cell)
        rows = read_results(folder / "results.csv")
        if not len(rows):
            raise ScenarioError(f"{folder}/results.csv: no runs yet")
        title = str(rows["scenario"].iloc[0])
        first = next((folder / "runs" / str(r) / "summary.json" for r in rows["run_id"]
                      if (folder / "runs" / str(r) / "summary.json").is_file()), None)
        if first is not None:
            title = describe(Run(title, None, None, read_summary(first)))
        fig = sweep_plot(rows, x, y or "ttft_ms.p99", hue, title)
        path = out / f"sweep_{(y or 'ttft_ms.p99').replace('.', '_')}.png"
        save_figure(fig, path, dpi=110)
        return [path]
    if (folder / "plan.json").is_file():
        from sim.planning.plan_report import _plots
        plan = read_json(folder / "plan.json", "a plan")
        with as_written(folder / "plan.json", "a plan"):
            if "static" in plan and "policy" in plan:  # a fleet plan (sim/planning/fleet_plan.py)
                from sim.planning.fleet_report import FLEET_PNG, fleet_figure
                return [save_figure(fleet_figure(plan), out / FLEET_PNG, dpi=110)]
            return _plots(plan, out)
    if (folder / "search.json").is_file():
        from sim.planning.search_report import PARETO_PNG, pareto_plot
        search = read_json(folder / "search.json", "a configuration search")
        with as_written(folder / "search.json", "a configuration search"):
            pareto = pareto_plot(search, out / PARETO_PNG)
        return [pareto] if pareto else []
    raise ScenarioError(f"{folder}: not a run, sweep, plan or search folder (no summary.json, results.csv, "
                        "plan.json or search.json)")
