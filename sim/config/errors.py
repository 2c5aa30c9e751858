"""The exceptions users see, each said in one line: a bad scenario, trace or option (ScenarioError,
exit 2) and a command that ran but failed or was interrupted (CommandFailed, its own exit code)."""
from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager


class ServesimWarning(UserWarning):
    """Something the user should know about their input that does not stop the run (e.g. arrivals
    drawn from a benchmark's request rate); the CLI prints it as one `warning: ...` line."""


class ScenarioError(ValueError):
    """Bad user input. The message is one line naming the file, the key path (or trace line) and
    what is allowed; the CLI prints it and exits with code 2, no traceback."""


class CommandFailed(Exception):
    """A command that did its work but ends in a failure (exit code 1: an SLO no configuration
    meets, requests that did not complete, a file that could not be written) or was interrupted
    (130). The CLI prints `message` as one `error: ...` line and exits with `code`."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.message, self.code = message, code


def os_message(e: OSError, where: object = None) -> str:
    """An OSError in one line: the file it concerns (else `where`, e.g. the output folder: a write
    that fails on a full disk names no file) and what went wrong."""
    return f"{e.filename or where or ''}: {e.strerror or e}".lstrip(": ")


@contextmanager
def held_warnings() -> Iterator[None]:
    """Warnings raised inside are shown only if the block ends without an exception: an input
    found bad after a warning about it is one `error:` line, not a warning and then the error.
    The warnings module still filters and de-duplicates them where they are raised (only its
    display is held back, so its filters and registries are left as they are). In the main thread
    only: the display hook is process-wide, and two threads swapping it could leave one's in place."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[tuple[tuple, dict]] = []
    show = warnings.showwarning
    warnings.showwarning = lambda *args, **kwargs: held.append((args, kwargs))  # type: ignore[assignment]
    try:
        yield
    except BaseException:
        warnings.showwarning = show  # type: ignore[assignment]
        raise
    warnings.showwarning = show  # type: ignore[assignment]
    for args, kwargs in held:
        show(*args, **kwargs)
