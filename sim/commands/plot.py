"""`servesim plot`: a run's figures as PNGs; --compare runs side by side; a sweep or plan folder's plots."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sim.config.options import argument, option


@dataclass(frozen=True)
class PlotRequest:
    run_dir: Path = field(metadata=argument(
        "A folder written by [bold]servesim run[/], [bold]sweep[/] or [bold]plan[/]."))
    compare: tuple[Path, ...] = field(default=(), metadata=option(
        "Another run directory to compare with (throughput/latency bars and overlaid CDFs). Repeatable.",
        "--compare", metavar="RUN_DIR", show_default=False))
    out: Path | None = field(default=None, metadata=option(
        "Where to write the PNGs. \\[default: RUN_DIR/plots; a sweep or plan: its folder]", "--out", "-o",
        metavar="DIR", show_default=False))
    window: str | None = field(default=None, metadata=option(
        "Slot timeline window, seconds since the first arrival, e.g. 60:120. \\[default: the whole run, or its "
        "busiest stretch of 300 requests]", metavar="START:END", show_default=False))
    x: str | None = field(default=None, metadata=option(
        "Sweep: the grid key on the x axis. \\[default: the first]", metavar="KEY", show_default=False))
    y: str | None = field(default=None, metadata=option(
        "Sweep: the metric, a results.csv column. \\[default: ttft_ms.p99]", metavar="COLUMN", show_default=False))
    hue: str | None = field(default=None, metadata=option(
        "Sweep: one line per value of this grid key. \\[default: the other grid key]", metavar="KEY",
        show_default=False))


def window_span(window: str | None) -> tuple[float, float] | None:
    """--window START:END as seconds (None: not given); ScenarioError unless 0 <= START < END."""
    from sim.config.errors import ScenarioError

    if window is None:
        return None
    a, sep, b = window.partition(":")
    try:
        span: tuple[float, float] | None = (float(a), float(b))
    except ValueError:
        span = None
    if not sep or span is None or not 0 <= span[0] < span[1]:
        raise ScenarioError(f"--window: {window!r} is not START:END seconds with 0 <= START < END, e.g. 60:120")
    return span


def plot(r: PlotRequest) -> None:
    """Draw the folder's figures and print each PNG's path."""
    from sim.config.checks import check_out_dir
    from sim.config.errors import CommandFailed, ScenarioError, os_message
    from sim.reporting.console import out
    from sim.reporting.plots import save_folder_plots, save_plots

    try:
        if r.out is not None:
            check_out_dir(r.out)
        span = window_span(r.window)
        if any((r.run_dir / f).is_file() for f in ("results.csv", "plan.json", "search.json")):
            if r.compare:
                raise ScenarioError(f"--compare: {r.run_dir} is not a run folder; --compare compares runs")
            written = save_folder_plots(r.run_dir, out=r.out, x=r.x, y=r.y, hue=r.hue)
        else:
            if any(v is not None for v in (r.x, r.y, r.hue)):
                raise ScenarioError("--x/--y/--hue: only for a sweep folder (results.csv)")
            written = save_plots(r.run_dir, compare=r.compare, out=r.out, window_s=span)
    except OSError as e:  # e.g. the output directory is not writable
        raise CommandFailed(os_message(e)) from None
    for path in written:
        out(str(path))
