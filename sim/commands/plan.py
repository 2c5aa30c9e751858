"""`servesim plan`: the plan, configuration search or fleet plan a PlanRequest asks for
(sim/planning/plan_options.py), printed and written."""
from __future__ import annotations

from sim.planning.plan_options import PlanRequest


def plan(request: PlanRequest) -> None:
    """Run the job (resumable from its journal), write its report and deploy files, print the
    answer; CommandFailed (exit 1) when the SLO is not met, after the report is written."""
    from sim.config.errors import CommandFailed, os_message
    from sim.planning.plan_request import prepare
    from sim.reporting.console import err, out, print_rows
    from sim.reporting.progress import Progress

    note = lambda text: err(f"note: {text}")  # noqa: E731
    reported = False
    try:
        job = prepare(request, note=note)
        with Progress(job.label, "simulations", enabled=not request.quiet) as progress:
            result = job.run(progress, note=None if request.quiet else note)
        title, rows, written = job.write(result)
        reported = True
        emitted = job.emit(result)
    except OSError as e:  # (a full disk: a write names no file, so the folder is named)
        kept = job.out_dir / "simulations.jsonl" if "job" in locals() else None
        where = request.emit if reported else job.out_dir if "job" in locals() else request.out
        said = ("; the plan's report was written, its deploy files not" if reported else
                f"; no plan written: the simulations done are kept in {kept}, and the same command resumes "
                "from them" if kept is not None and kept.exists() else "")
        raise CommandFailed(os_message(e, where) + said) from None
    except KeyboardInterrupt:
        kept = job.out_dir / "simulations.jsonl" if "job" in locals() else None
        raise CommandFailed("interrupted; no plan written" + (
            f": the simulations done are kept in {kept}, and the same command resumes from them"
            if kept and kept.exists() else ""), 130) from None
    if not request.quiet:
        # the vllm serve line printed whole, below the table: a table cell folds it over lines
        # that cannot be pasted back into a shell
        command = next((v for k, v in rows if k == "vllm serve" and v.startswith("vllm serve")), None)
        print_rows(title, [(k, "below the table" if v == command else v) for k, v in rows])
        if command is not None:
            out(command)
    for warning in result.get("warnings", ()):  # e.g. a trace too short for a stable p99
        err(f"warning: {warning}")
    out(str(job.out_dir) if request.quiet else f"output: {job.out_dir}/ ({written})")
    unmet = job.unmet(result)
    if emitted:
        out(f"deploy: {emitted[0].parent}/ ({', '.join(p.name for p in emitted)})")
    elif request.emit is not None and not unmet:
        err("warning: --emit: nothing to deploy (the static scheduler has no vLLM equivalent)")
    if unmet and request.searches:  # the report is written; scripts see exit status 1 (docs/planner.md)
        for line in unmet:
            err(f"  {line}")
        raise CommandFailed("no configuration meets the SLO (why each candidate was left out: above, and in "
                            "search.md)")
    if unmet:
        raise CommandFailed(unmet[0])
