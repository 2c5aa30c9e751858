"""`servesim run`: simulate one scenario and write its run folder."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sim.config.options import argument, option

PROGRESS_AFTER_S = 1.0  # show a progress bar only for runs that last longer than this (wall seconds)


@dataclass(frozen=True)
class RunRequest:
    scenario: Path = field(metadata=argument("Scenario YAML, e.g. scenarios/quickstart.yaml."))
    out: Path | None = field(default=None, metadata=option(
        "Output directory for requests.csv, steps.csv, summary.json. \\[default: runs/<scenario name>]",
        "--out", "-o", metavar="DIR", show_default=False))
    seed: int | None = field(default=None, metadata=option(
        "Override the scenario's seed.", metavar="N", show_default=False))
    overrides: tuple[str, ...] = field(default=(), metadata=option(
        "Override a scenario key, e.g. [bold]--set engine.max_num_seqs=128[/]; the value is parsed as YAML. "
        "Repeatable.", "--set", metavar="KEY=VALUE", show_default=False))
    quiet: bool = field(default=False, metadata=option(
        "Print only the output directory: no progress bar, no table.", "--quiet", "-q"))
    force: bool = field(default=False, metadata=option(
        "Run even if the estimated memory exceeds what the machine has free.", "--force"))
    trace: bool = field(default=False, metadata=option(
        "Also write trace.json, a Chrome/Perfetto trace: each replica's iterations and each request's queue, "
        "prefill and decode (open it in ui.perfetto.dev).", "--trace"))


def run(r: RunRequest) -> None:
    """Simulate, write the run folder, print the summary; CommandFailed when not every admitted
    request completed (the folder is written) or on an interruption (saying what was written)."""
    from sim.config.checks import check_out_dir
    from sim.config.errors import CommandFailed, os_message
    from sim.reporting.console import err, out
    from sim.reporting.progress import Progress
    from sim.scenario import load_scenario

    written = False  # the run's files are in out_dir: from here an interruption must not say otherwise
    trace_unwritten = r.trace
    try:
        sc = load_scenario(r.scenario, overrides=r.overrides, seed=r.seed)
        out_dir = r.out if r.out is not None else Path("runs") / sc.name
        check_out_dir(out_dir)
        from sim.simulate import check_memory, simulate, write_outputs

        check_memory(sc, r.force)

        with Progress("simulating", "requests", enabled=not r.quiet, after_s=PROGRESS_AFTER_S) as progress:
            result = simulate(sc, progress=progress)
        # Results live in memory until here; write_outputs writes the three files atomically, so
        # a run that fails or is interrupted leaves nothing that looks like a finished run.
        replaced = (out_dir / "summary.json").is_file()
        write_outputs(result, out_dir)
        written = True
        if replaced:  # (a user who meant to keep it hears it at once)
            err(f"note: replaced the earlier run in {out_dir}")
        if r.trace:
            from sim.files import write_json
            from sim.reporting.analysis import Run
            from sim.reporting.export import chrome_trace

            write_json(chrome_trace(Run.from_result(result)), out_dir / "trace.json")
            trace_unwritten = False
        if sc.cost_model.notice:  # the default fell back to an estimate: say so, once
            err(f"note: {sc.cost_model.notice}")
        for slip in sc.slips:  # (likely unit slips: the run went on as written)
            err(f"warning: {slip}")
        if not r.quiet:
            _print_summary(sc.name, result.summary)
    except OSError as e:  # e.g. the output directory is not writable, or its disk full (a write names no file)
        folder = out_dir if "out_dir" in locals() else r.out
        # a write that failed before the renames (write_outputs) left nothing: say so where no file is named
        untouched = not e.filename and not written and "out_dir" in locals()
        raise CommandFailed(os_message(e, folder) + (
            "; nothing was written (an earlier run there is untouched)" if untouched else "")) from None
    except KeyboardInterrupt as e:
        # (written_to: the signal came during write_outputs' renames, held until they were done)
        if written or getattr(e, "written_to", None) is not None:
            missing = "; trace.json was not written" if trace_unwritten else ""
            raise CommandFailed(f"interrupted, after the run was written in full to {out_dir}{missing}", 130) from None
        where = r.out if r.out is not None else "runs/<name>"
        raise CommandFailed(f"interrupted; nothing was written to {where} (an earlier run there is untouched)",
                            130) from None
    out(str(out_dir) if r.quiet else f"output: {out_dir}/ (requests.csv, steps.csv, scenario.yaml, summary.json)")
    shed = (result.summary.get("admission") or {}).get("shed", 0)  # turned away by the gateway, by design
    from sim.features.registry import FEATURES
    # (a feature's own outcome, e.g. faults' requests failed with no retry left: said in its line)
    by_design = sum(f.unfinished(result.summary[k]) for k, f in FEATURES.items() if result.summary.get(k))
    total = len(result.requests) - shed - by_design
    if result.summary["completed"] < total:  # written, but not a success
        raise CommandFailed(f"only {result.summary['completed']} of {total} admitted requests completed; see "
                            f"{out_dir}/requests.csv (empty finish_s)")
    if shed and not r.quiet:
        err(f"note: the gateway (engine.admission) turned {shed} of {len(result.requests)} requests away "
            "(requests.csv: shed)")


def _print_summary(name: str, summary: dict) -> None:
    """The summary table, then the step costs, the error band and each feature's own line."""
    from sim.cost.error_band import one_line
    from sim.cost.registry import describe
    from sim.features.registry import FEATURES
    from sim.reporting.console import out, show, summary_table

    show(summary_table(name, summary))
    out(f"step costs: {describe(summary['run']['cost_model'])}")
    out(one_line(summary.get("error_band")))
    for key, feature in FEATURES.items():  # each feature's own line (sim/features/)
        said = feature.line(summary[key]) if summary.get(key) else None
        if said:
            out(said)
