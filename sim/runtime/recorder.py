"""Per-iteration records, kept compact: a row per iteration (or per fast-forwarded run of
identical iterations), each iteration's duration, and exact time integrals of KV occupancy.

Rows are buffered as tuples and appended to one packed array per column (float64 times, int64
counts) every `_CHUNK` rows, so a million-request run keeps 96 bytes per row, not Python objects,
and hands its columns to steps.csv's frame without a copy. Each row's durations (the Runner's list
of floats) go straight into one packed array.

A run's KV integrals are sums over its iterations of (held x duration), added left to right here
(`_dot`): the same floats on every machine, unlike BLAS's dot, whose order follows the CPU kernel.
"""
from __future__ import annotations

from array import array
from itertools import chain
from typing import Any

import numpy as np

from sim.schedulers.step import Schedule, StepOutcome

# steps.csv; RECORDED adds what only some runs write (kv_blocks_cached: with prefix caching)
STEP_COLUMNS = ("replica", "start_s", "duration_s", "count", "num_seqs", "prefill_tokens",
                "decode_tokens", "padded_tokens", "kv_blocks_used", "kv_blocks_total", "waiting")
RECORDED = (*STEP_COLUMNS, "kv_blocks_cached")
_TIMES = ("start_s", "duration_s")  # float64 columns; the others count things (int64)
_CHUNK = 16384  # rows held before packing


def _dot(growth: list[float], durations: list[float]) -> float:
    """sum over j >= 1 of growth[j - 1] x durations[j], left to right (a run's iterations after
    its first; `growth` may hold ints, whole numbers, which convert exactly)."""
    acc = 0.0
    for j in range(1, len(durations)):
        acc += growth[j - 1] * durations[j]
    return acc


def _ramp_dot(durations: list[float]) -> float:
    """sum over j of j x durations[j], left to right (iteration j of a run holds j tokens more
    per decode)."""
    acc = 0.0
    for j in range(1, len(durations)):
        acc += j * durations[j]
    return acc


def _floats(values: Any) -> list[float]:
    """A StepOutcome's growth as a list (schedulers hand lists; an array is converted)."""
    return values if isinstance(values, list) else np.asarray(values, dtype=np.float64).tolist()


class Recorder:
    def __init__(self, block_size: int):
        self.block_size = block_size
        self._rows: list[tuple] = []
        self._columns = _empty_columns()
        self.durations = array("d")   # every iteration's duration, s, in row order (packed)
        self.kv_slot_seconds = 0.0    # integral of allocated KV token slots over time
        self.kv_token_seconds = 0.0   # integral of KV tokens actually held over time
        self.kv_block_seconds = 0.0   # integral of KV blocks in use over time (blocks x s)
        self.decode_context_tokens = 0.0  # sum over iterations of decode_context_sum (KV tokens read)

    def record(self, replica: int, start: float, durations: list[float], total: float,
               schedule: Schedule, outcome: StepOutcome) -> None:
        """One row for `durations` (s), the iterations of `schedule` run from `start`, which took
        `total` seconds together (fast_forward.total; durations[0] for one iteration)."""
        count, stats, bs = len(durations), schedule.stats, self.block_size
        # what only the recorder reads (sim/schedulers/step.py), named here
        kv_slots, kv_blocks_total, kv_tokens, waiting, kv_blocks_cached = schedule.telemetry
        kv_blocks_used, kv_slot_growth, kv_token_growth = outcome.telemetry
        if count == 1:  # scalar arithmetic: most rows are single iterations
            self.kv_slot_seconds += kv_slots * total
            self.kv_token_seconds += kv_tokens * total
            self.kv_block_seconds += -(-kv_slots // bs) * total
            self.decode_context_tokens += stats.decode_context_sum
        else:
            # (the scheduler's growth: count - 1 long, or empty)
            grown_slots = _dot(_floats(kv_slot_growth), durations) if len(kv_slot_growth) else 0.0
            self.kv_slot_seconds += kv_slots * total + grown_slots
            # every decode adds one token per iteration (a sliding window's run says otherwise)
            self.kv_token_seconds += kv_tokens * total + (
                schedule.decode_tokens * _ramp_dot(durations) if kv_token_growth is None
                else _dot(_floats(kv_token_growth), durations))
            # a run's growth comes in whole blocks (paged); a constant reservation rounds up once
            self.kv_block_seconds += -(-kv_slots // bs) * total + grown_slots / bs
            self.decode_context_tokens += (count * stats.decode_context_sum
                                           + stats.num_decodes * count * (count - 1) / 2)
        self.durations.fromlist(durations)
        self._rows.append((replica, start, total, count, schedule.num_seqs, schedule.prefill_tokens,
                           schedule.decode_tokens, stats.padded_tokens, kv_blocks_used,
                           kv_blocks_total, waiting, kv_blocks_cached))
        if len(self._rows) >= _CHUNK:
            self._pack()

    def _pack(self) -> None:
        if self._rows:
            # (counts are whole numbers < 2**53: exact as float64)
            block = np.fromiter(chain.from_iterable(self._rows), np.float64, len(self._rows) * len(RECORDED))
            block = block.reshape(len(self._rows), len(RECORDED))
            for column, values in zip(self._columns, block.T):
                column.frombytes(values.astype(np.int64 if column.typecode == "q" else np.float64).tobytes())
            self._rows = []

    def step_columns(self) -> dict[str, np.ndarray]:
        """All rows, column by column (start_s, duration_s float64; the rest int64), handed over:
        the arrays share the recorder's buffers, which it lets go of."""
        self._pack()
        columns, self._columns = self._columns, _empty_columns()
        return {c: np.frombuffer(column, dtype=np.int64 if column.typecode == "q" else np.float64)
                for c, column in zip(RECORDED, columns)}

    def take_durations(self, room: int = 0) -> np.ndarray:
        """Every iteration's duration (s, in row order), handed over: the recorder keeps none. The
        array has `room` more slots after them (zeros) for the caller to fill (a
        million-request run holds ~18M durations: 147 MB, which the inter-token gaps reuse)."""
        self._pack()
        durations, self.durations = self.durations, array("d")
        if room:
            durations.frombytes(bytes(8 * room))
        return np.frombuffer(durations, dtype=np.float64)


def _empty_columns() -> list[array]:
    return [array("d" if c in _TIMES else "q") for c in RECORDED]
