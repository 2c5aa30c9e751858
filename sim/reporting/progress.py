"""A progress callback for long work: a transient rich bar on a terminal, plain lines with
done/total and ETA in a log or a pipe (CI, nohup). Every command that simulates for long hands one
to sim/ as `progress(done, total=None, phase=None)`."""
from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
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

    def __enter__(self) -> Progress:
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
        line += f", {clock(elapsed)} elapsed"
        if total and 0 < done < total:
            line += f", ETA {clock(elapsed / done * (total - done))}"
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


def clock(seconds: float) -> str:
    """12 s, 3 min 05 s, 1 h 02 min."""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"
