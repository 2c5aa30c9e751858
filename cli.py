"""servesim's command line: thin typer commands that parse options, call sim/ and print.

Heavy modules (numpy, pandas, simpy, sim/) are imported inside commands so that `servesim --help`
stays fast. Bad input (ScenarioError) is printed as one line `error: ...` with exit code 2.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(
    rich_markup_mode="rich",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

PROGRESS_AFTER_S = 1.0  # show a progress bar only for runs that last longer than this (wall seconds)


@app.callback()
def main() -> None:
    """[bold]servesim[/]: a discrete-event simulator and capacity planner for LLM serving
    (vLLM-style paged KV cache; static, continuous and chunked-prefill batching).

    Scenario format and output files: README.md."""


def _fail(message: str, code: int = 2) -> typer.Exit:
    # Plain echo, not rich: rich would wrap long messages and interpret [brackets] as markup.
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


@app.command()
def run(
    scenario: Annotated[Path, typer.Argument(help="Scenario YAML, e.g. scenarios/quickstart.yaml.",
                                             show_default=False)],
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Output directory for requests.csv, steps.csv, summary.json. "
                            "\\[default: runs/<scenario name>]", metavar="DIR", show_default=False)] = None,
    seed: Annotated[int | None, typer.Option(
        help="Override the scenario's seed.", metavar="N", show_default=False)] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="Override a scenario key, e.g. [bold]--set engine.max_num_seqs=128[/]; "
                      "the value is parsed as YAML. Repeatable.", metavar="KEY=VALUE",
        show_default=False)] = None,
    quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="Print only the output directory: no progress bar, no table.")] = False,
) -> None:
    """Simulate one scenario and write [bold]requests.csv[/], [bold]steps.csv[/] and
    [bold]summary.json[/] to the output directory."""
    from sim.config import load_scenario
    from sim.errors import ScenarioError

    try:
        sc = load_scenario(scenario, overrides=set_ or (), seed=seed)
        out_dir = out if out is not None else Path("runs") / sc.name
        if out_dir.exists() and not out_dir.is_dir():
            raise ScenarioError(f"--out {out_dir}: exists and is not a directory")
        from sim.simulate import simulate, write_outputs

        with _LazyProgress(enabled=not quiet) as progress:
            result = simulate(sc, progress=progress)
        # Results live in memory until here; write_outputs writes the three files atomically, so
        # a run that fails or is interrupted leaves nothing that looks like a finished run.
        write_outputs(result, out_dir)
    except ScenarioError as e:
        raise _fail(str(e)) from None
    except OSError as e:  # e.g. the output directory is not writable
        raise _fail(f"{e.filename or ''}: {e.strerror or e}".lstrip(": "), code=1) from None
    except KeyboardInterrupt:
        raise _fail("interrupted; the run is incomplete (no summary.json written)", code=130) from None
    if not quiet:
        from rich.console import Console

        Console().print(summary_table(sc.name, result.summary))
    typer.echo(str(out_dir) if quiet else f"output: {out_dir}/ (requests.csv, steps.csv, summary.json)")


class _LazyProgress:
    """progress(done, total) callback that shows a rich bar only once a run has lasted
    PROGRESS_AFTER_S, so short runs print nothing extra. Transient: the bar vanishes at the end."""

    def __init__(self, enabled: bool = True):
        self.enabled, self.start, self.bar, self.task = enabled, time.monotonic(), None, None

    def __enter__(self) -> _LazyProgress:
        self.start = time.monotonic()
        return self

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            if time.monotonic() - self.start < PROGRESS_AFTER_S:
                return
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(TextColumn("simulating"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("requests, ETA"), TimeRemainingColumn(),
                                console=Console(stderr=True), transient=True)
            self.bar.start()
            self.task = self.bar.add_task("simulating", total=total, completed=done)
        self.bar.update(self.task, completed=done, total=total)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def summary_table(name: str, s: dict) -> Any:
    """summary.json of one run as two compact rich tables (keys that are absent are skipped)."""
    from rich.console import Group
    from rich.table import Table

    run = Table(title=f"servesim run: {name}", show_header=False, title_justify="left")
    run.add_column("metric")
    run.add_column("value", justify="right")
    for label, key, digits in (("completed requests", "completed", 0), ("duration (s)", "duration_s", 2),
                               ("iterations", "iterations", 0), ("requests/s", "request_throughput", 2),
                               ("output tokens/s", "output_throughput", 1),
                               ("total tokens/s", "total_token_throughput", 1),
                               ("preemptions", "preemptions", 0)):
        if key in s:
            run.add_row(label, _fmt(s[key], digits))
    for label, key in (("slot utilisation", "slot_utilization"), ("KV utilisation", "kv_utilization"),
                       ("padding waste", "padding_waste"), ("KV waste", "kv_waste"),
                       ("MFU", "mfu"), ("MBU", "mbu")):
        if isinstance(s.get(key), (int, float)):
            run.add_row(label, f"{s[key]:.1%}")
    _goodput_rows(run, s.get("goodput"))

    lat = Table(title="latency (ms)", title_justify="left", header_style="bold")
    for col in ("", "mean", "p50", "p90", "p99"):
        lat.add_column(col, justify="right" if col else "left")
    for label, key in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL", "itl_ms"), ("E2E", "e2el_ms")):
        if isinstance(s.get(key), dict):
            lat.add_row(label, *(_fmt(s[key].get(p), 1) for p in ("mean", "p50", "p90", "p99")))
    return Group(run, lat)


def _goodput_rows(t: Any, g: Any) -> None:
    """summary.json's goodput: requests/s meeting every SLO, and each SLO's observed percentile."""
    if not isinstance(g, dict):
        if g is not None:
            t.add_row("goodput (req/s)", _fmt(g, 3))
        return
    if "requests_per_s" in g:
        t.add_row("goodput (req/s meeting the SLO)", _fmt(g["requests_per_s"], 2))
    if isinstance(g.get("fraction"), (int, float)):
        t.add_row("requests meeting the SLO", f"{g['fraction']:.1%}")
    pct = _fmt(g.get("percentile"), 0)
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT")):
        slo = g.get(key)
        if isinstance(slo, dict):
            verdict = "[green]met[/]" if slo.get("met") else "[red]missed[/]"
            t.add_row(f"SLO: p{pct} {label} <= {_fmt(slo.get('target'), 0)} ms",
                      f"{_fmt(slo.get('observed'), 1)} ms {verdict}")


# ---- sweep (issue 4: owned by the sweep engineer) ----


# ---- plan, capacity (issue 4: owned by the planner engineer) ----


# ---- plot (issue 5: owned by the plots engineer) ----


# ---- calibrate (issue 6: owned by the calibration engineer) ----


# ---- validate (issue 6: owned by the validation engineer) ----


if __name__ == "__main__":
    app()
