"""`servesim sweep`: every combination of --grid values, in parallel, resumable."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sim.config.options import argument, option


@dataclass(frozen=True)
class SweepRequest:
    scenario: Path = field(metadata=argument("Scenario YAML that the grid varies."))
    grid: tuple[str, ...] = field(default=(), metadata=option(
        "A scenario key and its values, e.g. [bold]--grid engine.max_num_seqs=64,128[/]; values are parsed as "
        "YAML. Repeatable: the sweep runs every combination.", "--grid", "-g", metavar="KEY=V1,V2,...",
        show_default=False))
    out: Path | None = field(default=None, metadata=option(
        "Output directory for results.csv and runs/<run id>/summary.json; rerunning into it skips the runs "
        "already there. \\[default: runs/<scenario name>-sweep]", "--out", "-o", metavar="DIR", show_default=False))
    overrides: tuple[str, ...] = field(default=(), metadata=option(
        "Override a scenario key for every run, e.g. [bold]--set workload.num_requests=500[/]. Repeatable.",
        "--set", metavar="KEY=VALUE", show_default=False))
    seed: int | None = field(default=None, metadata=option(
        "First seed (default: the scenario's).", metavar="N", show_default=False))
    repeats: int = field(default=1, metadata=option("Runs per grid point, with seeds seed, seed+1, ...",
                                                    metavar="N"))
    workers: int | None = field(default=None, metadata=option(
        "Local worker processes. \\[default: all cores]", metavar="N", show_default=False))
    cluster: str | None = field(default=None, metadata=option(
        "Run on a running Dask distributed scheduler instead, e.g. [bold]tcp://host:8786[/] (needs "
        "servesim\\[cluster] here and on the workers).", metavar="ADDRESS", show_default=False))
    force: bool = field(default=False, metadata=option("Run a sweep of more than 10,000 runs.", "--force"))
    quiet: bool = field(default=False, metadata=option(
        "Print only the results path: no progress bar, no table.", "--quiet", "-q"))


def sweep(r: SweepRequest) -> None:
    """Run the sweep into its folder (results.csv as runs finish) and print one row per grid point."""
    from sim.config.checks import check_out_dir
    from sim.config.errors import CommandFailed, os_message
    from sim.planning.sweep import parse_grid, run_sweep
    from sim.reporting.console import out, show, sweep_table
    from sim.reporting.progress import Progress
    from sim.scenario import load_scenario

    try:
        points = parse_grid(r.grid)
        out_dir = r.out if r.out is not None else (
            Path("runs") / f"{load_scenario(r.scenario, r.overrides, r.seed).name}-sweep")
        check_out_dir(out_dir)
        with Progress("sweep", "runs", enabled=not r.quiet) as progress:
            result = run_sweep(r.scenario, points, out_dir, sets=r.overrides, seed=r.seed, repeats=r.repeats,
                               workers=r.workers, cluster=r.cluster, progress=progress, force=r.force)
    except OSError as e:  # (a full disk: a write names no file, so the folder is named)
        where = out_dir if "out_dir" in locals() else r.out
        said = ("; finished runs are kept in its results.csv: rerun the same command to resume"
                if not e.filename and where is not None and (Path(where) / "results.csv").exists() else "")
        raise CommandFailed(os_message(e, where) + said) from None
    except KeyboardInterrupt:
        raise CommandFailed("interrupted; finished runs are kept in the --out folder's results.csv: "
                            "rerun the same command to resume", 130) from None
    if not r.quiet:
        show(sweep_table(result.rows, list(points)))
    out(str(result.path) if r.quiet else
        f"results: {result.path} ({result.ran} runs simulated, {result.skipped} already done)")
