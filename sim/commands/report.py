"""`servesim report`: one self-contained HTML page for a run, sweep or plan folder."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sim.config.options import argument


@dataclass(frozen=True)
class ReportRequest:
    folder: Path = field(metadata=argument("A folder written by servesim run, sweep or plan."))


def report(r: ReportRequest) -> None:
    """Write FOLDER/report.html and print its path."""
    from sim.config.errors import CommandFailed, ScenarioError, os_message
    from sim.reporting.console import out
    from sim.reporting.html_report import write_report

    try:
        if not r.folder.is_dir():
            raise ScenarioError(f"{r.folder}: not a folder")
        path = write_report(r.folder)
    except OSError as e:
        raise CommandFailed(os_message(e)) from None
    out(str(path))
