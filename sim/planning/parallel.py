"""Run independent simulations in parallel: local processes by default, a Dask cluster on request.

    for i, result in run_parallel(fn, args, workers=4):   # completion order, not submission order
        ...
    for i, result in run_parallel(fn, args, cluster="tcp://scheduler:8786"):   # a running Dask cluster
        ...

`fn` must be a picklable top-level function; each call is one whole simulation (seconds), so
process start-up and pickling are noise. workers=1 runs in this process (debuggers, tests).
With `cluster`, the cluster's workers must be able to import `fn`'s module (install servesim there)
and read any files the arguments name (traces, profiles). dask is imported only then.

A plan runs hundreds of small batches (a few seeds each): `DaskRunner(address)` connects once and
runs every batch on the same connection (`with DaskRunner(a) as runner: runner.map(fn, args)`);
`LocalRunner(workers)` is the same interface over local processes.
"""
from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any

from sim.config.errors import ScenarioError

CONNECT_TIMEOUT_S = 10  # how long to wait for a Dask scheduler before giving up


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def run_parallel(fn: Callable[..., Any], args: Sequence[tuple], *, workers: int | None = None,
                 cluster: str | None = None) -> Iterator[tuple[int, Any]]:
    """Yield (index into args, fn(*args[index])) as each call finishes. `cluster` is the address
    of a running Dask scheduler (e.g. "tcp://host:8786"); `workers` then does not apply."""
    if cluster is not None:
        yield from _run_on_cluster(fn, args, cluster)
        return
    with LocalRunner(min(workers or default_workers(), max(1, len(args)))) as runner:  # (a pool for this batch)
        yield from runner.map(fn, args)


def _worker_init(parent: int) -> None:
    """Worker initializer. Ctrl-C reaches every process of the group: a worker then exits at once,
    rather than abandon only its current call and go on with the calls already queued to it; so
    does SIGTERM. And a worker dies with its parent, even one killed with SIGKILL (Linux's
    PR_SET_PDEATHSIG; elsewhere the pool's own shutdown applies)."""
    signal.signal(signal.SIGINT, lambda *_: os._exit(130))
    signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before the line above took effect
        os._exit(1)


def _connect(address: str) -> Any:
    """A distributed.Client of the scheduler at `address`; ScenarioError, one line, if there is none."""
    try:
        from distributed import Client
    except ImportError:
        raise ScenarioError(f"--cluster {address}: dask distributed is not installed; "
                            "pip install 'servesim[cluster]'") from None
    # Client's own timeout covers the TCP connect, not a peer that accepts and then says nothing (or
    # answers another protocol: an HTTP 400 read as a message length asked for gigabytes), so the
    # handshake runs in a thread with a deadline, and whatever it raises becomes the one line
    box: dict[str, Any] = {}

    def connect() -> None:
        try:
            box["client"] = Client(address, timeout=CONNECT_TIMEOUT_S)
        except BaseException as e:  # (MemoryError included: reported below, not raised in a thread)
            box["error"] = e

    thread = threading.Thread(target=connect, name="servesim-dask-connect", daemon=True)
    thread.start()
    deadline = 2 * CONNECT_TIMEOUT_S  # s: the client's own timeout, then as long again for the handshake
    thread.join(deadline)
    if thread.is_alive():
        raise ScenarioError(f"--cluster {address}: no Dask scheduler answered within {deadline:g} s "
                            "(something accepts connections there but does not speak Dask's protocol)")
    if "error" in box:
        e = box["error"]
        if isinstance(e, KeyboardInterrupt):
            raise e
        if isinstance(e, MemoryError):  # (its reply's first bytes read as a message length)
            raise ScenarioError(f"--cluster {address}: something answered there, but not as a Dask scheduler "
                                "(its reply did not parse as Dask's protocol)") from None
        raise ScenarioError(f"--cluster {address}: cannot connect to a Dask scheduler there "
                            f"({type(e).__name__}: {e})".replace("\n", " ")[:400]) from None
    return box["client"]


def _submit(client: Any, fn: Callable[..., Any], args: Sequence[tuple]) -> Iterator[tuple[int, Any]]:
    from distributed import as_completed

    futures = [client.submit(fn, *a, pure=False) for a in args]
    index = {f.key: i for i, f in enumerate(futures)}
    try:
        for fut in as_completed(futures):
            yield index[fut.key], fut.result()
    finally:  # an error or an early stop: what has not run yet is released
        pending = [f for f in futures if not f.done()]
        if pending:
            client.cancel(pending)


def _run_on_cluster(fn: Callable[..., Any], args: Sequence[tuple], address: str
                    ) -> Iterator[tuple[int, Any]]:
    with _connect(address) as client:  # leaving it (also on an error or an early stop) releases the tasks
        yield from _submit(client, fn, args)


class LocalRunner:
    """Batches of calls on local processes: one pool for the runner's whole life (a plan's hundreds
    of batches of a few seeds each: a pool per batch left a core idle while it started and threw
    away the workers' warm caches), started at the first batch of more than one call, shut down by
    `close` (or leaving a `with`). Several threads may map at once (the plan's searches of
    different candidates): their calls share the workers. workers=1 runs in the calling thread."""

    def __init__(self, workers: int | None = None):
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def map(self, fn: Callable[..., Any], args: Sequence[tuple]) -> Iterator[tuple[int, Any]]:
        """Yield (index into args, fn(*args[index])) as each call finishes."""
        if (self.workers or default_workers()) == 1 or not args:
            for i, a in enumerate(args):
                yield i, fn(*a)
            return
        pool = self._started()
        pending = {pool.submit(fn, *a): i for i, a in enumerate(args)}
        try:
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    yield pending.pop(fut), fut.result()
        finally:  # an error or an early stop: drop this batch's queued calls
            for fut in pending:
                fut.cancel()

    def start(self) -> LocalRunner:
        """Start the workers now, from this thread. A worker dies with the thread that started it
        (Linux's parent-death signal follows the creating thread, not the process), so a plan
        whose searches run in threads starts its pool here, in the thread that outlives them."""
        if (self.workers or default_workers()) > 1:
            self._started().submit(os.getpid).result()  # (fork starts every worker at the first call)
        return self

    def _started(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(max_workers=self.workers or default_workers(),
                                                 initializer=_worker_init, initargs=(os.getpid(),))
            return self._pool

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:  # (queued calls dropped; running ones finish, or exit on Ctrl-C)
            pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> LocalRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DaskRunner:
    """Batches of calls on a running Dask cluster, over one connection for all of them (a plan's
    batches are a few seeds each: a connection per batch would cost more than the batch)."""

    def __init__(self, address: str):
        self.address, self.client = address, _connect(address)

    def map(self, fn: Callable[..., Any], args: Sequence[tuple]) -> Iterator[tuple[int, Any]]:
        return _submit(self.client, fn, args)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> DaskRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
