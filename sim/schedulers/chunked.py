"""Chunked prefill (Sarathi, vLLM V1): one token budget per iteration, spent first on the running
requests (decodes, then the unfinished chunk of a long prompt) and then on new prompts, which are
cut to whatever budget is left and finished over later iterations."""
from __future__ import annotations

from mypy_extensions import mypyc_attr

from sim.schedulers.iteration_level import IterationLevelScheduler


@mypyc_attr(allow_interpreted_subclasses=True)  # (compiled: setup.py)
class ChunkedScheduler(IterationLevelScheduler):
    def admit_tokens(self, want: int, budget: int) -> int:
        return min(want, budget)
