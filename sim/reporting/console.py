"""What servesim prints on a terminal: the tables of a run, a sweep, a plan and the rest (rich), and
the three ways a command speaks: `out` (stdout: the answer), `err` (stderr: notes, warnings) and
`show` (a rich table on stdout). User text in a table goes through `esc`: never markup, never a raw
control character."""
from __future__ import annotations

import sys
from typing import Any


def out(text: str) -> None:
    """A line of the answer, on stdout."""
    print(text, flush=True)


def err(text: str) -> None:
    """A note or a warning, on stderr."""
    print(text, file=sys.stderr, flush=True)


def show(renderable: Any) -> None:
    """A rich table (or group of them) on stdout."""
    from rich.console import Console

    Console().print(renderable)


def fmt(v: Any, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and v != v):  # (a measurement missing: NaN in a frame)
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def summary_table(name: str, s: dict) -> Any:
    """summary.json of one run as two compact rich tables (keys that are absent are skipped)."""
    from rich.console import Group
    from rich.table import Table

    # the unit cost model makes every iteration last 1.0: times count iterations, not seconds
    unit = ((s.get("run") or {}).get("cost_model") or {}).get("name") == "unit"
    sec, ms = ("iter", "iterations") if unit else ("s", "ms")
    run = Table(title=esc(f"servesim run: {name}"), show_header=False, title_justify="left")
    run.add_column("metric")
    run.add_column("value", justify="right")
    for label, key, digits in (("completed requests", "completed", 0),
                               (f"duration ({sec if unit else 's'})", "duration_s", 2),
                               ("iterations", "iterations", 0), (f"requests/{sec}", "request_throughput", 2),
                               (f"output tokens/{sec}", "output_throughput", 1),
                               (f"total tokens/{sec}", "total_token_throughput", 1),
                               ("preemptions", "preemptions", 0)):
        if key in s:
            run.add_row(label, fmt(s[key], digits))
    for label, key in (("slot utilisation", "slot_utilization"), ("KV utilisation", "kv_utilization"),
                       ("padding waste", "padding_waste"), ("KV waste", "kv_waste"),
                       ("MFU", "mfu"), ("MBU", "mbu"), ("prefix cache hit rate", "prefix_cache_hit_rate")):
        if isinstance(s.get(key), (int, float)):
            run.add_row(label, f"{s[key]:.1%}")
    sessions = s.get("sessions")
    if isinstance(sessions, dict):  # multi-turn closed loop
        run.add_row("conversations (mean turns)", f"{sessions['conversations']:,} ({sessions['turns_mean']:.2f})")
    admission = s.get("admission")
    if isinstance(admission, dict):  # a gateway turned some away: latencies are the admitted ones'
        run.add_row("shed by the gateway", f"{admission['shed']:,} of {admission['offered']:,} "
                                           f"({admission['shed_fraction']:.1%})")
    autoscaling = s.get("autoscaling")
    if isinstance(autoscaling, dict):
        run.add_row("GPU-hours (autoscaled)", f"{autoscaling['gpu_hours']:,.2f} (${autoscaling['usd']:,.2f}); "
                                              f"{autoscaling['mean_replicas']:.2f} replicas on average, at most "
                                              f"{autoscaling['peak_replicas']}")
    _goodput_rows(run, s.get("goodput"))

    lat = Table(title=f"latency ({'1/1000 iterations: unit cost model' if unit else ms})", title_justify="left",
                header_style="bold")
    for col in ("", "mean", "p50", "p90", "p99"):
        lat.add_column(col, justify="right" if col else "left")
    for label, key in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL", "itl_ms"), ("E2E", "e2el_ms")):
        if isinstance(s.get(key), dict):
            lat.add_row(label, *(fmt(s[key].get(p), 1) for p in ("mean", "p50", "p90", "p99")))
    return Group(run, lat)


def _goodput_rows(t: Any, g: Any) -> None:
    """summary.json's goodput: requests/s meeting every SLO, and each SLO's observed percentile."""
    if not isinstance(g, dict):
        if g is not None:
            t.add_row("goodput (req/s)", fmt(g, 3))
        return
    if "requests_per_s" in g:
        t.add_row("goodput (req/s meeting the SLO)", fmt(g["requests_per_s"], 2))
    if isinstance(g.get("fraction"), (int, float)):
        t.add_row("requests meeting the SLO", f"{g['fraction']:.1%}")
    if isinstance(g.get("fraction_of_offered"), (int, float)):  # (a gateway shed some)
        t.add_row("requests meeting the SLO, of those offered", f"{g['fraction_of_offered']:.1%}")
    classes = g.get("classes") if isinstance(g.get("classes"), dict) else None
    if classes:  # workload classes, each held to its own targets: their verdicts (ITL: over all)
        for name, c in classes.items():
            if isinstance(c, dict):
                _verdict_rows(t, c, f"{esc(name)}: ", ("ttft_ms", "tpot_ms", "e2el_ms"))
        _verdict_rows(t, g, "", ("itl_ms",))
    else:
        _verdict_rows(t, g, "", ("ttft_ms", "tpot_ms"))


def _verdict_rows(t: Any, g: dict, prefix: str, keys: tuple[str, ...]) -> None:
    """A row per SLO target in `keys` that `g` judged: its percentile's observed value, met or missed."""
    for key in keys:
        slo = g.get(key)
        if isinstance(slo, dict):
            verdict = "[green]met[/]" if slo.get("met") else "[red]missed[/]"
            t.add_row(f"{prefix}SLO: p{fmt(slo.get('percentile', g.get('percentile')), 0)} {key[:-3].upper()} <= "
                      f"{_target(slo.get('target'))} ms", f"{fmt(slo.get('observed'), 1)} ms {verdict}")


def _target(v: Any) -> str:
    """An SLO target as written (500, 0.5: never rounded to 0)."""
    return f"{v:,g}" if isinstance(v, (int, float)) and v == v else fmt(v)


def sweep_table(rows: Any, keys: list[str]) -> Any:
    """One row per grid point (means over its seeds): p99 TTFT/TPOT, throughput, goodput; then one
    line per point that the simulator refused."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    metrics = [(label, col) for label, col in (
        ("p99 TTFT ms", "ttft_ms.p99"), ("p99 TPOT ms", "tpot_ms.p99"), ("req/s", "request_throughput"),
        ("output tok/s", "output_throughput"), ("goodput req/s", "goodput.requests_per_s")) if col in rows]
    points = rows.groupby(keys, sort=False, dropna=False)
    runs_per_point = points.size().max() if len(rows) else 1
    title = f"servesim sweep: {' x '.join(keys)}" + (f" (means of {runs_per_point} seeds)"
                                                    if runs_per_point > 1 else "")
    t = Table(title=esc(title), title_justify="left", header_style="bold")
    short = [k.rsplit(".", 1)[-1] for k in keys]  # max_num_seqs, rate: the title has the full keys
    for key, name in zip(keys, short):
        t.add_column(esc(name if short.count(name) == 1 else key), no_wrap=True)
    for label, _ in metrics:
        t.add_column(label, justify="right")
    refused = []
    for params, g in points:
        params = tuple(esc(p) for p in (params if isinstance(params, tuple) else (params,)))
        t.add_row(*params, *(fmt(float(g[col].mean()) if g[col].notna().any() else None,
                                  1 if "tok" in label else 2) for label, col in metrics))
        if g["error"].ne("").any():
            point = ", ".join(f"{k}={v}" for k, v in zip(keys, params))
            refused.append(Text(f"refused: {point}: {g['error'][g['error'].ne('')].iloc[0]}", style="red"))
    return Group(t, *refused)


def esc(value: object) -> str:
    """User text (model, GPU, scenario and folder names, paths, --set values) for a rich table:
    markup brackets escaped (a name holding "[/]" crashed capacity, sweep, plan and compare) and
    control characters shown as escapes, never sent to the terminal raw."""
    from rich.markup import escape

    text = str(value)
    if any(ord(c) < 32 and c not in "\n\t" or ord(c) == 127 for c in text):
        text = "".join(c if (ord(c) >= 32 and ord(c) != 127) or c in "\n\t" else repr(c)[1:-1] for c in text)
    return escape(text)


def print_rows(title: str, rows: list[tuple[str, str]]) -> None:
    """Label / value rows under a title (a plan's answer)."""
    from rich.table import Table

    t = Table(title=esc(title), show_header=False, title_justify="left")
    t.add_column("")
    t.add_column("", overflow="fold")
    for label, value in rows:  # (values carry names, paths and commands: user text, never markup)
        t.add_row(esc(label), esc(value))
    show(t)
