"""A toy scheduler written as a plug-in would be: one file, registered with one dict line
(`SCHEDULERS["one_at_a_time"] = OneAtATime`). It serves one request at a time, in arrival order:
its whole prompt in one iteration, then its decodes as one fast-forwarded run."""
from __future__ import annotations

import numpy as np

from sim.cost.batch import BatchStats
from sim.kv.cache import PagedKVCache
from sim.schedulers.step import NO_IDS, Schedule, StepOutcome


class OneAtATime:
    kv_cache = PagedKVCache
    token_budget = False
    chunks_prompts = False
    iteration_level = False
    prefix_caching = False

    def __init__(self, requests, kv, queue, **_unused):
        self.req, self.kv, self.waiting = requests, kv, queue
        self.current = -1  # the request being served (-1: none)
        self.retry_at = np.inf

    def add(self, rid: int) -> None:
        self.waiting.push(rid)

    def has_work(self) -> bool:
        return self.current >= 0 or len(self.waiting) > 0

    def load(self) -> int:
        return (self.current >= 0) + len(self.waiting)

    def schedule(self, now: float) -> Schedule | None:
        req, kv = self.req, self.kv
        if self.current < 0:
            if not len(self.waiting):
                return None
            self.current = rid = self.waiting.pop()
            kv.allocate(kv.blocks_for(int(req.prompt[rid] + req.output[rid])))
            req.first_scheduled[rid] = now
            ids = np.array([rid])
            ids.flags.writeable = False
            stats = BatchStats(prefill_lens=req.prompt[ids], prefill_contexts=np.zeros(1, np.int64))
            return self._schedule(NO_IDS, ids, stats, prefill=int(req.prompt[rid]), steps=1)
        rid = self.current
        ids = np.array([rid])
        ids.flags.writeable = False
        context = int(req.prompt[rid] + req.generated[rid])
        stats = BatchStats(num_decodes=1, decode_context_sum=context)
        return self._schedule(ids, NO_IDS, stats, prefill=0,
                              steps=int(req.output[rid] - req.generated[rid]))

    def _schedule(self, decode_ids, prefill_ids, stats, *, prefill: int, steps: int) -> Schedule:
        rid = self.current
        return Schedule(decode_ids=decode_ids, prefill_ids=prefill_ids, stats=stats, num_seqs=1,
                        prefill_tokens=prefill, decode_tokens=len(decode_ids),
                        # (kv_slots, kv_blocks_total, kv_tokens, waiting, kv_blocks_cached)
                        telemetry=(self.kv.used * self.kv.block_size, self.kv.num_blocks,
                                   int(self.req.prompt[rid] + self.req.generated[rid]), len(self.waiting), 0),
                        max_steps=steps, arrival_sensitive=False)

    def update(self, schedule: Schedule, steps: int, now: float) -> StepOutcome:
        req, rid, used = self.req, self.current, self.kv.used
        if len(schedule.prefill_ids):
            req.first_token[rid] = now
            req.generated[rid] = 1
        else:
            req.generated[rid] += steps
        req.computed[rid] = req.prompt[rid] + req.generated[rid] - 1
        finished = ()
        if req.generated[rid] == req.output[rid]:
            req.finish[rid] = now
            self.kv.release(self.kv.blocks_for(int(req.prompt[rid] + req.output[rid])))
            self.current, finished = -1, (rid,)
        return StepOutcome(finished=finished, telemetry=(used, NO_IDS, None))
