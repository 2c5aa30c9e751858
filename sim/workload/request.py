"""Per-request state as columns of numpy arrays (one row per request, indexed by request id).

A request is never an object or a SimPy process: a million of them must simulate in seconds.
Token bookkeeping follows vLLM V1: there are no prefill/decode phases, only `computed` (tokens whose
KV is in the cache) catching up with `seq_len` (prompt + output tokens sampled so far). An iteration
that brings `computed` up to `seq_len` samples one more output token.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from sim.workload.generators import Workload


@dataclass
class RequestTable:
    """One numpy array per column; `scalars` holds a memoryview of each (see __setattr__), for code
    that reads and writes one request at a time."""
    arrival: np.ndarray      # float64 s
    prompt: np.ndarray       # int64 tokens
    output: np.ndarray       # int64 tokens to generate (known to the simulator, not to schedulers' policy)
    priority: np.ndarray     # int64, lower = more urgent
    computed: np.ndarray     # int64 tokens with KV in the cache (reset to 0 by a recompute preemption)
    generated: np.ndarray    # int64 output tokens sampled so far
    first_scheduled: np.ndarray  # float64 s, first time any of its tokens was scheduled (nan: never)
    first_token: np.ndarray  # float64 s, end of the iteration that sampled output token 1
    finish: np.ndarray       # float64 s, end of the iteration that sampled the last output token
    resume_from: np.ndarray  # float64 s, time of the last token before a preemption (for ITL), nan
    preemptions: np.ndarray  # int64
    replica: np.ndarray      # int64, -1 until routed
    # (gap s, end s) before the first token after each recompute preemption: inter-token latencies
    # that are not one iteration long
    resume_gaps: list = field(default_factory=list)

    @classmethod
    def from_workload(cls, w: Workload) -> RequestTable:
        n = len(w)
        nan = lambda: np.full(n, np.nan)  # noqa: E731 - a fresh array each call
        zeros = lambda: np.zeros(n, dtype=np.int64)  # noqa: E731
        return cls(
            arrival=np.asarray(w.arrival_s, dtype=np.float64),
            prompt=np.asarray(w.prompt_tokens, dtype=np.int64),
            output=np.asarray(w.output_tokens, dtype=np.int64),
            priority=np.asarray(w.priority, dtype=np.int64),
            computed=zeros(), generated=zeros(),
            first_scheduled=nan(), first_token=nan(), finish=nan(), resume_from=nan(),
            preemptions=zeros(), replica=np.full(n, -1, dtype=np.int64),
        )

    def __len__(self) -> int:
        return len(self.arrival)

    def __setattr__(self, name, value) -> None:
        if isinstance(value, np.ndarray):  # (a memoryview needs one contiguous block)
            value = np.ascontiguousarray(value)
            # `scalars`: every column as a memoryview of its array, so one element is read or
            # written as a Python int or float, ~5x cheaper than numpy's scalar indexing (22 vs
            # 141 ns a read), which the schedulers do a few dozen times per request. Writes go to
            # the same memory, so the arrays see them (a float written to an int column raises
            # where numpy would truncate it). A replaced column (sim/workload/sessions.py grows prompts in
            # a copy) replaces its view in the same namespace, so holding `scalars` is safe.
            setattr(self.__dict__.setdefault("_scalars", SimpleNamespace()), name, memoryview(value))
        object.__setattr__(self, name, value)

    @property
    def scalars(self) -> SimpleNamespace:
        """Every column as a memoryview (see __setattr__): read once, then indexed."""
        return self.__dict__["_scalars"]
