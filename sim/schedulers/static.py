"""Static batching (HF `generate`): take up to `max_num_seqs` waiting requests (or whatever has
arrived once the oldest has waited `batch_timeout_s`), pad their prompts to the longest, prefill
them together, then decode every row until the longest output ends. A finished row keeps its slot,
computing padding; the next batch starts only when the whole batch is done.

KV memory is contiguous: each row reserves its padded prompt plus the longest output the workload
allows (`max_output_tokens`, the server's generation cap) before the batch starts.
"""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from sim.cost.batch import BatchStats
from sim.kv.cache import ContiguousKVCache
from sim.schedulers.step import NO_IDS, Schedule, StepOutcome
from sim.workload.request import RequestTable


class StaticScheduler:
    kv_cache: ClassVar[type] = ContiguousKVCache  # each row reserves its padded prompt + the longest output
    token_budget: ClassVar[bool] = False  # max_num_batched_tokens does not apply
    chunks_prompts: ClassVar[bool] = False
    iteration_level: ClassVar[bool] = False  # a batch runs to its end: not what the real engine runs
    prefix_caching: ClassVar[bool] = False  # contiguous reservations: nothing to share

    def __init__(self, requests: RequestTable, kv: ContiguousKVCache, queue, *, max_num_seqs: int,
                 max_output_tokens: int, batch_timeout_s: float = 0.0, **_unused):
        self.req, self.kv, self.waiting = requests, kv, queue
        self.max_num_seqs = max_num_seqs
        self.max_output_tokens = max_output_tokens
        self.batch_timeout_s = batch_timeout_s
        self.rows = np.zeros(0, dtype=np.int64)  # the batch in flight (empty: none)
        self.padded_len = 0                      # its prompts' padded length, tokens
        self.step = 0                            # decode iterations done by the batch
        self.prefilled = False                   # has the batch in flight had its prefill
        self.retry_at = np.inf

    def add(self, rid: int) -> None:
        self.waiting.push(rid)

    def has_work(self) -> bool:
        return len(self.rows) > 0 or len(self.waiting) > 0

    def load(self) -> int:
        return len(self.rows) + len(self.waiting)

    def schedule(self, now: float) -> Schedule | None:
        if len(self.rows):
            return self._decode()
        self.retry_at = np.inf
        if not len(self.waiting):
            return None
        if len(self.waiting) < self.max_num_seqs and self.batch_timeout_s > 0:
            deadline = self.req.arrival[min(self.waiting)] + self.batch_timeout_s
            if now < deadline:
                self.retry_at = deadline
                return None
        return self._prefill(now)

    def update(self, schedule: Schedule, steps: int, now: float) -> StepOutcome:
        req, rows = self.req, self.rows
        used = -(-(self.kv.capacity - self.kv.free_tokens) // self.kv.block_size)
        if not self.prefilled:
            self.prefilled = True
            req.generated[rows] = 1
            req.first_token[rows] = now
        else:
            active = rows[req.generated[rows] < req.output[rows]]
            req.generated[active] += steps
            self.step += steps
        just_done = rows[(req.generated[rows] == req.output[rows]) & np.isnan(req.finish[rows])]
        req.finish[just_done] = now
        if np.all(req.generated[rows] >= req.output[rows]):
            self.kv.release(rows)
            self.rows = np.zeros(0, dtype=np.int64)
        return StepOutcome(finished=tuple(just_done.tolist()), telemetry=(used, NO_IDS, None))

    # -- schedules ------------------------------------------------------------------------------
    def _prefill(self, now: float) -> Schedule:
        req, kv, waiting = self.req, self.kv, self.waiting
        rows: list[int] = []
        longest = 0
        while len(waiting) and len(rows) < self.max_num_seqs:
            rid = waiting.peek()
            padded = max(longest, int(req.prompt[rid]))
            if (len(rows) + 1) * (padded + self.max_output_tokens) > kv.free_tokens:
                break  # growing the batch would overflow the KV memory
            rows.append(waiting.pop())
            longest = padded
        self.rows = np.array(rows, dtype=np.int64)
        self.rows.flags.writeable = False  # the schedule hands it over as its prefill_ids
        self.padded_len, self.step, self.prefilled = longest, 0, False
        for rid in rows:
            kv.allocate(rid, longest + self.max_output_tokens)
        req.first_scheduled[self.rows] = now
        prompt_tokens = int(req.prompt[self.rows].sum())
        n = len(rows)
        stats = BatchStats(prefill_lens=np.full(n, longest, dtype=np.int64),
                           prefill_contexts=np.zeros(n, dtype=np.int64),
                           padded_tokens=n * longest - prompt_tokens)
        return self._schedule(stats, NO_IDS, self.rows, num_seqs=n, prefill_tokens=prompt_tokens,
                              decode_tokens=0, kv_tokens=prompt_tokens, max_steps=1)

    def _decode(self) -> Schedule:
        req, rows = self.req, self.rows
        n = len(rows)
        gen = req.generated[rows]
        active = gen < req.output[rows]
        n_active = int(active.sum())
        # every row computes (finished ones on padding) at context padded prompt + step + 1
        context = self.padded_len + self.step + 1
        stats = BatchStats(num_decodes=n, decode_context_sum=n * context, padded_tokens=n - n_active)
        remaining = int((req.output[rows][active] - gen[active]).min())
        kv_tokens = int((req.prompt[rows][active] + gen[active]).sum())
        decoding = rows[active]
        decoding.flags.writeable = False
        return self._schedule(stats, decoding, NO_IDS, num_seqs=n_active, prefill_tokens=0,
                              decode_tokens=n_active, kv_tokens=kv_tokens, max_steps=remaining)

    def _schedule(self, stats, decode_ids, prefill_ids, *, num_seqs, prefill_tokens, decode_tokens,
                  kv_tokens, max_steps) -> Schedule:
        reserved = self.kv.capacity - self.kv.free_tokens
        return Schedule(decode_ids=decode_ids, prefill_ids=prefill_ids, stats=stats,
                        num_seqs=num_seqs, prefill_tokens=prefill_tokens,
                        decode_tokens=decode_tokens,
                        # (kv_slots, kv_blocks_total, kv_tokens, waiting, kv_blocks_cached)
                        telemetry=(reserved, self.kv.num_blocks, kv_tokens, len(self.waiting), 0),
                        max_steps=max_steps, arrival_sensitive=False)
