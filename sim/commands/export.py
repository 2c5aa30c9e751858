"""`servesim export`: a run folder in another tool's format."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.config.options import argument, option


@dataclass(frozen=True)
class ExportRequest:
    run_dir: Path = field(metadata=argument("A run folder (servesim run's output)."))
    to: str = field(metadata=option(
        "chrome-trace (open in ui.perfetto.dev) or vllm-bench (the layout of vllm bench serve --save-result "
        "--save-detailed; servesim reads it back as a trace).", "--to", metavar="FORMAT", show_default=False))
    out: Path | None = field(default=None, metadata=option(
        "Output file. \\[default: RUN_DIR/trace.json or RUN_DIR/vllm_bench.json]", "--out", "-o", metavar="FILE",
        show_default=False))
    max_requests: int = field(default=5000, metadata=option(
        "chrome-trace: request tracks drawn (the first N by id).", metavar="N"))


def export(r: ExportRequest) -> None:
    """Write the run as --to's format and print the file's path."""
    from sim.config.checks import check_out_dir
    from sim.config.errors import CommandFailed, ScenarioError, os_message
    from sim.files import write_json
    from sim.reporting.analysis import load_run
    from sim.reporting.console import out
    from sim.reporting.export import chrome_trace

    formats = {"chrome-trace": ("trace.json", lambda run: chrome_trace(run, r.max_requests)),
               "vllm-bench": ("vllm_bench.json", lambda run: _bench(run, r.run_dir))}
    try:
        if r.to not in formats:
            raise ScenarioError(f"--to: {r.to!r} is not one of {', '.join(formats)}")
        if r.max_requests < 0:
            raise ScenarioError(f"--max-requests: {r.max_requests} is not an integer >= 0")
        name, make = formats[r.to]
        path = r.out if r.out is not None else Path(r.run_dir) / name
        if path.is_dir():
            raise ScenarioError(f"--out {path}: is a folder; give the file to write, e.g. {path / name}")
        check_out_dir(path.parent)  # (a folder not there yet is made, as other commands' --out is)
        run = load_run(r.run_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(make(run), path)
    except OSError as e:
        raise CommandFailed(os_message(e)) from None
    out(str(path))


def _bench(run: Any, run_dir: Path) -> dict:
    """vllm bench serve's layout, with the run's arrival process from its scenario.yaml when it wrote one."""
    from sim.config.checks import load_yaml, read_text
    from sim.reporting.export import vllm_bench

    resolved = Path(run_dir) / "scenario.yaml"
    raw = load_yaml(read_text(resolved, "scenario"), str(resolved)) if resolved.is_file() else None
    workload = raw.get("workload") if isinstance(raw, dict) else None
    return vllm_bench(run, workload if isinstance(workload, dict) else None)
