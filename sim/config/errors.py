"""The one exception type users see: a bad scenario, trace or option, said in one line."""
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
