"""Continuous batching (Orca, vLLM without chunked prefill): a waiting request joins only if its
whole prompt fits in what is left of the iteration's token budget, and is prefilled in the
iteration it joins, alongside the running requests' decodes."""
from __future__ import annotations

from typing import ClassVar

from mypy_extensions import mypyc_attr

from sim.schedulers.iteration_level import IterationLevelScheduler


@mypyc_attr(allow_interpreted_subclasses=True)  # (compiled: setup.py)
class ContinuousScheduler(IterationLevelScheduler):
    chunks_prompts: ClassVar[bool] = False  # a prompt joins whole or waits

    def admit_tokens(self, want: int, budget: int) -> int:
        return want if want <= budget else 0
