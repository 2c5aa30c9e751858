"""Interactive figures for the HTML report (hover, zoom, series toggled from the legend), drawn with
Plotly: its figures are one self-contained JavaScript library plus JSON, so a page embeds the
library once (`include_plotlyjs`, ~4.8 MB) and works offline, with no CDN; Altair / Vega-Lite would
need three libraries inlined through a converter package. Plotly's graph objects are used, not
plotly.express (no dataframe layer needed for these few traces).

    run_figures(run) -> list[Figure]                  latency CDFs, TTFT by arrival, batch and KV over time
    sweep_figures(rows, keys) -> list[Figure]         p99 latencies and throughput over the grid
    plan_figures(result) -> list[Figure]              latencies and goodput against load
    search_figures(result) -> list[Figure]            cost against p99 TTFT, per candidate

Large runs are thinned for the page (MAX_POINTS per series, said in the figure's title); the
files hold every value.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from sim.reporting.analysis import Run

MAX_POINTS = 4000  # per series: a browser draws ~10^4 SVG points smoothly; more stays in the files
LATENCIES = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2el_s", "E2E latency"))
LAYOUT = dict(template="plotly_white", height=420, margin=dict(l=60, r=20, t=60, b=50),
              legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="right", x=1),
              hovermode="closest")


def _thin(n: int) -> tuple[np.ndarray, str]:
    """Indices of at most MAX_POINTS of n, evenly spaced, and what the title says of them."""
    if n <= MAX_POINTS:
        return np.arange(n), ""
    return np.unique(np.linspace(0, n - 1, MAX_POINTS).round().astype(np.int64)), f" ({MAX_POINTS:,} of {n:,} shown)"


def _figure(title: str, **layout: Any) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.update_layout(**{**LAYOUT, **layout}, title=dict(text=title, x=0.01))
    return fig


def run_figures(run: Run) -> list:
    """A run: the latency CDFs (SLO targets drawn), each request's TTFT against its arrival, the
    batch, waiting requests and KV cache over time (per replica)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rq, steps, s = run.requests, run.steps, run.summary
    goodput: dict = s["goodput"] if isinstance(s.get("goodput"), dict) else {}
    cdf = make_subplots(rows=1, cols=3, subplot_titles=[f"{label} (ms)" for _, label in LATENCIES])
    for col, (column, label) in enumerate(LATENCIES, start=1):
        values = np.sort(rq[column].to_numpy(dtype=float)) * 1e3
        values = values[np.isfinite(values)]
        if not len(values):
            continue
        keep, _ = _thin(len(values))
        cdf.add_trace(go.Scatter(x=values[keep], y=(keep + 1) / len(values), mode="lines", name=label,
                                 hovertemplate="%{x:,.1f} ms: %{y:.1%} of requests<extra>" + label + "</extra>"),
                      row=1, col=col)
        target = (goodput.get(column.replace("_s", "_ms")) or {}).get("target")
        if target is not None:
            pct = goodput.get("percentile", 99)
            cdf.add_vline(x=target, line_dash="dash", line_color="crimson", row=1, col=col,
                          annotation_text=f"SLO p{pct:g} {target:g} ms", annotation_position="top left")
    cdf.update_yaxes(tickformat=".0%", range=[0, 1.02])
    cdf.update_yaxes(title_text="fraction of requests", row=1, col=1)
    cdf.update_layout(**LAYOUT, showlegend=False,
                      title=dict(text=f"Latency CDFs: {len(rq):,} requests", x=0.01))

    order = np.argsort(rq["arrival_s"].to_numpy(), kind="stable")
    keep, thinned = _thin(len(order))
    pick = rq.iloc[order[keep]]
    ttft = _figure(f"TTFT by arrival time{thinned}", xaxis_title="arrival (s)", yaxis_title="TTFT (ms)")
    ttft.add_trace(go.Scatter(
        x=pick["arrival_s"], y=pick["ttft_s"] * 1e3, mode="markers", marker=dict(size=4, opacity=0.6),
        customdata=np.stack([pick["request_id"], pick["prompt_tokens"], pick["output_tokens"],
                             pick["replica"]], axis=1),
        hovertemplate=("request %{customdata[0]}: TTFT %{y:,.1f} ms<br>arrived %{x:,.2f} s, replica "
                       "%{customdata[3]}<br>%{customdata[1]} prompt / %{customdata[2]} output tokens<extra></extra>"),
        name="requests"))

    over = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                         subplot_titles=["running batch (sequences)", "waiting requests", "KV cache in use"])
    thinned_any = ""
    for replica, rows in steps.groupby("replica", sort=True):
        keep, thinned = _thin(len(rows))
        if thinned:  # (said once for all replicas: each series is thinned on its own)
            thinned_any = f" (each replica's series thinned to {MAX_POINTS:,} points)"
        part = rows.iloc[keep]
        name = f"replica {int(replica)}"
        kv = part["kv_blocks_used"] / part["kv_blocks_total"].where(part["kv_blocks_total"] > 0)
        for row, y, fmt in ((1, part["num_seqs"], ",d"), (2, part["waiting"], ",d"), (3, kv, ".1%")):
            over.add_trace(go.Scatter(x=part["start_s"], y=y, mode="lines", line_shape="hv", name=name,
                                      legendgroup=name, showlegend=row == 1,
                                      hovertemplate=f"%{{x:,.2f}} s: %{{y:{fmt}}}<extra>{name}</extra>"),
                           row=row, col=1)
    over.update_yaxes(tickformat=".0%", row=3, col=1)
    over.update_xaxes(title_text="time (s)", row=3, col=1)
    over.update_layout(**{**LAYOUT, "height": 640},
                       title=dict(text=f"Batch, queue and KV cache over time{thinned_any}", x=0.01))
    figures = [cdf, ttft, over]
    if isinstance(s.get("autoscaling"), dict):  # an autoscaled fleet over the run
        figures.append(fleet_figure(run))
    return figures


def fleet_figure(run: Run) -> Any:
    """An autoscaled run (analysis.fleet_timeline): arrivals, replicas held and serving, p99 TTFT."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from sim.reporting.analysis import fleet_timeline

    f = fleet_timeline(run)
    hours = float(f["t_s"].iloc[-1]) > 7200
    x, unit = (f["t_s"] / 3600, "h") if hours else (f["t_s"], "s")
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=["arrivals (req/s)", "replicas", "p99 TTFT of each stretch's arrivals (ms)"])
    fig.add_trace(go.Scatter(x=x, y=f["arrival_rate"], mode="lines", name="arrivals",
                             hovertemplate=f"%{{x:.2f}} {unit}: %{{y:.2f}} req/s<extra></extra>"), row=1, col=1)
    for col, name in (("held", "held"), ("serving", "serving")):
        fig.add_trace(go.Scatter(x=x, y=f[col], mode="lines", line_shape="hv", name=name,
                                 hovertemplate=f"%{{x:.2f}} {unit}: %{{y}} {name}<extra></extra>"), row=2, col=1)
    fig.add_trace(go.Scatter(x=x, y=f["ttft_ms.p99"], mode="lines", name="p99 TTFT",
                             hovertemplate=f"%{{x:.2f}} {unit}: %{{y:,.0f}} ms<extra></extra>"), row=3, col=1)
    target = ((run.summary.get("goodput") or {}).get("ttft_ms") or {}).get("target")
    if target:
        fig.add_hline(y=target, line_dash="dash", line_color="crimson", row=3, col=1,
                      annotation_text=f"SLO {target:g} ms")
    fig.update_xaxes(title_text=f"time ({unit})", row=3, col=1)
    a = run.summary["autoscaling"]
    fig.update_layout(**{**LAYOUT, "height": 640},
                      title=dict(text=f"The fleet: {a['gpu_hours']:,.1f} GPU-hours, {a['mean_replicas']:.2f} replicas "
                                      f"on average, at most {a['peak_replicas']}", x=0.01))
    return fig


def sweep_figures(rows: pd.DataFrame, keys: list[str]) -> list:
    """A sweep: p99 TTFT, p99 TPOT and request throughput against its first grid key, a line per
    combination of the others (the mean over repeats)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    done = rows[rows["error"].fillna("").astype(str) == ""] if "error" in rows else rows  # (failed runs: no numbers)
    if not len(done) or not keys:
        return []
    x, rest = keys[0], keys[1:]
    metrics = [m for m in ("ttft_ms.p99", "tpot_ms.p99", "request_throughput") if m in done]
    titles = {"ttft_ms.p99": "p99 TTFT (ms)", "tpot_ms.p99": "p99 TPOT (ms)",
              "request_throughput": "throughput (req/s)"}
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=[titles[m] for m in metrics])
    groups = done.groupby(rest, sort=True, dropna=False) if rest else [((), done)]
    for i, (label, part) in enumerate(groups):
        label = label if isinstance(label, tuple) else (label,)
        name = ", ".join(f"{k}={v}" for k, v in zip(rest, label)) or "runs"
        means = part.groupby(x, sort=True)[metrics].mean(numeric_only=True)
        for col, m in enumerate(metrics, start=1):
            fig.add_trace(go.Scatter(x=means.index, y=means[m], mode="lines+markers", name=name, legendgroup=name,
                                     showlegend=col == 1, line_color=_colour(i),
                                     hovertemplate=f"{x}=%{{x}}: %{{y:,.2f}}<extra>{name}</extra>"),
                          row=1, col=col)
        for col in range(1, len(metrics) + 1):
            fig.update_xaxes(title_text=x, row=1, col=col)
    below = dict(orientation="h", x=0, xanchor="left", y=-0.22, yanchor="top")  # (above: over the titles)
    fig.update_layout(**{**LAYOUT, "legend": below, "margin": dict(l=60, r=20, t=60, b=110), "height": 460},
                      title=dict(text=f"Sweep: {len(done)} runs (mean over repeats)", x=0.01))
    return [fig]


def plan_figures(result: dict) -> list:
    """A plan: at each load the planner simulated for the scenario's setting, the SLO percentile
    of TTFT and TPOT (targets dashed) and the goodput; the answer marked."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    search = result.get("load_search") or {}
    points = sorted({p["load"]: p for p in search.get("curve") or [] if p}.values(), key=lambda p: p["load"])
    if not points:
        return []
    slo, unit = result.get("slo") or {}, search.get("unit") or "req/s"
    pct = slo.get("percentile", 99)
    fig = make_subplots(rows=1, cols=3, subplot_titles=[f"p{pct:g} TTFT (ms)", f"p{pct:g} TPOT (ms)",
                                                       "goodput (req/s meeting the SLO)"])
    loads = [p["load"] for p in points]
    met = ["met" if p["met"] else "missed" for p in points]
    for col, metric in enumerate(("ttft_ms", "tpot_ms"), start=1):
        ys = [p[metric]["slo"] for p in points]
        fig.add_trace(go.Scatter(x=loads, y=ys, mode="lines+markers",
                                 customdata=met, name=metric, showlegend=False,
                                 hovertemplate=f"%{{x:g}} {unit}: %{{y:,.1f}} ms (%{{customdata}})<extra></extra>"),
                      row=1, col=col)
        if _spans_decades(ys):  # past saturation the percentile runs to seconds: a linear axis flattens the target
            fig.update_yaxes(type="log", title_text="log scale", row=1, col=col)
        if slo.get(metric) is not None:
            fig.add_hline(y=slo[metric], line_dash="dash", line_color="crimson", row=1, col=col,
                          annotation_text=f"target {slo[metric]:g} ms")
    fig.add_trace(go.Scatter(x=loads, y=[p["goodput_rps"] for p in points], mode="lines+markers", showlegend=False,
                             hovertemplate=f"%{{x:g}} {unit}: %{{y:,.2f}} req/s<extra></extra>"), row=1, col=3)
    if search.get("answer") is not None:
        for col in (1, 2, 3):
            fig.add_vline(x=search["answer"], line_dash="dot", line_color="seagreen", row=1, col=col)
    for col in (1, 2, 3):
        fig.update_xaxes(title_text=f"load ({unit})", row=1, col=col)
    answer = f": sustained {search['answer']:.4g} {unit} (dotted)" if search.get("answer") is not None else ""
    fig.update_layout(**LAYOUT, title=dict(text=f"Latency and goodput against load{answer}", x=0.01))
    return [fig]


def search_figures(result: dict) -> list:
    """A configuration search: each candidate on the cost-latency plane as pareto.png draws it
    (search_report.candidate_point: a confirmed cluster's cost and p99 TTFT at the target, filled;
    a dearer one at the least it can cost, an open triangle), the chosen one starred; hover names
    its GPU, TP and engine setting."""
    import plotly.graph_objects as go

    from sim.planning.search_report import candidate_point

    target = result.get("target")
    with_target = target is not None
    placed = [(x, candidate_point(x, with_target)) for x in result.get("candidates") or []
              if "limits" not in str(x.get("status", ""))]
    rows = [(x, p) for x, p in placed if p is not None]
    if not rows:
        return []
    billed = any("electricity_usd_per_hour" in x for x in result.get("candidates", []))
    xlabel = (f"USD per hour for {target:g} {result.get('unit') or 'req/s'}"
              + (" (GPUs + electricity, confirmed)" if billed else "") if with_target
              else "USD per million output tokens at one replica's sustained load")
    fig = _figure("Candidates: cost against p99 TTFT (ms)", xaxis_title=xlabel,
                  yaxis_title="p99 TTFT (ms): confirmed, the cluster's at the target")
    for i, gpu in enumerate(dict.fromkeys(x["gpu"] for x, _ in rows)):
        mine = [(x, p) for x, p in rows if x["gpu"] == gpu]
        # filled where the cost is a simulated cluster's (or one replica's refined), open where it is
        # a bound; one legend entry per GPU, filled where it has a filled point (a legend marker
        # takes its trace's first symbol)
        parts = [[(x, p) for x, p in mine if p[2] in ("confirmed", "refined")],
                 [(x, p) for x, p in mine if p[2] not in ("confirmed", "refined")]]
        for filled, part in zip((True, False), parts):
            if not part:
                continue
            fig.add_trace(go.Scatter(
                x=[p[0] for _, p in part], y=[p[1] for _, p in part], mode="markers",
                name=gpu if parts[0] else f"{gpu} (none confirmed)", legendgroup=gpu,
                showlegend=filled or not parts[0],
                marker=dict(size=[10 + 4 * x["tensor_parallel_size"] for x, _ in part], color=_colour(i),
                            symbol=["circle" if filled else {"at least": "triangle-right-open",
                                                             "over the power cap": "x-open"}.get(p[2], "circle-open")
                                    for _, p in part]),
                customdata=[[x["tensor_parallel_size"], x.get("max_num_seqs"), x.get("max_num_batched_tokens"),
                             {"at least": "at least this cost; "}.get(p[2], "") + str(x.get("status") or "")]
                            for x, p in part],
                hovertemplate=(f"{gpu} TP%{{customdata[0]}}, max_num_seqs %{{customdata[1]}}, "
                               "max_num_batched_tokens %{customdata[2]}<br>%{x:,.3g} USD, p99 TTFT %{y:,.0f} ms"
                               "<br>%{customdata[3]}<extra></extra>")))
    costs, ttfts = [p[0] for _, p in rows], [p[1] for _, p in rows]
    if _spans_decades(costs):  # a far-off GPU would stretch a linear axis over the close ones
        fig.update_xaxes(type="log", title_text=f"{xlabel} (log scale)")
    if _spans_decades(ttfts):
        fig.update_yaxes(type="log")
    chosen = result.get("chosen")
    match = [p for x, p in rows if chosen and x["gpu"] == chosen.get("gpu")
             and x["tensor_parallel_size"] == chosen.get("tensor_parallel_size")]
    if match:
        fig.add_trace(go.Scatter(x=[match[0][0]], y=[match[0][1]], mode="markers",
                                 name="chosen", marker=dict(symbol="star", size=20, color="gold",
                                                            line=dict(color="black", width=1)),
                                 hoverinfo="skip"))
    return [fig]


def _spans_decades(values, ratio: float = 10.0) -> bool:
    """More than `ratio` between the largest and the smallest positive value: a log axis."""
    positive = [float(v) for v in values if v is not None and float(v) > 0]
    return len(positive) > 1 and max(positive) / min(positive) > ratio


def _colour(i: int) -> str:
    from plotly.colors import qualitative

    palette = qualitative.Plotly
    return palette[i % len(palette)]
