"""What a speculative-decoding iteration costs: the target's verification (priced as prefill-like
chunks) plus the draft's k proposal steps (sim/schedulers/speculative.py says what is simulated)."""
from __future__ import annotations

import numpy as np

from sim.config.speculative import SpeculativeConfig
from sim.cost.batch import BatchStats
from sim.cost.step_cost import StepCost


class SpeculativeCost(StepCost):
    """The target's step time (verification included, as prefill-like chunks) plus the draft's:
    `draft_step(B, context_sum)` seconds for one draft decode step over B sequences, times k."""

    def __init__(self, target, spec: SpeculativeConfig, draft_cost=None, num_layers: int = 1):
        self.target, self.k, self.method = target, spec.num_speculative_tokens, spec.method
        self.draft_cost, self.num_layers = draft_cost, num_layers

    def step_times(self, stats: BatchStats, steps: int = 1) -> np.ndarray:
        out = self.target.step_times(stats, steps)
        b = stats.draft_seqs
        if not b or self.method == "ngram":
            return out
        draft = BatchStats(num_decodes=b, decode_context_sum=stats.draft_context_sum + b)
        if self.method == "draft":
            per_step = float(self.draft_cost.step_times(draft, 1)[0])
        else:  # eagle / mtp: one decoder layer of the target per drafted token
            per_step = float(self.target.step_times(draft, 1)[0]) / self.num_layers
        return out + self.k * per_step
