"""servesim's command line: thin typer commands that parse options, call sim/ and print.

Heavy modules (numpy, pandas, simpy, sim/) are imported inside commands so that `servesim --help`
stays fast. Bad input (ScenarioError) is printed as one line `error: ...` with exit code 2.
"""
from __future__ import annotations

import sys
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




class _Declared:
    """A command whose options are the fields of the request it fills (their metadata:
    sim/config/options.py), read when typer builds the command line (a call, or --help), not when
    cli.py is imported, so that `import cli` loads nothing of sim/. The request's ScenarioError
    (exit 2), CommandFailed (its own code) and OSError (exit 1) end as one `error:` line."""

    __annotations__: dict = {}  # (typer reads the options from __signature__, which carries them)

    def __init__(self, request: str, job: str, name: str, doc: str | None):
        self.request, self.job = request, job  # "module:attribute"
        self.__name__, self.__doc__ = name, doc

    @staticmethod
    def _load(where: str) -> Any:
        import importlib

        module, _, attribute = where.partition(":")
        return getattr(importlib.import_module(module), attribute)

    @property
    def __signature__(self) -> Any:
        import inspect
        import typing
        from dataclasses import MISSING

        from sim.config.options import declared

        request = self._load(self.request)
        hints = typing.get_type_hints(request)
        parameters = []
        for f, o in declared(request):
            hint = hints[f.name]
            many = typing.get_origin(hint) is tuple  # (repeatable: typer takes a list, the request a tuple)
            info = typer.Argument(help=o.help, show_default=False) if o.argument else typer.Option(
                *o.names, help=o.help, metavar=o.metavar, show_default=o.show_default, min=o.min, max=o.max)
            default = None if many else inspect.Parameter.empty if f.default is MISSING else f.default
            hint = list[typing.get_args(hint)[0]] | None if many else hint  # type: ignore[misc]
            parameters.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                                annotation=Annotated[hint, info]))
        return inspect.Signature(parameters)

    def __call__(self, **values: Any) -> None:
        from sim.config.errors import CommandFailed, ScenarioError, os_message

        request = self._load(self.request)
        given = {k: tuple(v or ()) if isinstance(v, list) or v is None and isinstance(f.default, tuple) else v
                 for k, v, f in ((k, v, request.__dataclass_fields__[k]) for k, v in values.items())}
        try:
            self._load(self.job)(request(**given))
        except ScenarioError as e:
            raise _fail(str(e)) from None
        except CommandFailed as e:
            raise _fail(e.message, e.code) from None
        except OSError as e:
            raise _fail(os_message(e), code=1) from None


def _command(name: str, request: str, job: str, short_help: str, doc: str) -> None:
    """Declare `servesim NAME`: its options are `request`'s fields, `job` does it, `doc` is its help."""
    app.command(name, cls=_Command, short_help=short_help)(_Declared(request, job, name, doc))


_command("run", "sim.commands.run:RunRequest", "sim.commands.run:run",
         "Simulate one scenario: latency, throughput and utilisation.",
         """Simulate one scenario and write [bold]requests.csv[/], [bold]steps.csv[/],
    [bold]scenario.yaml[/] and [bold]summary.json[/] to the output directory.""")

_command("sweep", "sim.commands.sweep:SweepRequest", "sim.commands.sweep:sweep",
         "Every combination of --grid values, in parallel; resumable.",
         """Simulate every combination of [bold]--grid[/] values and append one row per run (its parameters
    and every summary metric) to [bold]DIR/results.csv[/] as it finishes. Interrupted? Rerun the
    same command: finished runs are skipped.""")

_command("compare", "sim.commands.compare:CompareRequest", "sim.commands.compare:compare",
         "A vllm bench serve result beside a servesim run: percentiles, errors, a plot.",
         """Put measured latencies (TTFT, TPOT, ITL, E2EL: mean, median, p99) and throughput beside the
    simulated ones, with the error of each (simulated / measured - 1).""")

_command("report", "sim.commands.report:ReportRequest", "sim.commands.report:report",
         "One self-contained HTML page for a run, sweep or plan folder.",
         """Write FOLDER/report.html, one file to share that works offline: the summary or answer,
    interactive figures (hover, zoom, series toggled), plan.md / search.md as tables, the static
    figures and the scenario. See docs/plots.md.""")

_command("export", "sim.commands.export:ExportRequest", "sim.commands.export:export",
         "A run folder as a Perfetto trace or a vllm bench serve JSON.", """Write a run in another tool's format.""")

_command("plan", "sim.planning.plan_options:PlanRequest", "sim.commands.plan:plan",
         "Sustained load under an SLO, engine setting, replicas, cost.",
         """Find the highest load one replica sustains under the SLO (seeded repeats near the boundary),
    each max_num_seqs / max_num_batched_tokens setting's own sustained load and the one with the best
    goodput, the replicas (simulated with the router) for a target load, and the cost. Writes
    [bold]plan.md[/], [bold]plan.json[/] and plots. A trace replay is searched over its
    workload.time_scale and reported in requests/s (time_scale x its native rate). A scenario with
    [bold]engine.autoscaling[/] gets a fleet plan instead: the cheapest autoscaling policy meeting the
    SLO in every window of its whole run, against the static fleet for its peak (docs/fleet.md).""")

_command("spares", "sim.commands.spares:SparesRequest", "sim.commands.spares:spares",
         "Spares (N+k) for an availability target under the scenario's faults.",
         """N = engine.replicas (the fault-free fleet); N+k replicas run under the faults for each seed,
    until the worst seed meets [bold]--availability[/]; with faults.spot, a fleet with the spares on
    spot capacity is searched too, and the cheaper one that meets it is the answer.""")

_command("capacity", "sim.commands.capacity:CapacityRequest", "sim.commands.capacity:capacity",
         "KV-cache memory budget of a model on a GPU (no simulation).",
         """The memory budget of a model on a GPU (no simulation): weights, activation reserve, KV bytes
    per token and per block, KV blocks, and how many sequences of [bold]--seq-len[/] fit at once.""")

_command("plot", "sim.commands.plot:PlotRequest", "sim.commands.plot:plot",
         "Draw a run's figures as PNGs; --compare runs side by side.",
         """Draw the standard figures of a run as PNGs: slot timeline, batch size and KV blocks over
    time, TTFT/TPOT/E2E CDFs with the SLO; with [bold]--compare[/], throughput and latency side by
    side. A sweep folder: a metric against a grid key, one line per another; a plan or search
    folder: its plots again.""")

_command("calibrate", "calibrate.command_requests:CalibrateRequest", "calibrate.command:calibrate",
         "Time a real model step over batch shapes; fit a profile.",
         """Time a real model step over a grid of batch shapes, fit the step-cost model and write a
    [bold]profile YAML[/] (for [bold]cost_model: {profile: FILE}[/]) plus the raw CSV; or, with
    [bold]--from-tables[/], compose it from published kernel timings; or, with
    [bold]--from-bench[/], fit the engine overheads on top of them to your own server's
    benchmarks. See docs/calibration.md and docs/cost_models.md.""")

_command("validate", "calibrate.command_requests:ValidateRequest", "calibrate.command:validate",
         "Real engine vs simulator on the same requests.",
         """Run the [bold]real engine[/] (a real model step under the simulator's own scheduler) and
    the simulator (cost model: --profile) on the same requests; write real/ and sim/ outputs and
    [bold]comparison.csv[/], [bold]comparison.md[/], [bold]comparison.png[/]. The two halves can run
    on different machines: [bold]--real-only[/] there, [bold]--compare-only[/] here.
    Exit code 1 when a judged row misses its tolerance (the verdict fails; the files are written).
    See docs/validation.md.""")


if __name__ == "__main__":
    app()
