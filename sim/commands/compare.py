"""`servesim compare`: a measured `vllm bench serve` result beside a servesim run of the same requests."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sim.config.options import argument, option


@dataclass(frozen=True)
class CompareRequest:
    bench: Path = field(metadata=argument(
        "vllm bench serve --save-result JSON, or a BLIS trace v2 CSV of a real run (measured)."))
    run_dir: Path = field(metadata=argument(
        "A servesim run folder of the same requests (e.g. a run of a scenario with workload.trace: BENCH)."))
    out: Path | None = field(default=None, metadata=option(
        "Folder for compare.json and compare.png. \\[default: RUN_DIR]", "--out", "-o", metavar="DIR",
        show_default=False))


def compare(r: CompareRequest) -> None:
    """Write compare.json and compare.png, and print the table: measured, simulated, error."""
    import json

    from sim.config.checks import check_input_file
    from sim.config.errors import CommandFailed, os_message
    from sim.files import write_json, writing
    from sim.reporting.analysis import load_run
    from sim.reporting.compare import compare as make_table
    from sim.reporting.compare import compare_plot, measured_doc
    from sim.reporting.console import esc, fmt, out, show

    try:
        check_input_file(r.bench, "trace", str(r.bench))  # a benchmark result is read like a trace
        doc = measured_doc(r.bench)
        run = load_run(r.run_dir)
        table = make_table(doc, run)
        folder = r.out if r.out is not None else Path(r.run_dir)
        folder.mkdir(parents=True, exist_ok=True)
        with writing(folder):  # (another compare writing there: its two files, then these two)
            write_json({"bench": str(r.bench), "run": str(r.run_dir),
                        "rows": json.loads(table.to_json(orient="records"))}, folder / "compare.json")
            compare_plot(table, run, folder / "compare.png")
    except OSError as e:
        raise CommandFailed(os_message(e)) from None
    from rich.table import Table

    t = Table(title=esc(f"measured ({r.bench.name}) vs simulated ({r.run_dir})"), title_justify="left")
    for c in ("metric", "statistic", "measured", "simulated", "error"):
        t.add_column(c, justify="left" if c in ("metric", "statistic") else "right")
    for row in table.itertuples(index=False):
        t.add_row(row.metric, row.statistic, fmt(row.measured), fmt(row.simulated),
                  "-" if row.error != row.error else f"{row.error:+.1%}")
    show(t)
    out(f"output: {folder}/ (compare.json, compare.png)")
