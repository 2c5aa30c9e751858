"""The typed hand-off from a scheduler to the engine: what one iteration (or a run of identical
decode iterations) computes."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..batch import BatchStats

_NO_GROWTH = np.zeros(0, dtype=np.int64)  # read-only: every batch shares it
_NO_GROWTH.flags.writeable = False


@dataclass
class Batch:
    stats: BatchStats         # what the cost model sees
    num_seqs: int             # sequences doing useful work (padded idle rows excluded)
    prefill_tokens: int       # useful prefill tokens (padding excluded)
    decode_tokens: int        # sequences sampling a token after a decode (one each)
    # KV cache: token slots allocated (paged: blocks x block size) during iteration 0; iteration
    # j >= 1 of a run has kv_slots + kv_slot_growth[j - 1]
    kv_slots: int
    kv_blocks_total: int      # capacity in blocks
    kv_tokens: int            # tokens held during iteration 0 (useful ones, after its writes)
    # Fast-forward: the batch repeats unchanged, every decode one token further, for up to max_steps
    # iterations; an arrival can change that only if arrival_sensitive.
    max_steps: int = 1
    arrival_sensitive: bool = True
    waiting: int = 0          # requests left waiting when this batch was formed
    # token slots added by iterations 1.. of a run that ran, cumulative (empty: constant); the
    # scheduler fills it in `update`, once it knows how many ran (it assigns a new array, so the
    # shared empty default is never written to)
    kv_slot_growth: np.ndarray = field(default_factory=lambda: _NO_GROWTH)
    # the scheduler's own bookkeeping, opaque to the engine:
    chunks: list = field(default_factory=list)  # (request id, prompt tokens) computed this iteration

    @property
    def kv_token_growth(self) -> int:
        """Tokens added to the cache per iteration of a decode run."""
        return self.decode_tokens
