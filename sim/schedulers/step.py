"""The step contract: what a scheduler hands the engine for one iteration (`Schedule`) and what
applying it changed (`StepOutcome`). Both are frozen; nobody writes to them after handing them over.

    schedule = scheduler.schedule(now)                 # every request computed, and how many tokens
    durations = cost.step_times(schedule.stats, n)     # the cost model sees only schedule.stats
    outcome = scheduler.update(schedule, steps, now)   # requests finished (and, apart, KV use)

Like vLLM V1's `SchedulerOutput`, a schedule names each request computing this iteration and its
token count (`num_scheduled_tokens`), decodes included, plus the requests it preempted; the
recorder, the real engine (calibrate/engine.py) and tests read it, never the scheduler's state.

A schedule may cover a run of identical decode iterations (fast-forward, sim/runtime/fast_forward.py): the
same requests each decode one token per iteration for up to `max_steps` iterations.

What only the recorder reads (KV occupancy, the waiting count) travels apart, in each one's
`telemetry` (`ScheduleTelemetry`, `OutcomeTelemetry`): the engine passes it on unread.

All are NamedTuples: immutable (assigning a field raises AttributeError) and built by
`tuple.__new__`, several times cheaper than a frozen dataclass, which matters at one per event.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from sim.cost.batch import BatchStats

# tuple.__new__(Schedule, (every field, in order)): a schedule, stats or outcome as the scheduler
# builds one per event, ~0.1-0.15 us less than the class call, which runs namedtuple's Python-level
# __new__ (its defaults are not applied: every field is given)
new_tuple: Any = tuple.__new__

NO_IDS = np.zeros(0, dtype=np.int64)  # read-only: every schedule without such requests shares it
NO_IDS.flags.writeable = False


# What only the recorder reads (steps.csv and the KV integrals of summary.json), apart from what
# runs: nothing else (the engine, the cost model, `update`) reads it. Plain tuples, named field by
# field where they are unpacked (sim/runtime/recorder.py): one of each per event, a tuple literal is
# several times cheaper than even tuple.__new__ on a NamedTuple (measured: a NamedTuple here cost
# the simulator 8%, bench/against.py).
# A schedule's: what its first iteration held.
#   (kv_slots: KV token slots allocated during iteration 0 (paged: blocks x size),
#    kv_blocks_total: KV capacity in blocks,
#    kv_tokens: tokens held during iteration 0 (useful ones, after its writes),
#    waiting: requests left waiting when the schedule was formed,
#    kv_blocks_cached: prefix caching: blocks holding a cached prompt block's hash, in use or free)
ScheduleTelemetry = tuple[int, int, int, int, int]
# An outcome's: how the run's KV use grew.
#   (kv_blocks_used: KV blocks held during the last iteration run (before the finished requests
#        released theirs),
#    kv_slot_growth: KV token slots added by iterations 1.. of a run, cumulative (iteration j >= 1
#        holds kv_slots + kv_slot_growth[j - 1]): one per iteration after the first, or empty when the
#        allocation stayed constant (whole numbers: a list, or an int or float array),
#    kv_token_growth: KV tokens held in iterations 1.. over what iteration 0 held, cumulative, one
#        per iteration after the first; None: every decode adds one (a sliding-window cache, which
#        frees blocks mid-run, gives it))
OutcomeTelemetry = tuple[int, np.ndarray | list[int], np.ndarray | None]


class Schedule(NamedTuple):
    # Requests computing exactly one token (decodes), read-only. For the decode pool this is a view
    # of an array the pool copies before changing, so it stays true after the hand-over.
    decode_ids: np.ndarray
    # Requests computing (part of) their prompt, recomputes included, in admission order; their
    # token counts and earlier context are stats.prefill_lens / stats.prefill_contexts.
    prefill_ids: np.ndarray
    stats: BatchStats         # what the cost model sees
    num_seqs: int             # sequences doing useful work (padded idle rows excluded)
    prefill_tokens: int       # useful prefill tokens (padding excluded)
    decode_tokens: int        # sequences sampling a token after a decode (one each)
    telemetry: ScheduleTelemetry  # what it held, for the recorder (apart: nothing that runs reads it)
    # Fast-forward: the schedule repeats unchanged, every decode one token further, for up to
    # max_steps iterations; an arrival can change that only if arrival_sensitive.
    max_steps: int = 1
    arrival_sensitive: bool = True
    preempted: tuple[int, ...] = ()  # requests preempted (recompute) while forming this schedule

    @property
    def num_scheduled_tokens(self) -> dict[int, int]:
        """Request id -> tokens it computes in the first iteration (vLLM's name)."""
        out = dict.fromkeys(self.decode_ids.tolist(), 1)
        out.update(zip(self.prefill_ids.tolist(), self.stats.prefill_lens.tolist()))
        return out


class StepOutcome(NamedTuple):
    finished: tuple[int, ...]   # requests that sampled their last token in the iterations run
    telemetry: OutcomeTelemetry  # how KV use grew, for the recorder
