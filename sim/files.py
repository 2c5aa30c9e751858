"""Every file servesim writes goes through `write_file` (figures through `save_figure`).

A run, plan or sweep folder may be shared, and may hold what someone else put there: a link named
like an output (`plan.json`, `plots/latency_cdf.png`) pointing at a file of the user's, or a link
named like a temporary. So a file is written

* to a temporary created exclusively beside it (`tempfile.mkstemp`: a random name, O_EXCL, never
  an existing file or link),
* with the mode of the file it replaces when that is a regular file (read with lstat: a link's
  target is never read), else the mode the user's umask gives a new file,
* then renamed over the target (`os.replace` replaces a link itself; it never writes through it),
* and on any failure (a full disk, an interruption) the temporary is removed and the target is
  left as it was.
"""
from __future__ import annotations

import errno
import fcntl
import functools
import io
import json
import math
import os
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from sim.config.checks import like_open
from sim.config.errors import ScenarioError

F = TypeVar("F", bound=Callable[..., Any])


def target_mode(path: Path) -> int | None:
    """The permission bits of `path` if it is a regular file (not following a link), else None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return stat.S_IMODE(st.st_mode) if stat.S_ISREG(st.st_mode) else None


def give_mode(fd: int, path: Path) -> None:
    """A temporary (`fd`) that will replace `path` gets its mode: the replaced regular file's, else
    the one the umask gives a new file."""
    mode = target_mode(path)
    if mode is None:
        like_open(fd)
    else:
        os.fchmod(fd, mode)


def probe_writable(folder: Path) -> None:
    """OSError unless a file can be created in `folder` (an exclusive temporary, removed at once:
    never a name someone may have planted a link at)."""
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".probe.")
    os.close(fd)
    os.unlink(tmp)


def write_file(path: str | Path, data: bytes | str, executable: bool = False) -> Path:
    """Write `data` (text is UTF-8) to `path` safely (module docstring); returns the path.
    `executable` (a script): executable by whoever may read it, set on the temporary before the
    rename (never a chmod by name, which would follow a link planted there)."""
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    if path.is_dir() and not path.is_symlink():  # (said of the target: the temporary's name means nothing)
        raise IsADirectoryError(errno.EISDIR, "is a folder, not a file", str(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as e:  # no such folder, not writable: said of the folder
        raise type(e)(e.errno, e.strerror, str(path.parent)) from None
    try:
        give_mode(fd, path)
        if executable:
            mode = os.fstat(fd).st_mode & 0o7777
            os.fchmod(fd, mode | (mode & 0o444) >> 2)  # (r -> r-x for each of user, group, others)
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(doc: dict, path: str | Path) -> Path:
    """`doc` as strict JSON (no NaN) at `path`, safely (write_file)."""
    return write_file(path, json.dumps(doc, allow_nan=False, separators=(",", ":")) + "\n")


def plain_text(draw: F) -> F:
    """A function that draws figures, run with matplotlib's math text off: the figures carry user
    text (scenario, model and folder names such as runs_$MODEL_$RATE) that must show as written
    ("$\\foo$" crashed plot, report, compare and plan). None of servesim's own labels use math."""
    @functools.wraps(draw)
    def wrapped(*args, **kwargs):
        import matplotlib
        with matplotlib.rc_context({"text.parse_math": False}):
            return draw(*args, **kwargs)
    return wrapped  # type: ignore[return-value]


def save_figure(fig, path: str | Path, **savefig) -> Path:
    """A matplotlib figure written through write_file (rendered in memory first), PNG by the
    path's suffix as savefig would pick it."""
    path = Path(path)
    _plain_log_ticks(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format=path.suffix.lstrip(".") or "png", **savefig)
    return write_file(path, buf.getvalue())


def _plain_log_ticks(fig) -> None:
    """Log axes labelled in plain numbers (0.2, 1, 100, 200, 500): matplotlib's default log
    formatters write math text ($\\mathdefault{10^{3}}$), which figures drawn with math text off
    (plain_text) would show as written, their minor labels read "4x10^2", and a plain LogFormatter
    writes 0.2 as "2e-01", whose minor labels then ran into each other. Majors: every decade as %g.
    Minors: all of 2-9 where the axis spans at most one decade, 2 and 5 up to three, none past that."""
    from matplotlib.ticker import FuncFormatter, LogFormatterMathtext

    def plain(x: float, _pos: int = 0) -> str:
        return f"{x:g}" if x > 0 else ""

    def minor_of(axis):
        def label(x: float, _pos: int = 0) -> str:
            lo, hi = sorted(axis.get_view_interval())
            if x <= 0 or lo <= 0:
                return ""
            decades = math.log10(hi / lo)
            mantissa = x / 10 ** math.floor(math.log10(x) + 1e-9)
            shown = range(2, 10) if decades <= 1 else (2, 5) if decades <= 3 else ()
            return plain(x) if any(abs(mantissa - m) < 1e-6 for m in shown) else ""
        return label
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            if axis.get_scale() != "log":
                continue
            # (only matplotlib's own math-text formatters: ticks a plot labelled itself stay)
            if isinstance(axis.get_major_formatter(), LogFormatterMathtext):
                axis.set_major_formatter(FuncFormatter(plain))
            if isinstance(axis.get_minor_formatter(), LogFormatterMathtext):
                axis.set_minor_formatter(FuncFormatter(minor_of(axis)))


@contextmanager
def folder_lock(folder: Path, what: str):
    """Hold `folder`'s writer lock (an flock on folder/.servesim.lock, opened without following a
    link) for the block; a second holder, in this or any process, is refused at once with one
    ScenarioError naming the folder and the holder's pid. The lock goes with the process, even
    killed; the file goes when the block ends, on any exit but a kill (a file left by a killed
    process holds no lock, and the next holder takes it)."""
    path = Path(folder) / LOCK_NAME
    for _ in range(100):  # (another holder's file removed under us: open the new one)
        try:  # (0o666 less the umask, as open() gives a new file)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o666)
        except OSError as e:
            raise ScenarioError(f"--out {folder}: cannot open its lock file {LOCK_NAME} "
                                f"({e.strerror or e}; a link there is refused)") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise ScenarioError(f"--out {folder}: another {what} is writing to it (process {holder}); "
                                f"wait for it to finish or use another --out") from None
        except BaseException:
            os.close(fd)
            raise
        # the holder before us removes the file as it lets go: a lock on a file no longer at `path`
        # guards nothing, so it counts only if `path` is still the file locked
        try:
            same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    else:
        raise ScenarioError(f"--out {folder}: its lock file {LOCK_NAME} keeps changing under servesim")
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        # nothing outlives the command: the file goes (while still locked, so no one holds a lock
        # on it the next holder does not see), then the lock with the descriptor
        try:
            os.unlink(path)
        except OSError:
            pass
        os.close(fd)


LOCK_NAME = ".servesim.lock"


@contextmanager
def writing(folder: Path):
    """Hold `folder`'s write turn while a command puts its set of files there (a run's renames, a
    plan's report and figures): an flock on the folder itself, so a second command writing there at
    the same moment waits for the first to finish its set (milliseconds, or the seconds a plan takes
    to draw), and the folder then holds one command's files whole (the last one's), never a mix of
    two. Nothing is left in the folder. (A sweep, which appends to its folder for as long as it
    runs, refuses a second writer instead: folder_lock.)"""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as e:  # a file system without flock (some network or FUSE mounts): unguarded,
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):  # as before this turn
                raise
        yield
    finally:
        os.close(fd)  # (releases the flock)


@contextmanager
def signals_held():
    """SIGINT and SIGTERM wait until the block is done, then act as they would have. In the main
    thread a Python handler records them: blocking them with pthread_sigmask there is not enough,
    since a process-directed signal goes to any thread that does not block it (pyarrow's and
    OpenBLAS's workers), whose C handler still raises in the main thread at the next bytecode (a
    SIGTERM then landed between two renames of a run's files under load). Elsewhere (signal
    handlers belong to the main thread) the calling thread's mask."""
    held = (signal.SIGINT, signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread():
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, held)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        return
    caught: list[int] = []
    old = {sig: signal.signal(sig, lambda signum, frame: caught.append(signum)) for sig in held}
    try:
        yield
    finally:
        for sig, handler in old.items():  # (None: a handler not set from Python; the default)
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        if caught:
            signal.raise_signal(caught[0])


@contextmanager
def staged(folder: Path):
    """A command's set of files written whole or not at all: the block writes them into a hidden
    folder inside `folder` (yielded); only when it ends without an exception are they moved into
    `folder`, with SIGINT and SIGTERM held for those renames. A failure on the way (a full disk, a
    figure that cannot be drawn, a signal) leaves `folder` as it was: an earlier plan there is not
    left half replaced (a new plan.json beside the old plan.md). The hidden folder never outlives
    the block. Call inside `writing(folder)`."""
    stage = Path(tempfile.mkdtemp(dir=folder, prefix=".staging-"))
    try:
        yield stage
        items = sorted(stage.iterdir())
        for item in items:  # (checked before any rename: none is made if one cannot be)
            target = folder / item.name
            if target.is_dir() and not target.is_symlink():
                raise IsADirectoryError(errno.EISDIR, "is a folder, not a file", str(target))
            mode = target_mode(target)  # a file replaced keeps its mode, as write_file's do
            if mode is not None:
                os.chmod(item, mode)
        with signals_held():
            for item in items:
                os.replace(item, folder / item.name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
