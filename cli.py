"""servesim's command line: thin typer commands that parse options, call sim/ and print.

Heavy modules (numpy, pandas, simpy, sim/) are imported inside commands so that `servesim --help`
stays fast. Bad input (ScenarioError) is printed as one line `error: ...` with exit code 2.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
import typer.core

_METAVARS = {"<int>": "N", "<float>": "X", "<str>": "TEXT", "<path>": "PATH"}  # typer's type labels


def _untyped_flags(params: list, ctx: Any) -> list:
    """typer 0.29 shows every option without a metavar with its type, `<bool>` beside each flag
    (--help, --quiet) and `<str>` where a word would say more; a flag takes no value, so it shows
    none, and an option without its own metavar shows click's word for its type."""
    for p in params:
        if p.metavar is not None or getattr(p, "param_type_name", "") != "option":
            continue
        if getattr(p, "is_flag", False):
            p.metavar = ""
        elif hasattr(p, "display_type"):
            p.metavar = _METAVARS.get(p.display_type(ctx))  # (None: typer's own label stays)
    return params


class _Command(typer.core.TyperCommand):
    """Every command's help: flags without a `<bool>`."""

    def get_params(self, ctx) -> list:
        return _untyped_flags(super().get_params(ctx), ctx)


class _HelpWithPlugins(typer.core.TyperGroup):
    """`servesim --help` ends with the plug-in names, read from their registries when the help is
    shown (importing them at start-up would slow every command)."""

    def get_params(self, ctx) -> list:
        return _untyped_flags(super().get_params(ctx), ctx)

    def format_help(self, ctx, formatter) -> None:
        super().format_help(ctx, formatter)
        typer.echo(plugin_names())


def plugin_names() -> str:
    from sim.cost.registry import COST_MODELS
    from sim.runtime.routers import ROUTERS
    from sim.schedulers import SCHEDULERS
    from sim.schedulers.queues import POLICIES

    rows = (("engine.scheduler", SCHEDULERS), ("engine.router", ROUTERS), ("engine.policy", POLICIES),
            ("cost_model", COST_MODELS))
    import textwrap

    # (wrapped under the names' column: the help reads at 80 columns)
    return "Plug-ins:\n" + "\n".join(textwrap.fill(", ".join(names), 80, initial_indent=f"  {key:<17} ",
                                                    subsequent_indent=" " * 20) for key, names in rows)


app = typer.Typer(
    cls=_HelpWithPlugins,
    rich_markup_mode="rich",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion: bash, zsh, fish, PowerShell
    pretty_exceptions_show_locals=False,
)

PROGRESS_AFTER_S = 1.0  # show a progress bar only for runs that last longer than this (wall seconds)


def _print_version(value: bool) -> None:
    if value:
        import sim
        from sim.version import __version__

        # which simulator runs: compiled at install (setup.py), or the Python source (no C
        # compiler then, SERVESIM_PURE_PYTHON=1, or a compiled module edited since)
        typer.echo(f"servesim {__version__} ({'compiled' if sim.compiled() else 'pure Python'})")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[bool, typer.Option("--version", help="Print the version, and whether the "
                                          "simulator runs compiled, and exit.",
                                          callback=_print_version, is_eager=True)] = False,
) -> None:
    """[bold]servesim[/]: a discrete-event simulator and capacity planner for LLM serving
    (vLLM-style paged KV cache; static, continuous and chunked-prefill batching).

    Scenario format and output files: README.md."""


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C's KeyboardInterrupt would be, so every command's clean
    interruption path runs; main_entry turns its exit code into 143."""


_SIGNAL = {"terminated": False}


def _on_sigterm(signum, frame) -> None:
    _SIGNAL["terminated"] = True
    raise _Terminated()


def _warnings_as_lines() -> None:
    """servesim's own warnings (sim/config/errors.ServesimWarning) as one `warning: ...` line on stderr,
    once each, without Python's file and line."""
    import warnings

    from sim.config.errors import ServesimWarning

    shown = warnings.showwarning

    def show(message, category, *args, **kwargs):
        if issubclass(category, ServesimWarning):
            typer.echo(f"warning: {message}", err=True)
        else:
            shown(message, category, *args, **kwargs)
    warnings.showwarning = show


def main_entry() -> None:
    """The `servesim` console command: the typer app, with SIGINT and SIGTERM at any moment (also
    while modules import) ending in one line and exit code 130 or 143, never a traceback."""
    import signal
    import sys

    signal.signal(signal.SIGTERM, _on_sigterm)
    _warnings_as_lines()
    try:
        code = app(standalone_mode=False)
    except (KeyboardInterrupt, typer.Abort):
        typer.echo("error: interrupted; nothing was written", err=True)
        code = 130
    except MemoryError:  # (a run, a trace or a fan-out beyond this machine: one line, not a traceback)
        typer.echo("error: out of memory: this command needs more than the machine (or its ulimit) gives; "
                   "fewer requests (workload.num_requests), a shorter trace or a smaller fan-out fit", err=True)
        code = 1
    except SystemExit as e:
        code = e.code
    except Exception as e:  # click's usage errors (typer may vendor click: matched by interface)
        if not (hasattr(e, "format_message") and getattr(e, "exit_code", None) == 2):
            raise
        message = " ".join(e.format_message().split())
        if message:  # (no message: no arguments at all, and the help was shown)
            ctx = getattr(e, "ctx", None)
            hint = f" (see {ctx.command_path} --help)" if ctx is not None else ""
            typer.echo(f"error: {message}{hint}", err=True)
        code = 2
    if _SIGNAL["terminated"] and code in (1, 130):
        code = 143
    sys.exit(code if isinstance(code, int) else 0)


def _fail(message: str, code: int = 2) -> typer.Exit:
    # Plain echo, not rich: rich would wrap long messages and interpret [brackets] as markup. One
    # line, and a file name's escape bytes or newlines shown escaped, never sent to the terminal raw.
    shown = "".join(c if ord(c) >= 32 and ord(c) != 127 else repr(c)[1:-1] for c in str(message))
    typer.echo(f"error: {shown}", err=True)
    return typer.Exit(code)


@app.command(cls=_Command, short_help="Simulate one scenario: latency, throughput and utilisation.")
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
    force: Annotated[bool, typer.Option(
        "--force", help="Run even if the estimated memory exceeds what the machine has free.")] = False,
    trace: Annotated[bool, typer.Option(
        "--trace", help="Also write trace.json, a Chrome/Perfetto trace: each replica's iterations and "
                        "each request's queue, prefill and decode (open it in ui.perfetto.dev).")] = False,
) -> None:
    """Simulate one scenario and write [bold]requests.csv[/], [bold]steps.csv[/],
    [bold]scenario.yaml[/] and [bold]summary.json[/] to the output directory."""
    from sim.config.checks import check_out_dir
    from sim.config.errors import ScenarioError
    from sim.config.scenario import load_scenario

    written = False  # the run's files are in out_dir: from here an interruption must not say otherwise
    trace_unwritten = trace
    try:
        sc = load_scenario(scenario, overrides=set_ or (), seed=seed)
        out_dir = out if out is not None else Path("runs") / sc.name
        check_out_dir(out_dir)
        from sim.simulate import check_memory, simulate, write_outputs

        check_memory(sc, force)

        with _Progress("simulating", "requests", enabled=not quiet, after_s=PROGRESS_AFTER_S) as progress:
            result = simulate(sc, progress=progress)
        # Results live in memory until here; write_outputs writes the three files atomically, so
        # a run that fails or is interrupted leaves nothing that looks like a finished run.
        replaced = (out_dir / "summary.json").is_file()
        write_outputs(result, out_dir)
        written = True
        if replaced:  # (a user who meant to keep it hears it at once)
            typer.echo(f"note: replaced the earlier run in {out_dir}", err=True)
        if trace:
            from sim.reporting.analysis import Run
            from sim.reporting.export import chrome_trace

            _write_json(chrome_trace(Run.from_result(result)), out_dir / "trace.json")
            trace_unwritten = False
        if sc.cost_model.notice:  # the default fell back to an estimate: say so, once
            typer.echo(f"note: {sc.cost_model.notice}", err=True)
        for slip in sc.slips:  # (likely unit slips: the run went on as written)
            typer.echo(f"warning: {slip}", err=True)
        if not quiet:
            from rich.console import Console

            Console().print(summary_table(sc.name, result.summary))
            from sim.cost.registry import describe

            typer.echo(f"step costs: {describe(result.summary['run']['cost_model'])}")
            from sim.cost.error_band import one_line

            typer.echo(one_line(result.summary.get("error_band")))
            from sim.features.registry import FEATURES

            for key, feature in FEATURES.items():  # each feature's own line (sim/features/)
                said = feature.line(result.summary[key]) if result.summary.get(key) else None
                if said:
                    typer.echo(said)
    except ScenarioError as e:
        raise _fail(str(e)) from None
    except OSError as e:  # e.g. the output directory is not writable
        raise _fail(f"{e.filename or ''}: {e.strerror or e}".lstrip(": "), code=1) from None
    except KeyboardInterrupt as e:
        # (written_to: the signal came during write_outputs' renames, held until they were done)
        if written or getattr(e, "written_to", None) is not None:
            missing = "; trace.json was not written" if trace_unwritten else ""
            raise _fail(f"interrupted, after the run was written in full to {out_dir}{missing}",
                        code=130) from None
        where = out if out is not None else "runs/<name>"
        raise _fail(f"interrupted; nothing was written to {where} (an earlier run there is untouched)",
                    code=130) from None
    typer.echo(str(out_dir) if quiet else
               f"output: {out_dir}/ (requests.csv, steps.csv, scenario.yaml, summary.json)")
    shed = (result.summary.get("admission") or {}).get("shed", 0)  # turned away by the gateway, by design
    total = len(result.requests) - shed
    if result.summary["completed"] < total:  # written, but not a success
        raise _fail(f"only {result.summary['completed']} of {total} admitted requests completed; see "
                    f"{out_dir}/requests.csv (empty finish_s)", code=1)
    if shed and not quiet:
        typer.echo(f"note: the gateway (engine.admission) turned {shed} of {len(result.requests)} requests away "
                   "(requests.csv: shed)", err=True)


class _Progress:
    """progress(done, total=None) callback drawing a transient rich bar on stderr.

    `label` and `unit` say what is counted; total=None (an adaptive search) shows a count and the
    elapsed time instead of a bar and ETA. Nothing is drawn before `after_s` wall seconds, so short
    jobs print nothing extra. The bar is redrawn on each update with no refresh thread, so nothing
    else runs while worker processes fork or while a timed step runs."""

    def __init__(self, label: str, unit: str, *, enabled: bool = True, after_s: float = 0.0,
                 terminal: bool | None = None):
        self.label, self.unit, self.enabled, self.after_s = label, unit, enabled, after_s
        # a bar on a terminal; plain lines in a log or a pipe (None: stderr says which)
        self.terminal = sys.stderr.isatty() if terminal is None else terminal
        self.start = time.monotonic()
        self.bar: Any = None   # a rich Progress, once drawn
        self.task: Any = None

    def __enter__(self) -> _Progress:
        self.start = time.monotonic()
        return self

    LOG_EVERY_S = 30.0  # without a terminal: a line at each new phase, else at most this often,
    LOG_AFTER_S = 2.0   # ... the first once the work has lasted this long (short commands print none)

    def __call__(self, done: int, total: int | None = None, phase: str | None = None) -> None:
        """`phase` (e.g. "sizing the cluster") is shown after the label when given."""
        if not self.enabled:
            return
        if not self.terminal:  # (a log file, a pipe, CI: plain lines, done/total and ETA)
            self._log(done, total, phase)
            return
        if self.bar is None:
            if time.monotonic() - self.start < self.after_s:
                return
            self.bar = self._start(done, total)
        label = f"{self.label}: {phase}" if phase else self.label
        self.bar.update(self.task, completed=done, total=total, description=label, refresh=True)

    def _log(self, done: int, total: int | None, phase: str | None) -> None:
        now = time.monotonic()
        elapsed = now - self.start
        if elapsed < max(self.after_s, self.LOG_AFTER_S) or (phase == getattr(self, "_phase", None)
                                      and now - getattr(self, "_logged", 0.0) < self.LOG_EVERY_S):
            return
        self._phase, self._logged = phase, now
        label = f"{self.label}: {phase}" if phase else self.label
        line = f"{label}: {done:,}/{total:,} {self.unit}" if total else f"{label}: {done:,} {self.unit}"
        line += f", {_clock(elapsed)} elapsed"
        if total and 0 < done < total:
            line += f", ETA {_clock(elapsed / done * (total - done))}"
        print(line, file=sys.stderr, flush=True)

    def _start(self, done: int, total: int | None) -> Any:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        columns: tuple
        if total is None:
            columns = (TextColumn(f"{self.label}: {{task.completed}} {self.unit}"), TimeElapsedColumn())
        else:
            columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                       TextColumn(f"{self.unit}, ETA"), TimeRemainingColumn())
        bar = Progress(*columns, console=Console(stderr=True), auto_refresh=False, transient=True)
        bar.start()
        self.task = bar.add_task(self.label, total=total, completed=done)
        return bar

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()


def _clock(seconds: float) -> str:
    """12 s, 3 min 05 s, 1 h 02 min."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _fmt(v: Any, digits: int = 2) -> str:
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
    run = Table(title=_esc(f"servesim run: {name}"), show_header=False, title_justify="left")
    run.add_column("metric")
    run.add_column("value", justify="right")
    for label, key, digits in (("completed requests", "completed", 0),
                               (f"duration ({sec if unit else 's'})", "duration_s", 2),
                               ("iterations", "iterations", 0), (f"requests/{sec}", "request_throughput", 2),
                               (f"output tokens/{sec}", "output_throughput", 1),
                               (f"total tokens/{sec}", "total_token_throughput", 1),
                               ("preemptions", "preemptions", 0)):
        if key in s:
            run.add_row(label, _fmt(s[key], digits))
    for label, key in (("slot utilisation", "slot_utilization"), ("KV utilisation", "kv_utilization"),
                       ("padding waste", "padding_waste"), ("KV waste", "kv_waste"),
                       ("MFU", "mfu"), ("MBU", "mbu"), ("prefix cache hit rate", "prefix_cache_hit_rate")):
        if isinstance(s.get(key), (int, float)):
            run.add_row(label, f"{s[key]:.1%}")
    offload = s.get("kv_offloading")
    if isinstance(offload, dict):  # a CPU tier behind the GPU's prefix cache
        load = offload.get("load_ms") or {}
        run.add_row("CPU KV hit rate (offloading)", f"{offload['cpu_hit_rate']:.1%}; {offload['loads']:,} loads, "
                                                    f"p99 {_fmt(load.get('p99'), 1)} ms")
    lora = s.get("lora")
    if isinstance(lora, dict):  # multi-LoRA serving
        run.add_row("LoRA adapters", f"{lora['adapters_used']:,} used; {lora['adapter_loads']:,} loads into "
                                     f"{lora['max_loras']} slot(s) a replica")
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
    if isinstance(g.get("fraction_of_offered"), (int, float)):  # (a gateway shed some)
        t.add_row("requests meeting the SLO, of those offered", f"{g['fraction_of_offered']:.1%}")
    classes = g.get("classes") if isinstance(g.get("classes"), dict) else None
    if classes:  # workload classes, each held to its own targets: their verdicts (ITL: over all)
        for name, c in classes.items():
            if isinstance(c, dict):
                _verdict_rows(t, c, f"{_esc(name)}: ", ("ttft_ms", "tpot_ms", "e2el_ms"))
        _verdict_rows(t, g, "", ("itl_ms",))
    else:
        _verdict_rows(t, g, "", ("ttft_ms", "tpot_ms"))


def _verdict_rows(t: Any, g: dict, prefix: str, keys: tuple[str, ...]) -> None:
    """A row per SLO target in `keys` that `g` judged: its percentile's observed value, met or missed."""
    for key in keys:
        slo = g.get(key)
        if isinstance(slo, dict):
            verdict = "[green]met[/]" if slo.get("met") else "[red]missed[/]"
            t.add_row(f"{prefix}SLO: p{_fmt(slo.get('percentile', g.get('percentile')), 0)} {key[:-3].upper()} <= "
                      f"{_target(slo.get('target'))} ms", f"{_fmt(slo.get('observed'), 1)} ms {verdict}")


def _target(v: Any) -> str:
    """An SLO target as written (500, 0.5: never rounded to 0)."""
    return f"{v:,g}" if isinstance(v, (int, float)) and v == v else _fmt(v)


# ---- sweep (issue 4: owned by the sweep engineer) ----

@app.command(cls=_Command, short_help="Every combination of --grid values, in parallel; resumable.")
def sweep(
    scenario: Annotated[Path, typer.Argument(help="Scenario YAML that the grid varies.", show_default=False)],
    grid: Annotated[list[str] | None, typer.Option(
        "--grid", "-g", help="A scenario key and its values, e.g. [bold]--grid engine.max_num_seqs=64,128[/]; "
                             "values are parsed as YAML. Repeatable: the sweep runs every combination.",
        metavar="KEY=V1,V2,...", show_default=False)] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Output directory for results.csv and runs/<run id>/summary.json; rerunning "
                            "into it skips the runs already there. \\[default: runs/<scenario name>-sweep]",
        metavar="DIR", show_default=False)] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="Override a scenario key for every run, e.g. [bold]--set workload.num_requests=500[/]. "
                      "Repeatable.", metavar="KEY=VALUE", show_default=False)] = None,
    seed: Annotated[int | None, typer.Option(
        help="First seed (default: the scenario's).", metavar="N", show_default=False)] = None,
    repeats: Annotated[int, typer.Option(
        help="Runs per grid point, with seeds seed, seed+1, ...", metavar="N")] = 1,
    workers: Annotated[int | None, typer.Option(
        help="Local worker processes. \\[default: all cores]", metavar="N", show_default=False)] = None,
    cluster: Annotated[str | None, typer.Option(
        help="Run on a running Dask distributed scheduler instead, e.g. [bold]tcp://host:8786[/] "
             "(needs servesim\\[cluster] here and on the workers).", metavar="ADDRESS", show_default=False)] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Run a sweep of more than 10,000 runs.")] = False,
    quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="Print only the results path: no progress bar, no table.")] = False,
) -> None:
    """Simulate every combination of [bold]--grid[/] values and append one row per run (its parameters
    and every summary metric) to [bold]DIR/results.csv[/] as it finishes. Interrupted? Rerun the
    same command: finished runs are skipped."""
    from sim.config.checks import check_out_dir
    from sim.config.errors import ScenarioError
    from sim.config.scenario import load_scenario
    from sim.planning.sweep import parse_grid, run_sweep

    try:
        points = parse_grid(grid or ())
        out_dir = out if out is not None else (
            Path("runs") / f"{load_scenario(scenario, set_ or (), seed).name}-sweep")
        check_out_dir(out_dir)
        with _Progress("sweep", "runs", enabled=not quiet) as progress:
            result = run_sweep(scenario, points, out_dir, sets=set_ or (), seed=seed, repeats=repeats,
                               workers=workers, cluster=cluster, progress=progress, force=force)
    except ScenarioError as e:
        raise _fail(str(e)) from None
    except OSError as e:
        raise _fail(f"{e.filename or ''}: {e.strerror or e}".lstrip(": "), code=1) from None
    except KeyboardInterrupt:
        raise _fail("interrupted; finished runs are kept in the --out folder's results.csv: "
                    "rerun the same command to resume", code=130) from None
    if not quiet:
        from rich.console import Console

        Console().print(sweep_table(result.rows, list(points)))
    typer.echo(str(result.path) if quiet else
               f"results: {result.path} ({result.ran} runs simulated, {result.skipped} already done)")


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
    t = Table(title=_esc(title), title_justify="left", header_style="bold")
    short = [k.rsplit(".", 1)[-1] for k in keys]  # max_num_seqs, rate: the title has the full keys
    for key, name in zip(keys, short):
        t.add_column(_esc(name if short.count(name) == 1 else key), no_wrap=True)
    for label, _ in metrics:
        t.add_column(label, justify="right")
    refused = []
    for params, g in points:
        params = tuple(_esc(p) for p in (params if isinstance(params, tuple) else (params,)))
        t.add_row(*params, *(_fmt(float(g[col].mean()) if g[col].notna().any() else None,
                                  1 if "tok" in label else 2) for label, col in metrics))
        if g["error"].ne("").any():
            point = ", ".join(f"{k}={v}" for k, v in zip(keys, params))
            refused.append(Text(f"refused: {point}: {g['error'][g['error'].ne('')].iloc[0]}", style="red"))
    return Group(t, *refused)


# ---- plan, capacity (issue 4: owned by the planner engineer) ----

def _write_json(doc: dict, path: Path) -> None:
    """`doc` as strict JSON at `path`, through servesim's one safe writer (sim/files.py)."""
    import json

    from sim.files import write_file

    write_file(path, json.dumps(doc, allow_nan=False, separators=(",", ":")) + "\n")


@app.command(cls=_Command, short_help="A vllm bench serve result beside a servesim run: percentiles, errors, a plot.")
def compare(
    bench: Annotated[Path, typer.Argument(help="vllm bench serve --save-result JSON, or a BLIS trace v2 CSV of a "
                                              "real run (measured).", show_default=False)],
    run_dir: Annotated[Path, typer.Argument(help="A servesim run folder of the same requests (e.g. a run of a "
                                                 "scenario with workload.trace: BENCH).", show_default=False)],
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Folder for compare.json and compare.png. \\[default: RUN_DIR]", metavar="DIR",
        show_default=False)] = None,
) -> None:
    """Put measured latencies (TTFT, TPOT, ITL, E2EL: mean, median, p99) and throughput beside the
    simulated ones, with the error of each (simulated / measured - 1)."""
    import json

    from sim.config.checks import check_input_file
    from sim.config.errors import ScenarioError
    from sim.files import writing
    from sim.reporting.analysis import load_run
    from sim.reporting.compare import compare as make_table
    from sim.reporting.compare import compare_plot, measured_doc

    try:
        check_input_file(bench, "trace", str(bench))  # a benchmark result is read like a trace
        doc = measured_doc(bench)
        run = load_run(run_dir)
        table = make_table(doc, run)
        folder = out if out is not None else Path(run_dir)
        folder.mkdir(parents=True, exist_ok=True)
        with writing(folder):  # (another compare writing there: its two files, then these two)
            _write_json({"bench": str(bench), "run": str(run_dir),
                         "rows": json.loads(table.to_json(orient="records"))}, folder / "compare.json")
            compare_plot(table, run, folder / "compare.png")
    except ScenarioError as e:
        raise _fail(str(e)) from None
    except OSError as e:
        raise _fail(f"{e.filename or ''}: {e.strerror or e}".lstrip(": "), code=1) from None
    from rich.console import Console
    from rich.table import Table

    t = Table(title=_esc(f"measured ({bench.name}) vs simulated ({run_dir})"), title_justify="left")
    for c in ("metric", "statistic", "measured", "simulated", "error"):
        t.add_column(c, justify="left" if c in ("metric", "statistic") else "right")
    for row in table.itertuples(index=False):
        t.add_row(row.metric, row.statistic, _fmt(row.measured), _fmt(row.simulated),
                  "-" if row.error != row.error else f"{row.error:+.1%}")
    Console().print(t)
    typer.echo(f"output: {folder}/ (compare.json, compare.png)")


@app.command(cls=_Command, short_help="One self-contained HTML page for a run, sweep or plan folder.")
def report(
    folder: Annotated[Path, typer.Argument(help="A folder written by servesim run, sweep or plan.",
                                           show_default=False)],
) -> None:
    """Write FOLDER/report.html, one file to share that works offline: the summary or answer,
    interactive figures (hover, zoom, series toggled), plan.md / search.md as tables, the static
    figures and the scenario. See docs/plots.md."""
    from sim.config.errors import ScenarioError
    from sim.reporting.html_report import write_report

    try:
        if not folder.is_dir():
            raise ScenarioError(f"{folder}: not a folder")
        path = write_report(folder)
    except ScenarioError as e:
        raise _fail(str(e)) from None
    except OSError as e:
        raise _fail(f"{e.filename or ''}: {e.strerror or e}".lstrip(": "), code=1) from None
    typer.echo(str(path))


@app.command(cls=_Command, short_help="A run folder as a Perfetto trace or a vllm bench serve JSON.")
def export(
    run_dir: Annotated[Path, typer.Argument(help="A run folder (servesim run's output).", show_default=False)],
    to: Annotated[str, typer.Option(
        "--to", help="chrome-trace (open in ui.perfetto.dev) or vllm-bench (the layout of vllm bench serve "
                     "--save-result --save-detailed; servesim reads it back as a trace).",
        metavar="FORMAT", show_default=False)],
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Output file. \\[default: RUN_DIR/trace.json or RUN_DIR/vllm_bench.json]",
        metavar="FILE", show_default=False)] = None,
    max_requests: Annotated[int, typer.Option(
        help="chrome-trace: request tracks drawn (the first N by id).", metavar="N")] = 5000,
) -> None:
    """Write a run in another tool's format."""
    from sim.config.checks import check_out_dir
    from sim.config.errors import ScenarioError
    from sim.reporting.analysis import load_run
    from sim.reporting.export import chrome_trace, vllm_bench

    def bench(run: Any) -> dict:  # with the run's arrival process, from its scenario.yaml when it wrote one
        from sim.config.checks import load_yaml, read_text

        resolved = Path(run_dir) / "scenario.yaml"
        raw = load_yaml(read_text(resolved, "scenario"), str(resolved)) if resolved.is_file() else None
        workload = raw.get("workload") if isinstance(raw, dict) else None
        return vllm_bench(run, workload if isinstance(workload, dict) else None)

    formats = {"chrome-trace": ("trace.json", lambda r: chrome_trace(r, max_requests)),
               "vllm-bench": ("vllm_bench.json", bench)}
    try:
        if to not in formats:
            raise ScenarioError(f"--to: {to!r} is not one of {', '.join(formats)}")
        if max_requests < 0:
            raise ScenarioError(f"--max-requests: {max_requests} is not an integer >= 0")
        name, make = formats[to]
        path = out if out is not None else Path(run_dir) / name
        if path.is_dir():
            raise ScenarioError(f"--out {path}: is a folder; give the file to write, e.g. {path / name}")
        check_out_dir(path.parent)  # (a folder not there yet is made, as other commands' --out is)
        run = load_run(run_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_json(make(run), path)
    except ScenarioError as e:
        raise _fail(str(e)) from None
    except OSError as e:
        raise _fail(f"{e.filename or ''}: {e.strerror or e}".lstrip(": "), code=1) from None
    typer.echo(str(path))


def _esc(value: object) -> str:
    """User text (model, GPU, scenario and folder names, paths, --set values) for a rich table:
    markup brackets escaped (a name holding "[/]" crashed capacity, sweep, plan and compare) and
    control characters shown as escapes, never sent to the terminal raw."""
    from rich.markup import escape

    text = str(value)
    if any(ord(c) < 32 and c not in "\n\t" or ord(c) == 127 for c in text):
        text = "".join(c if (ord(c) >= 32 and ord(c) != 127) or c in "\n\t" else repr(c)[1:-1] for c in text)
    return escape(text)


def _print_rows(title: str, rows: list[tuple[str, str]]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=_esc(title), show_header=False, title_justify="left")
    t.add_column("")
    t.add_column("", overflow="fold")
    for label, value in rows:  # (values carry names, paths and commands: user text, never markup)
        t.add_row(_esc(label), _esc(value))
    Console().print(t)


@app.command(cls=_Command, short_help="Sustained load under an SLO, engine setting, replicas, cost.")
def plan(
    scenario: Annotated[Path, typer.Argument(help="Scenario YAML: a generated workload (an arrival rate, or "
                                                  "closed_loop users) or a trace replay (its load is "
                                                  "workload.time_scale).", show_default=False)],
    slo: Annotated[str | None, typer.Option(
        help="The SLO: vLLM's metric names in ms, each at its own percentile or --slo's percentile= "
             "(default 99), e.g. [bold]ttft_ms=500,tpot_ms=50[/] or [bold]ttft_ms=500@p99,itl_ms=100@p95,"
             "e2el_ms=20000[/] (keys: ttft_ms, tpot_ms, itl_ms, e2el_ms, percentile). "
             "\\[default: the scenario's slo]", metavar="KEY=V,...", show_default=False)] = None,
    target_rate: Annotated[float | None, typer.Option(
        help="Size a cluster for this many requests/s (open-loop scenarios; a trace replay runs at "
             "time_scale = R / its native rate).", metavar="R",
        show_default=False)] = None,
    target_users: Annotated[int | None, typer.Option(
        help="Size a cluster for this many concurrent users (closed-loop scenarios).", metavar="N",
        show_default=False)] = None,
    gpu_hour_usd: Annotated[float | None, typer.Option(
        help="Price of one GPU-hour in USD, of the one GPU type planned (a search over several: --price). "
             "\\[default: the hardware preset's usd_per_hour]", metavar="USD", show_default=False)] = None,
    price: Annotated[str | None, typer.Option(
        help="USD per GPU-hour per GPU type, e.g. [bold]h100-sxm=2.5,h200=3.4[/] (the others keep their "
             "preset's price).", metavar="GPU=USD,...", show_default=False)] = None,
    emit: Annotated[Path | None, typer.Option(
        help="Also write what to deploy into DIR: vllm_serve.sh, engine_args.yaml (vllm serve MODEL "
             "--config) and k8s.yaml (a Deployment of the planned replicas + a Service).", metavar="DIR",
        show_default=False)] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Output directory for plan.md, plan.json and the plots. "
                            "\\[default: runs/<scenario name>-plan]", metavar="DIR", show_default=False)] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="Override a scenario key, e.g. [bold]--set engine.scheduler=continuous[/]. Repeatable.",
        metavar="KEY=VALUE", show_default=False)] = None,
    seeds: Annotated[int, typer.Option(
        help="Seeds per load point near a target (2 first; up to twice as many while the 90% interval of the "
             "mean percentile straddles a target; 1 when the workload has no random component, e.g. a trace "
             "replay).", metavar="N")] = 4,
    resolution: Annotated[float, typer.Option(
        help="Relative step of the rate grid (a trace's time_scale grid): the answer is within this of the "
             "true boundary.", metavar="F")] = 0.02,
    horizon_s: Annotated[float | None, typer.Option(
        help="Simulated seconds of arrivals per run (generated open loop), at least --min-requests and what the "
             "SLO's percentile needs (a trace's length fixes its own). \\[default: 120]", metavar="S",
        show_default=False)] = None,
    confidence: Annotated[float, typer.Option(
        help="A confirmed cluster: a fresh run of it meets the SLO with at least this probability (a one-sided "
             "Student-t prediction bound over its seeds).", metavar="P")] = 0.9,
    headroom: Annotated[float, typer.Option(
        help="Plan for this share of the sustained load (0.8: replicas sized for target / 0.8).",
        metavar="F")] = 1.0,
    band: Annotated[bool, typer.Option(
        "--band/--no-band", help="Where the step profile carries a held-out MAPE, also search with steps "
                                 "that much slower and faster.")] = True,
    max_num_seqs: Annotated[str | None, typer.Option(
        "--max-num-seqs", help="max_num_seqs candidates, e.g. 64,128,256 (taken as given, beyond the KV cap "
                               "too). \\[default: 8..512 within the KV cap; with --gpus/--tp: the scenario's]",
        metavar="N,...", show_default=False)] = None,
    max_num_batched_tokens: Annotated[str | None, typer.Option(
        "--max-num-batched-tokens", help="max_num_batched_tokens candidates, e.g. 2048,8192. \\[default: "
                                         "512..16384 (chunked); with --gpus/--tp: the scenario's]",
        metavar="N,...", show_default=False)] = None,
    gpus: Annotated[str | None, typer.Option(
        help="Search GPU types (hardware presets), e.g. [bold]h100-sxm,h200,a100-80gb,l40s[/]: ranks every "
             "configuration by cost (docs/planner.md).", metavar="NAME,...", show_default=False)] = None,
    tp: Annotated[str | None, typer.Option(
        help="Search tensor_parallel_size values, e.g. 1,2,4,8 (with or without --gpus).",
        metavar="N,...", show_default=False)] = None,
    schedulers: Annotated[str | None, typer.Option(
        help="Configuration search: schedulers to compare, e.g. chunked,continuous.", metavar="NAME,...",
        show_default=False)] = None,
    speculative: Annotated[str | None, typer.Option(
        help="Configuration search: speculative decoding candidates, off or METHOD:K:ACCEPTANCE[:DRAFT], "
             "e.g. off,eagle:3:0.7,ngram:4:0.5.", metavar="SPEC,...", show_default=False)] = None,
    disaggregation: Annotated[str | None, typer.Option(
        help="Configuration search: layouts to compare, off (aggregated) or P:D prefill and decode replicas "
             "per unit, e.g. off,1:3,2:2 (KV over NVLink).", metavar="off,P:D,...", show_default=False)] = None,
    prefix_caching: Annotated[str | None, typer.Option(
        help="Configuration search: enable_prefix_caching values to compare: on,off.", metavar="on,off",
        show_default=False)] = None,
    pp: Annotated[str | None, typer.Option(
        help="Configuration search: pipeline_parallel_size values to compare (stages per replica, each on "
             "its own --tp GPUs), e.g. 1,2.", metavar="N,...", show_default=False)] = None,
    dp: Annotated[str | None, typer.Option(
        help="Configuration search: data_parallel_size values to compare for a MoE model (DP attention, "
             "experts over every rank's GPUs: enable_expert_parallel), e.g. 1,8.", metavar="N,...",
        show_default=False)] = None,
    kv_offloading_size: Annotated[str | None, typer.Option(
        help="Configuration search: CPU KV tier sizes to compare, GiB per replica (vLLM's --kv-offloading-size; "
             "0: none), e.g. 0,16,64.", metavar="GIB,...", show_default=False)] = None,
    all2all_backend: Annotated[str | None, typer.Option(
        "--all2all-backend",
        help="Configuration search: the data-parallel ranks' all-to-all backends to compare, vLLM's "
             "--all2all-backend names (docs/planner.md), e.g. deepep_low_latency", metavar="NAME,...",
        show_default=False)] = None,
    max_gpus: Annotated[int | None, typer.Option(
        help="Configuration search: at most this many GPUs in all.", metavar="N", show_default=False)] = None,
    budget_usd_per_hour: Annotated[float | None, typer.Option(
        help="Configuration search: at most this many USD per hour in all.", metavar="USD",
        show_default=False)] = None,
    power_cap_kw: Annotated[float | None, typer.Option(
        help="At most this many kW for the whole facility (modelled power, docs/energy.md): the search "
             "leaves out clusters over it; a plan says when its answer is over it.", metavar="KW",
        show_default=False)] = None,
    min_requests: Annotated[int, typer.Option(
        help="Requests per run, at least (a stable p99 needs ~1000); a shorter trace gets a warning, "
             "it is not repeated.", metavar="N")] = 1000,
    workers: Annotated[int | None, typer.Option(
        help="Worker processes. \\[default: all cores]", metavar="N", show_default=False)] = None,
    cluster: Annotated[str | None, typer.Option(
        help="Run the simulations on a running Dask distributed scheduler instead, e.g. "
             "[bold]tcp://host:8786[/] (needs servesim\\[cluster] here and on the workers); the same "
             "answers as a local plan.", metavar="ADDRESS", show_default=False)] = None,
    window_s: Annotated[float | None, typer.Option(
        help="A fleet plan (a scenario with engine.autoscaling): the SLO must hold in every window of this "
             "many seconds of arrivals. \\[default: 3600]", metavar="S", show_default=False)] = None,
    availability: Annotated[float | None, typer.Option(
        help="With the scenario's faults: section, also the spares (N+k) the planned cluster needs for the "
             "SLO met in this fraction of windows, e.g. 0.999 (a fleet plan: the min_replicas; docs/faults.md).",
        metavar="FRACTION",
        show_default=False)] = None,
    max_spares: Annotated[int, typer.Option(help="With --availability: the most spares tried.", metavar="K")] = 4,
    fault_seeds: Annotated[int, typer.Option(
        help="With --availability: fault seeds per fleet; the worst must meet it.", metavar="N")] = 5,
    quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="Print only the output directory: no progress, no table.")] = False,
) -> None:
    """Find the highest load one replica sustains under the SLO (seeded repeats near the boundary),
    each max_num_seqs / max_num_batched_tokens setting's own sustained load and the one with the best
    goodput, the replicas (simulated with the router) for a target load, and the cost. Writes
    [bold]plan.md[/], [bold]plan.json[/] and plots. A trace replay is searched over its
    workload.time_scale and reported in requests/s (time_scale x its native rate). A scenario with
    [bold]engine.autoscaling[/] gets a fleet plan instead: the cheapest autoscaling policy meeting the
    SLO in every window of its whole run, against the static fleet for its peak (docs/fleet.md)."""
    from sim.config.errors import ScenarioError
    from sim.planning.plan_request import PlanRequest, prepare

    request = PlanRequest(
        scenario, slo=slo, target_rate=target_rate, target_users=target_users, gpu_hour_usd=gpu_hour_usd,
        price=price, out=out, emit=emit,
        overrides=tuple(set_ or ()), seeds=seeds, resolution=resolution, horizon_s=horizon_s, confidence=confidence,
        headroom=headroom, band=band, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
        gpus=gpus, tp=tp, pp=pp, dp=dp, all2all_backend=all2all_backend, schedulers=schedulers,
        speculative=speculative, disaggregation=disaggregation,
        prefix_caching=prefix_caching, kv_offloading_size=kv_offloading_size, max_gpus=max_gpus,
        budget_usd_per_hour=budget_usd_per_hour, power_cap_kw=power_cap_kw,
        min_requests=min_requests, workers=workers, cluster=cluster, window_s=window_s,
        availability=availability, max_spares=max_spares, fault_seeds=fault_seeds)
    note = lambda text: typer.echo(f"note: {text}", err=True)  # noqa: E731
    try:
        job = prepare(request, note=note)
        with _Progress(job.label, "simulations", enabled=not quiet) as progress:
            result = job.run(progress, note=None if quiet else note)
        title, rows, written = job.write(result)
        emitted = job.emit(result)
    except ScenarioError as e:
        raise _fail(str(e)) from None
    except OSError as e:
        raise _fail(f"{e.filename or ''}: {e.strerror or e}".lstrip(": "), code=1) from None
    except KeyboardInterrupt:
        kept = job.out_dir / "simulations.jsonl" if "job" in locals() else None
        raise _fail("interrupted; no plan written" + (f": the simulations done are kept in {kept}, and the same "
                                                      "command resumes from them" if kept and kept.exists() else ""),
                    code=130) from None
    if not quiet:
        # the vllm serve line printed whole, below the table: a table cell folds it over lines
        # that cannot be pasted back into a shell
        command = next((v for k, v in rows if k == "vllm serve" and v.startswith("vllm serve")), None)
        _print_rows(title, [(k, "below the table" if v == command else v) for k, v in rows])
        if command is not None:
            typer.echo(command)
    for warning in result.get("warnings", ()):  # e.g. a trace too short for a stable p99
        typer.echo(f"warning: {warning}", err=True)
    typer.echo(str(job.out_dir) if quiet else f"output: {job.out_dir}/ ({written})")
    unmet = job.unmet(result)
    if emitted:
        typer.echo(f"deploy: {emitted[0].parent}/ ({', '.join(p.name for p in emitted)})")
    elif emit is not None and not unmet:
        typer.echo("warning: --emit: nothing to deploy (the static scheduler has no vLLM equivalent)", err=True)
    if unmet and request.searches:  # the report is written; scripts see exit status 1 (docs/planner.md)
        for line in unmet:
            typer.echo(f"  {line}", err=True)
        raise _fail("no configuration meets the SLO (why each candidate was left out: above, and in search.md)",
                    code=1)
    if unmet:
        raise _fail(unmet[0], code=1)


@app.command(cls=_Command, short_help="Spares (N+k) for an availability target under the scenario's faults.")
def spares(
    scenario: Annotated[Path, typer.Argument(help="Scenario YAML with a faults: section (docs/faults.md).",
                                             show_default=False)],
    availability: Annotated[float, typer.Option(
        help="The fraction of windows (faults.minute_s) that must meet the SLO, e.g. 0.999.", metavar="F")] = 0.999,
    seeds: Annotated[int, typer.Option(help="Fault seeds per fleet (the fault times vary, the requests do not).",
                                       metavar="N", min=1, max=100)] = 5,
    max_spares: Annotated[int, typer.Option(help="Most spares tried.", metavar="K", min=0, max=64)] = 4,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="Override a scenario key, as for [bold]run[/]. Repeatable.", metavar="KEY=VALUE",
        show_default=False)] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Also write spares.json here.", metavar="DIR", show_default=False)] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress lines.")] = False,
) -> None:
    """N = engine.replicas (the fault-free fleet); N+k replicas run under the faults for each seed,
    until the worst seed meets [bold]--availability[/]; with faults.spot, a fleet with the spares on
    spot capacity is searched too, and the cheaper one that meets it is the answer."""
    from sim.config.checks import check_out_dir
    from sim.config.errors import ScenarioError
    from sim.config.scenario import load_scenario
    from sim.planning.spares import lines, plan_spares

    try:
        sc = load_scenario(scenario, overrides=set_ or ())
        if out is not None:
            check_out_dir(out)
        with _Progress("spares", "simulations", enabled=not quiet) as progress:
            plan = plan_spares(sc, availability, seeds, max_spares, progress=lambda d, t, _eta: progress(d, t))
    except ScenarioError as e:
        raise _fail(str(e)) from None
    for line in lines(plan):
        typer.echo(line)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        from sim.simulate import finite

        _write_json(finite(plan), out / "spares.json")
        typer.echo(f"wrote {out / 'spares.json'}")


@app.command(cls=_Command, short_help="KV-cache memory budget of a model on a GPU (no simulation).")
def capacity(
    model: Annotated[str | None, typer.Option(
        help="A model preset (e.g. llama-3-8b) or a path to a Hugging Face config.json.", metavar="NAME",
        show_default=False)] = None,
    gpu: Annotated[str | None, typer.Option(help="A hardware preset, e.g. h100-sxm.", metavar="NAME",
                                            show_default=False)] = None,
    tp: Annotated[int | None, typer.Option(
        "--tp", help="Tensor-parallel size (GPUs per replica). \\[default: 1]", metavar="N",
        show_default=False)] = None,
    seq_len: Annotated[int, typer.Option(help="Tokens per sequence (prompt + output) for the "
                                              "concurrent-sequences row.", metavar="N")] = 4096,
    gpu_memory_utilization: Annotated[float | None, typer.Option(
        help="Fraction of GPU memory for the engine. \\[default: 0.9]", metavar="F", show_default=False)] = None,
    block_size: Annotated[int | None, typer.Option(
        help="Tokens per KV block. \\[default: 16]", metavar="N", show_default=False)] = None,
    max_num_batched_tokens: Annotated[int | None, typer.Option(
        help="Token budget per iteration (sets the activation reserve). \\[default: 8192]", metavar="N",
        show_default=False)] = None,
    pp: Annotated[int | None, typer.Option(
        "--pp", help="Pipeline stages (the busiest stage's GPU is shown). \\[default: 1]", metavar="N",
        show_default=False)] = None,
    dp: Annotated[int | None, typer.Option(
        "--dp", help="Data-parallel ranks of a MoE model sharing one expert-parallel group (with --ep). "
                     "\\[default: 1]", metavar="N", show_default=False)] = None,
    ep: Annotated[bool | None, typer.Option(
        "--ep/--no-ep", help="Expert parallelism: each routed expert whole on one GPU of the group. "
                             "\\[default: off]", show_default=False)] = None,
    scenario: Annotated[Path | None, typer.Option(
        help="Take the model, GPU and engine settings from this scenario (options above override them).",
        metavar="FILE", show_default=False)] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print the budget as JSON.")] = False,
) -> None:
    """The memory budget of a model on a GPU (no simulation): weights, activation reserve, KV bytes
    per token and per block, KV blocks, and how many sequences of [bold]--seq-len[/] fit at once."""
    import json

    from sim.config.errors import ScenarioError
    from sim.reporting.capacity import capacity_table

    try:
        title, rows = capacity_table(model, gpu, tp, seq_len, gpu_memory_utilization, block_size,
                                     max_num_batched_tokens, scenario, pp=pp, dp=dp, ep=ep)
    except ScenarioError as e:
        raise _fail(str(e)) from None
    if json_:
        typer.echo(json.dumps({key: value for key, _, value, _ in rows}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=_esc(title), title_justify="left", show_header=False)
    t.add_column("")
    t.add_column("", justify="right")
    for _, label, _value, shown in rows:
        t.add_row(_esc(label), _esc(shown))
    Console().print(t)


# ---- plot (issue 5: owned by the plots engineer) ----

@app.command(cls=_Command, short_help="Draw a run's figures as PNGs; --compare runs side by side.")
def plot(
    run_dir: Annotated[Path, typer.Argument(help="A folder written by [bold]servesim run[/], "
                                                 "[bold]sweep[/] or [bold]plan[/].", show_default=False)],
    compare: Annotated[list[Path] | None, typer.Option(
        "--compare", help="Another run directory to compare with (throughput/latency bars and "
                          "overlaid CDFs). Repeatable.", metavar="RUN_DIR", show_default=False)] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Where to write the PNGs. \\[default: RUN_DIR/plots; a sweep or plan: its folder]",
        metavar="DIR", show_default=False)] = None,
    window: Annotated[str | None, typer.Option(
        help="Slot timeline window, seconds since the first arrival, e.g. 60:120. \\[default: the whole run, "
             "or its busiest stretch of 300 requests]", metavar="START:END", show_default=False)] = None,
    x: Annotated[str | None, typer.Option(help="Sweep: the grid key on the x axis. \\[default: the first]",
                                          metavar="KEY", show_default=False)] = None,
    y: Annotated[str | None, typer.Option(help="Sweep: the metric, a results.csv column. \\[default: ttft_ms.p99]",
                                          metavar="COLUMN", show_default=False)] = None,
    hue: Annotated[str | None, typer.Option(help="Sweep: one line per value of this grid key. "
                                                 "\\[default: the other grid key]", metavar="KEY",
                                            show_default=False)] = None,
) -> None:
    """Draw the standard figures of a run as PNGs: slot timeline, batch size and KV blocks over
    time, TTFT/TPOT/E2E CDFs with the SLO; with [bold]--compare[/], throughput and latency side by
    side. A sweep folder: a metric against a grid key, one line per another; a plan or search
    folder: its plots again."""
    from sim.config.checks import check_out_dir
    from sim.config.errors import ScenarioError
    from sim.reporting.plots import save_folder_plots, save_plots

    try:
        if out is not None:
            check_out_dir(out)
        span = None
        if window is not None:
            a, sep, b = window.partition(":")
            try:
                span = (float(a), float(b))
            except ValueError:
                span = None
            if not sep or span is None or not 0 <= span[0] < span[1]:
                raise ScenarioError(f"--window: {window!r} is not START:END seconds with 0 <= START < END, e.g. 60:120")
        if any((run_dir / f).is_file() for f in ("results.csv", "plan.json", "search.json")):
            if compare:
                raise ScenarioError(f"--compare: {run_dir} is not a run folder; --compare compares runs")
            written = save_folder_plots(run_dir, out=out, x=x, y=y, hue=hue)
        else:
            if any(v is not None for v in (x, y, hue)):
                raise ScenarioError("--x/--y/--hue: only for a sweep folder (results.csv)")
            written = save_plots(run_dir, compare=compare or (), out=out, window_s=span)
    except ScenarioError as e:
        raise _fail(str(e)) from None
    except OSError as e:  # e.g. the output directory is not writable
        raise _fail(f"{e.filename or ''}: {e.strerror or e}".lstrip(": "), code=1) from None
    for path in written:
        typer.echo(str(path))



# ---- calibrate (issue 6: owned by the calibration engineer) ----


@app.command("calibrate", cls=_Command, short_help="Time a real model step over batch shapes; fit a profile.")
def calibrate_cmd(
    model: Annotated[str, typer.Option(help="Model preset built with random weights, e.g. "
                                            "[bold]llama-3-8b[/] (GPU) or [bold]tiny[/] (CPU).",
                                       show_default=False)],
    out: Annotated[Path, typer.Option(
        "--out", "-o", help="Profile YAML to write; the raw measurements go next to it (.csv).",
        metavar="FILE", show_default=False)],
    device: Annotated[str | None, typer.Option(
        help="cpu, cuda or cuda:N. \\[default: cuda if available, else cpu]",
        show_default=False)] = None,
    grid: Annotated[str | None, typer.Option(
        help="Batch-shape grid: small or full. \\[default: full on cuda, small on cpu]",
        show_default=False)] = None,
    repeats: Annotated[int | None, typer.Option(
        help="Rounds over the grid, each in a fresh random order. \\[default: 6 on cuda, 8 on cpu]",
        show_default=False)] = None,
    burst: Annotated[int | None, typer.Option(
        help="Timed steps per shape and round, run back to back after one left-out step; the "
             "median of all is fitted. \\[default: 3]", show_default=False)] = None,
    warmup: Annotated[int | None, typer.Option(
        help="Untimed steps per shape first. \\[default: 3]", show_default=False)] = None,
    seed: Annotated[int, typer.Option(help="Seeds weights, token ids, block layout, held-out "
                                           "shapes and the run order.")] = 0,
    attention: Annotated[str | None, typer.Option(
        help="triton (paged kernels) or torch (gather + SDPA). \\[default: triton on cuda, "
             "torch on cpu]", show_default=False)] = None,
    from_tables: Annotated[Path | None, typer.Option(
        "--from-tables", help="Build the profile from published kernel timings instead of timing "
                              "a GPU: a tables folder, e.g. [bold]sim/tables/h100_sxm[/] "
                              "(no torch needed). --model may then be a preset or a HF "
                              "config.json.", metavar="DIR", show_default=False)] = None,
    gpu: Annotated[str | None, typer.Option(
        help="With --from-tables: the hardware preset the tables were measured on.",
        show_default=False)] = None,
    tp: Annotated[int, typer.Option("--tp", help="With --from-tables: tensor-parallel size.")] = 1,
    from_runs: Annotated[list[Path] | None, typer.Option(
        "--from-runs", help="Fit the profile on the iterations that [bold]servesim validate[/] "
                            "recorded (its output folder or real/; e.g. real vLLM runs). "
                            "Repeatable: several workloads cover more batch shapes.",
        metavar="DIR", show_default=False)] = None,
    from_bench: Annotated[list[Path] | None, typer.Option(
        "--from-bench", help="Fit the engine overheads (request handling, per-iteration host and "
                             "sync time, scheduling lag) to [bold]vllm bench serve --save-result "
                             "--save-detailed[/] results of your server: --model, --gpu, --tp and "
                             "--set engine.KEY=VALUE describe it. Repeatable (several loads).",
        metavar="JSON", show_default=False)] = None,
    sets: Annotated[list[str] | None, typer.Option(
        "--set", help="With --from-bench: a scenario key of your server's engine, e.g. "
                      "engine.max_num_seqs=128 (repeatable).", metavar="KEY=VALUE", show_default=False)] = None,
    base_profile: Annotated[Path | None, typer.Option(
        "--profile", help="With --from-bench: the step costs to fit on top of, instead of the GPU's "
                          "kernel tables: a profile of your engine's own iterations (calibrate "
                          "--from-runs or --device: the iterations hold the host work, so no host "
                          "floor is fitted on top), or a kernel-table one.",
        metavar="FILE", show_default=False)] = None,
) -> None:
    """Time a real model step over a grid of batch shapes, fit the step-cost model and write a
    [bold]profile YAML[/] (for [bold]cost_model: {profile: FILE}[/]) plus the raw CSV; or, with
    [bold]--from-tables[/], compose it from published kernel timings; or, with
    [bold]--from-bench[/], fit the engine overheads on top of them to your own server's
    benchmarks. See docs/calibration.md and docs/cost_models.md."""
    if base_profile is not None and not from_bench:
        raise _fail("--profile is the base of --from-bench's fit; give --from-bench RESULT.json too")
    if from_bench:
        return _calibrate_from_bench(from_bench, model, gpu, tp, tuple(sets or ()), out, base_profile)
    if from_tables is not None:
        return _calibrate_from_tables(from_tables, model, gpu, tp, out)
    if from_runs:
        return _calibrate_from_runs(from_runs, model, out)
    try:
        import torch
    except ImportError:
        raise _fail("calibrate needs torch (and triton on CUDA): pip install -e '.[gpu]'") from None
    from calibrate.harness import CalibrationError, calibrate

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        torch.set_num_threads(1)  # small CPU ops gain nothing from threads; steadier timings
    try:
        with _Progress("calibrating", "steps") as progress:
            result = calibrate(model, device, out, grid=grid, repeats=repeats, burst=burst,
                               warmup=warmup, seed=seed, attention=attention, progress=progress,
                               log=lambda line: typer.echo(line, err=True))
    except CalibrationError as e:
        raise _fail(str(e)) from None
    except KeyboardInterrupt:
        raise _fail("interrupted; no profile written", code=130) from None
    mape, worst = result["heldout_mape"], result["heldout_max_error"]
    held = "no held-out shapes" if mape is None else f"held-out MAPE {mape:.1%}, max {worst:.1%}"
    typer.echo(f"profile: {result['profile']} ({result['shapes']} shapes in "
               f"{result['wall_s']:.0f} s; fit MAPE {result['fit_mape']:.1%}, {held})")
    typer.echo(f"measurements: {result['csv']}")


def _calibrate_from_runs(runs: list[Path], model: str, out: Path) -> None:
    from sim.config.errors import ScenarioError

    try:
        from calibrate.fit import write_profile
        from calibrate.vllm_engine import fit_runs

        _, meta, fit = fit_runs(runs, model)
        write_profile(out, fit, meta)
    except ScenarioError as e:
        raise _fail(str(e)) from None
    except OSError as e:
        raise _fail(f"{e.filename or ''}: {e.strerror or e}".lstrip(": ")) from None
    typer.echo(f"profile: {out} ({meta['notes']}; held-out MAPE {meta['heldout_mape']:.1%}, "
               f"max {meta['heldout_max_error']:.1%})")


def _calibrate_from_bench(benches: list[Path], model: str, gpu: str | None, tp: int,
                          sets: tuple[str, ...], out: Path, base: Path | None = None) -> None:
    from calibrate.overheads import (
        FIT_METRICS,
        base_of_another_preset,
        bench_model,
        bench_profile,
        bench_warnings,
        fit_bench,
        write_bench_profile,
    )
    from sim.config.errors import ScenarioError

    try:
        model_value = bench_model(benches, model, gpu, tp, sets, base)
        assert gpu is not None  # (checked by bench_model)
        with _Progress("fitting overheads", "grid points") as progress:
            result = fit_bench(benches, model_value, gpu, tp, sets, profile=base, tick=progress)
        write_bench_profile(bench_profile(result, benches), out)
    except ScenarioError as e:
        raise _fail(str(e)) from None
    except OSError as e:
        raise _fail(f"{e.filename or ''}: {e.strerror or e}".lstrip(": ")) from None
    label = {"ttft_p50_ms": "TTFT p50", "tpot_mean_ms": "TPOT mean", "e2e_p50_s": "E2E p50"}
    unit = {"ttft_p50_ms": "ms", "tpot_mean_ms": "ms", "e2e_p50_s": "s"}  # (the fit's keys carry their unit)
    for before, after in zip(result["before"], result["after"]):
        cells = "; ".join(f"{label[k]} {after.real[k]:.4g} {unit[k]} real, error {before.error[k]:+.1%} -> "
                          f"{after.error[k]:+.1%}" for k in FIT_METRICS)
        typer.echo(f"{before.name}: {cells}")
    mismatch = base_of_another_preset(result["scenario"]) if base is not None else None
    if mismatch:
        typer.echo(f"warning: --profile {base} was fitted on the preset {mismatch!r}, whose shape is not "
                   f"--model's ({result['scenario'].model.name}): its step times are another model's", err=True)
    for _, held in result["held_out"]:
        cells = "; ".join(f"{label[k]} {held.error[k]:+.1%}" for k in FIT_METRICS)
        typer.echo(f"held out, fitted on the other runs: {held.name}: {cells}")
    p = result["params"]
    typer.echo("fitted: " + ", ".join(f"{k} {v}" for k, v in p.items())
               + (f" (on top of the iterations of {base})" if base is not None else ""))
    which = ("the held-out error above" if result["held_out"] else
             "the error above, on the run it was fitted on (give two or more runs for a held-out one)")
    typer.echo(f"profile: {out} (use it as cost_model: {{profile: {out}}}; the plan's error band is {which})")
    for line in bench_warnings(result):
        typer.echo(f"warning: {line}", err=True)


def _calibrate_from_tables(tables: Path, model: str, gpu: str | None, tp: int, out: Path) -> None:
    from calibrate.measured import profile_from_tables, write_profile
    from sim.config.errors import ScenarioError

    try:
        doc, spec = profile_from_tables(tables, model, gpu, tp)
        write_profile(doc, out)
    except ScenarioError as e:
        raise _fail(str(e)) from None
    meta = doc["metadata"]
    typer.echo(f"profile: {out} ({spec.name} on {gpu}, tp {tp}; the profile reproduces the tables' own "
               f"composition within {meta['heldout_max_error']:.2%} on held-out shapes (mean "
               f"{meta['heldout_mape']:.2%}): a check of the profile, not of accuracy against a real server, "
               "which docs/validation.md reports)")


# ---- validate (issue 6: owned by the validation engineer) ----


@app.command("validate", cls=_Command, short_help="Real engine vs simulator on the same requests.")
def validate_cmd(
    scenario: Annotated[Path, typer.Argument(help="Scenario YAML (continuous or chunked, one "
                                                  "replica), e.g. scenarios/validate-tiny-cpu.yaml.",
                                             show_default=False)],
    profile: Annotated[Path | None, typer.Option(
        help="Step-cost profile YAML (from [bold]servesim calibrate[/]) for the simulator; it "
             "replaces the scenario's cost_model. Optional with --real-only (it then sets the "
             "dtype and is recorded).", metavar="FILE", show_default=False)] = None,
    device: Annotated[str | None, typer.Option(
        help="Where the real engine runs: cpu, cuda or cuda:N. \\[default: cpu]",
        show_default=False)] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", "-o", help="Output directory. \\[default: runs/validate-<scenario name>; with "
                            "--compare-only, its REAL_DIR]", metavar="DIR", show_default=False)] = None,
    clock: Annotated[str | None, typer.Option(
        help="wall (real time) or cpu (the engine thread's CPU seconds, idle time skipped: "
             "steady on a shared machine). \\[default: cpu on cpu, wall on cuda]",
        show_default=False)] = None,
    seed: Annotated[int | None, typer.Option(
        help="Override the scenario's seed.", metavar="N", show_default=False)] = None,
    set_: Annotated[list[str] | None, typer.Option(
        "--set", help="Override a scenario key, as for [bold]run[/]. Repeatable.",
        metavar="KEY=VALUE", show_default=False)] = None,
    real_only: Annotated[bool, typer.Option(
        "--real-only", help="Run only the real engine and write DIR/real/ (no simulator, no "
                            "simpy: for a GPU machine); compare later with --compare-only.")] = False,
    compare_only: Annotated[Path | None, typer.Option(
        "--compare-only", help="Skip the real engine: read the real run that --real-only wrote "
                               "to REAL_DIR, simulate the same requests and compare.",
        metavar="REAL_DIR", show_default=False)] = None,
    warmup_fraction: Annotated[float, typer.Option(
        help="Latency percentiles leave out this share of the first requests by arrival (they meet an "
             "empty engine).", metavar="F")] = 0.1,
    engine: Annotated[str, typer.Option(
        help="servesim (our engine: a real model step under the simulator's scheduler) or vllm "
             "(real vLLM on the CPU, in its own venv; the simulator's profile is fitted on vLLM's "
             "own iterations unless --profile).", metavar="NAME")] = "servesim",
    setup: Annotated[bool, typer.Option(
        "--setup", help="With --engine vllm: build the vLLM venv first if it is missing "
                        "(calibrate/vllm_setup.sh, ~2 min, ~3.4 GB).")] = False,
    vllm_venv: Annotated[Path | None, typer.Option(
        help="The vLLM virtualenv. \\[default: $SERVESIM_VLLM_VENV or .vllm-venv in the repository]",
        metavar="DIR", show_default=False)] = None,
) -> None:
    """Run the [bold]real engine[/] (a real model step under the simulator's own scheduler) and
    the simulator (cost model: --profile) on the same requests; write real/ and sim/ outputs and
    [bold]comparison.csv[/], [bold]comparison.md[/], [bold]comparison.png[/]. The two halves can run
    on different machines: [bold]--real-only[/] there, [bold]--compare-only[/] here.
    Exit code 1 when a judged row misses its tolerance (the verdict fails; the files are written).
    See docs/validation.md."""
    try:
        import torch  # noqa: F401  (said here, before anything loads)
    except ImportError:
        raise _fail("validate needs torch: pip install -e '.[gpu]'") from None
    from calibrate.validation_job import ValidateRequest, run_validation
    from sim.config.errors import ScenarioError

    request = ValidateRequest(scenario, profile=profile, engine=engine, device=device, clock=clock, out=out,
                              seed=seed, overrides=tuple(set_ or ()), real_only=real_only, compare_only=compare_only,
                              warmup_fraction=warmup_fraction, setup=setup, venv=vllm_venv)
    try:
        outcome = run_validation(request, progress=_Progress, say=lambda text: typer.echo(text, err=True))
    except ScenarioError as e:
        raise _fail(str(e)) from None
    except ModuleNotFoundError as e:
        if e.name != "simpy":
            raise
        raise _fail("the simulator half needs simpy, which is not installed here: run the real "
                    "engine alone with --real-only, then --compare-only where simpy is") from None
    except OSError as e:
        raise _fail(f"{e.filename or ''}: {e.strerror or e}".lstrip(": "), code=1) from None
    except KeyboardInterrupt:
        raise _fail("interrupted; the output is incomplete (no comparison.md / real/run.json "
                    "written)", code=130) from None
    if outcome.result is not None:
        from rich.console import Console

        Console().print(_comparison_table(outcome.scenario.name, outcome.result))
        for note in outcome.result.notes:  # (also in comparison.md) what makes the verdict worth less
            if note.startswith("warning:"):
                typer.echo(note, err=True)
    typer.echo(outcome.message)
    from calibrate.comparison import passed, verdict

    if outcome.result is not None and not passed(outcome.result.comparison):  # written, but a failed check
        raise _fail(f"verdict: {verdict(outcome.result.comparison)}", code=1)


def _comparison_table(name: str, result: Any) -> Any:
    from rich.table import Table

    t = Table(title=_esc(f"servesim validate: {name}"), caption="error = (simulated - real) / real; "
              "latencies in ms", title_justify="left", caption_justify="left", header_style="bold")
    from calibrate.comparison import verdict

    for col in ("metric", "stat", "real", "simulated", "error", "tolerance"):
        t.add_column(col, justify="left" if col in ("metric", "stat") else "right")
    for row in result.comparison.itertuples():
        tol = "" if row.tolerance_pct != row.tolerance_pct else \
            f"±{row.tolerance_pct:g}% " + ("[green]ok[/]" if row.within else "[red]MISS[/]")
        t.add_row(row.metric, row.stat, _fmt(row.real, 2), _fmt(row.sim, 2), f"{row.error_pct:+.1f}%", tol)
    t.caption += f"\nverdict: {verdict(result.comparison)}"
    return t


if __name__ == "__main__":
    app()
