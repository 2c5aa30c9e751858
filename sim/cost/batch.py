"""What one engine iteration computes, as the cost model sees it.

The scheduler builds a `BatchStats` for every iteration; the cost model turns it into seconds.
The cost model never sees scheduler internals and never branches on a scheduler's name.
"""
from __future__ import annotations

from collections import namedtuple
from typing import Any, NamedTuple

import numpy as np

_EMPTY = np.zeros(0, dtype=np.int64)
_EMPTY.flags.writeable = False  # shared by every stats without prefill chunks


class BatchStats(NamedTuple):
    """Immutable, and a NamedTuple rather than a frozen dataclass: one is built per event, and
    tuple.__new__ is ~4x cheaper than a frozen dataclass's __init__ (1.05 vs 0.25 us)."""
    # Tokens each prefill chunk computes this iteration (static batching: padded prompt length).
    prefill_lens: np.ndarray = _EMPTY
    # Tokens already in the KV cache before each chunk (0 for a fresh prompt), same order.
    prefill_contexts: np.ndarray = _EMPTY
    # Sequences computing exactly one token (decodes), padded idle rows of a static batch included.
    num_decodes: int = 0
    # Sum over those decodes of the context each attends to, in tokens, the new token included.
    decode_context_sum: int = 0
    # Tokens above that are computed but produce nothing (static padding, finished rows). Already
    # counted in prefill_lens / num_decodes; reported separately for utilisation and waste.
    padded_tokens: int = 0
    # Speculative decoding (sim/schedulers/speculative.py): sequences the draft proposes tokens for this
    # iteration, and the sum of their contexts (their verification is in prefill_lens above).
    draft_seqs: int = 0
    draft_context_sum: int = 0
    # Multi-LoRA serving (sim/features/lora/slots.py): distinct adapters the batch uses, and how many of
    # them are loaded into the GPU's slots before this iteration (sim/features/lora/cost.py prices both).
    lora_adapters: int = 0
    lora_loads: int = 0

    @property
    def decode_context_growth(self) -> float | None:
        """How much decode_context_sum grows per iteration of a run; None: num_decodes (every
        decode one token further). Not a field here (one less to set per iteration); a field of
        WindowedBatchStats, where WindowedCost sets it to the layer-averaged growth."""
        return None

    @property
    def prefill_tokens(self) -> int:
        # a Python sum: cheaper than a numpy reduction on the few chunks of one iteration
        return int(sum(self.prefill_lens.tolist())) if len(self.prefill_lens) else 0

    @property
    def total_tokens(self) -> int:
        """Tokens run through the model's linear layers this iteration."""
        return self.prefill_tokens + self.num_decodes

    @property
    def num_seqs(self) -> int:
        return len(self.prefill_lens) + self.num_decodes


_WINDOWED = (*BatchStats._fields, "decode_window_sum", "decode_capped", "decode_context_growth")


_make: Any = namedtuple  # (Any: mypy reads a namedtuple's fields only when they are written out)
_WindowedFields: Any = _make("WindowedBatchStats", _WINDOWED,
                             defaults=(*BatchStats._field_defaults.values(), 0, 0, None))


class WindowedBatchStats(_WindowedFields):
    """An iteration of a sliding-window model (sim/cost/step_cost.WindowedCost reads the extra terms): the
    fields of BatchStats, in its order, then
      decode_window_sum      sum over the decodes of the tokens a windowed layer attends,
                             min(context + 1, window)
      decode_capped          how many decodes are at the window (their term stays put as they
                             advance)
      decode_context_growth  float | None: BatchStats' property, a field here (WindowedCost
                             sets it to the layer-averaged growth)
    (A NamedTuple cannot extend another's fields: built from BatchStats' names and defaults.)"""
    __slots__ = ()
    prefill_tokens = BatchStats.prefill_tokens
    total_tokens = BatchStats.total_tokens
    num_seqs = BatchStats.num_seqs


def windowed_stats(prefill_lens: np.ndarray, prefill_contexts: np.ndarray, num_decodes: int,
                   decode_context_sum: int, decode_window_sum: int, decode_capped: int) -> BatchStats:
    """A WindowedBatchStats, typed as the BatchStats whose fields it has first (what all but
    WindowedCost read)."""
    return WindowedBatchStats(prefill_lens=prefill_lens, prefill_contexts=prefill_contexts,
                              num_decodes=num_decodes, decode_context_sum=decode_context_sum,
                              decode_window_sum=decode_window_sum, decode_capped=decode_capped)
