"""Per-iteration records, kept compact: a row per iteration (or per fast-forwarded run of
identical iterations), each iteration's duration, and exact time integrals of KV occupancy.

Rows are buffered as tuples and packed into float64 blocks every `_CHUNK` rows, so a million-request
run keeps a few hundred bytes per row, not Python objects.
"""
from __future__ import annotations

from array import array

import numpy as np

STEP_COLUMNS = ("replica", "start_s", "duration_s", "count", "num_seqs", "prefill_tokens",
                "decode_tokens", "padded_tokens", "kv_blocks_used", "kv_blocks_total", "waiting")
_CHUNK = 65536


class Recorder:
    def __init__(self, block_size: int):
        self.block_size = block_size
        self._rows: list[tuple] = []
        self._packed: list[np.ndarray] = []
        self.durations = array("d")   # every iteration's duration, s, in row order
        self.kv_slot_seconds = 0.0    # integral of allocated KV token slots over time
        self.kv_token_seconds = 0.0   # integral of KV tokens actually held over time
        self.kv_block_seconds = 0.0   # integral of KV blocks in use over time (blocks x s)
        self.decode_context_tokens = 0.0  # sum over iterations of decode_context_sum (KV tokens read)

    def record(self, replica: int, start: float, durations: np.ndarray, batch) -> None:
        count = len(durations)
        slots = batch.kv_slots[:count]
        stats = batch.stats
        if count == 1:
            d = float(durations[0])
            total, slot_s = d, float(slots[0]) * d
            token_s = batch.kv_tokens * d
            block_s = -(-int(slots[0]) // self.block_size) * d
        else:
            total = float(durations.sum())
            slot_s = float(slots @ durations)
            grown = batch.kv_tokens + batch.kv_token_growth * np.arange(count)
            token_s = float(grown @ durations)
            block_s = float((-(-slots // self.block_size)) @ durations)
        self.kv_slot_seconds += slot_s
        self.kv_token_seconds += token_s
        self.kv_block_seconds += block_s
        # decode contexts grow by one token per decode per iteration
        self.decode_context_tokens += (count * stats.decode_context_sum
                                       + stats.num_decodes * count * (count - 1) / 2)
        self.durations.frombytes(np.ascontiguousarray(durations, dtype=np.float64).tobytes())
        self._rows.append((replica, start, total, count, batch.num_seqs, batch.prefill_tokens,
                           batch.decode_tokens, stats.padded_tokens,
                           -(-int(slots[-1]) // self.block_size), batch.kv_blocks_total,
                           batch.waiting))
        if len(self._rows) >= _CHUNK:
            self._pack()

    def _pack(self) -> None:
        if self._rows:
            self._packed.append(np.array(self._rows, dtype=np.float64))
            self._rows = []

    def steps(self) -> np.ndarray:
        """All rows as a float64 [rows, len(STEP_COLUMNS)] array."""
        self._pack()
        if not self._packed:
            return np.zeros((0, len(STEP_COLUMNS)))
        return np.concatenate(self._packed)

    def iteration_durations(self) -> np.ndarray:
        return np.frombuffer(self.durations, dtype=np.float64)
