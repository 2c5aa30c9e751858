"""Iteration-level scheduling (Orca / vLLM): every iteration, running requests compute first (in
admission order), then waiting requests join while `max_num_seqs`, the token budget and KV blocks
allow. `continuous` and `chunked` differ only in how a waiting prompt meets the budget; see
`admit_tokens` in their files.

Semantics follow vLLM V1's scheduler: when a running request cannot get the block it needs, the
most recently admitted running request is preempted by recompute (blocks freed, back to the front
of the waiting queue) until it fits or is itself preempted; an iteration that preempted admits
nobody.
"""
from __future__ import annotations

import numpy as np

from ..batch import BatchStats
from ..kv_cache import PagedKVCache
from ..request import RequestTable
from .batch import Batch

_NO_IDS = np.zeros(0, dtype=np.int64)


class IterationLevelScheduler:
    def __init__(self, requests: RequestTable, kv: PagedKVCache, queue, *, max_num_seqs: int,
                 max_num_batched_tokens: int, **_unused):
        self.req, self.kv, self.waiting = requests, kv, queue
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.running = _NO_IDS  # request ids in admission order
        self.retry_at = np.inf  # only an arrival or a finished iteration creates new work

    # -- the contract ---------------------------------------------------------------------------
    def add(self, rid: int) -> None:
        self.waiting.push(rid)

    def has_work(self) -> bool:
        return len(self.running) > 0 or len(self.waiting) > 0

    def load(self) -> int:
        return len(self.running) + len(self.waiting)

    def admit_tokens(self, want: int, budget: int) -> int:
        """Tokens of a waiting request's prefill to schedule now (0: it cannot join)."""
        raise NotImplementedError

    def schedule(self, now: float) -> Batch | None:
        if not self.has_work():
            return None
        budget = self.max_num_batched_tokens
        running, computed, want, take, preempted = self._schedule_running(now, budget)
        budget -= int(take.sum())
        admitted, admit_take = (_NO_IDS, _NO_IDS) if preempted else self._admit(now, budget, len(running))
        self.running = np.concatenate((running, admitted)) if len(admitted) else running
        if len(running) == 0 and len(admitted) == 0:
            return None  # everything was preempted and nothing may join in this iteration
        return self._batch(running, computed, want, take, admitted, admit_take, preempted)

    def update(self, batch: Batch, steps: int, now: float) -> None:
        req, rids = self.req, batch.rids
        if steps > 1:  # a decode run: every step samples; _run_length checked its blocks are free
            req.computed[rids] += steps
            self.kv.allocate_many(rids, req.computed[rids])
            sampled = rids
        else:
            req.computed[rids] += batch.num_tokens
            sampled = rids[req.computed[rids] == req.prompt[rids] + req.generated[rids]]
        req.generated[sampled] += steps
        self._record_tokens(sampled, now)
        done = sampled[req.generated[sampled] >= req.output[sampled]]
        if len(done):
            req.finish[done] = now
            self.kv.release(done)
            running = self.running
            self.running = running[req.generated[running] < req.output[running]]

    # -- running requests -----------------------------------------------------------------------
    def _schedule_running(self, now: float, budget: int):
        req, running = self.req, self.running
        if len(running) == 0:
            return _NO_IDS, _NO_IDS, _NO_IDS, _NO_IDS, False
        computed = req.computed[running]
        want = req.prompt[running] + req.generated[running] - computed
        # the budget goes to running requests in admission order: decodes first, a chunk last
        cum = np.cumsum(want)
        take = want if cum[-1] <= budget else np.minimum(want, np.maximum(budget - (cum - want), 0))
        if self.kv.allocate_many(running, computed + take):
            return running, computed, want, take, False
        running, take = self._preempt_until_fits(now, running, take)
        computed = req.computed[running]
        return running, computed, req.prompt[running] + req.generated[running] - computed, take, True

    def _preempt_until_fits(self, now, running, take):
        req, kv = self.req, self.kv
        ids, takes = running.tolist(), take.tolist()
        i = 0
        while i < len(ids):
            rid = ids[i]
            while not kv.allocate(rid, int(req.computed[rid]) + takes[i]):
                victim = ids.pop()  # the most recently admitted
                takes.pop()
                self._preempt(victim, now)
                if victim == rid:
                    break
            i += 1
        return np.array(ids, dtype=np.int64), np.array(takes, dtype=np.int64)

    def _preempt(self, rid: int, now: float) -> None:
        req = self.req
        self.kv.release(rid)
        req.computed[rid] = 0
        req.preemptions[rid] += 1
        if req.generated[rid] > 0 and np.isnan(req.resume_from[rid]):
            # its last token came when the previous iteration ended (unless it was preempted
            # again before sampling since: then the gap still starts at that older token)
            req.resume_from[rid] = now
        self.waiting.push_front(rid)

    # -- waiting requests -----------------------------------------------------------------------
    def _admit(self, now: float, budget: int, num_running: int):
        req, kv, waiting = self.req, self.kv, self.waiting
        ids, takes = [], []
        while len(waiting) and num_running < self.max_num_seqs and budget > 0:
            rid = waiting.peek()
            computed = int(req.computed[rid])
            t = self.admit_tokens(int(req.prompt[rid] + req.generated[rid]) - computed, budget)
            if t == 0 or not kv.allocate(rid, computed + t):
                break  # head-of-line: whoever is first in line waits for room
            waiting.pop()
            ids.append(rid)
            takes.append(t)
            if np.isnan(req.first_scheduled[rid]):
                req.first_scheduled[rid] = now
            budget -= t
            num_running += 1
        return np.array(ids, dtype=np.int64), np.array(takes, dtype=np.int64)

    # -- the batch ------------------------------------------------------------------------------
    def _batch(self, running, computed, want, take, admitted, admit_take, preempted) -> Batch:
        req = self.req
        n = len(running)
        # a decode: one token after a sampled one; the last 1-token chunk of a recompute is not
        is_decode = ((want == 1) & (take == 1) & (req.generated[running] > 0)
                     & np.isnan(req.resume_from[running]))
        num_decodes = int(np.count_nonzero(is_decode))
        pure_decode = num_decodes == n and not preempted and len(admitted) == 0
        if pure_decode:  # the common case: no masks needed
            rids, num_tokens = running, take
            prefill_lens = prefill_ctx = _NO_IDS
            decode_ctx_sum = int(computed.sum()) + n
            max_steps, kv_slots = self._run_length(running, computed)
        else:
            chunk = (take > 0) & ~is_decode
            decode_ctx_sum = int(computed[is_decode].sum()) + num_decodes
            prefill_lens = np.concatenate((take[chunk], admit_take))
            prefill_ctx = np.concatenate((computed[chunk], req.computed[admitted]))
            active = take > 0
            rids = np.concatenate((running[active], admitted))
            num_tokens = np.concatenate((take[active], admit_take))
            max_steps, kv_slots = 1, np.array([self.kv.used * self.kv.block_size])
        stats = BatchStats(prefill_lens=prefill_lens, prefill_contexts=prefill_ctx,
                           num_decodes=num_decodes, decode_context_sum=decode_ctx_sum)
        prefill_tokens = int(prefill_lens.sum())
        # tokens held after this iteration's writes (admitted requests start from 0 computed)
        kv_tokens = int(computed.sum()) + num_decodes + prefill_tokens
        return Batch(
            rids=rids, num_tokens=num_tokens, stats=stats, num_seqs=len(rids),
            prefill_tokens=prefill_tokens, decode_tokens=num_decodes,
            kv_slots=kv_slots, kv_blocks_total=self.kv.num_blocks, kv_tokens=kv_tokens,
            max_steps=max_steps, arrival_sensitive=self._arrival_sensitive(),
            waiting=len(self.waiting), preempted=preempted)

    def _run_length(self, running, computed):
        """Iterations this decode batch repeats unchanged: until a request finishes or the KV cache
        cannot give the blocks the decodes grow into. Also the KV slots in use at each of them."""
        req, kv = self.req, self.kv
        bs = kv.block_size
        k_finish = int((req.output[running] - req.generated[running]).min())
        used = kv.used
        if k_finish <= 1:
            return 1, np.array([used * bs])
        # step j computes token position computed + j and needs a new block when it is a multiple
        # of the block size: every bs steps from the first such j >= 1.
        first = (-computed) % bs
        per_phase = np.bincount(first, minlength=bs)
        new_blocks = np.cumsum(per_phase[np.arange(1, k_finish) % bs])
        k = 1 + int(np.searchsorted(new_blocks, kv.free, side="right"))
        slots = np.empty(k, dtype=np.int64)
        slots[0] = used
        slots[1:] = used + new_blocks[: k - 1]
        return k, slots * bs

    def _arrival_sensitive(self) -> bool:
        """Could a request arriving during a decode run join before the run ends? Not when every
        seat is taken, nor behind a blocked head of a FIFO line (it only gets more blocked)."""
        if len(self.running) >= self.max_num_seqs:
            return False
        return not (len(self.waiting) and getattr(self.waiting, "new_arrivals_last", False))

    def _record_tokens(self, sampled, now: float) -> None:
        req = self.req
        first = sampled[np.isnan(req.first_token[sampled])]
        req.first_token[first] = now
        resumed = sampled[~np.isnan(req.resume_from[sampled])]
        if len(resumed):  # the token after a recompute: its gap spans the preemption
            req.resume_gaps.extend((now - req.resume_from[resumed]).tolist())
            req.resume_from[resumed] = np.nan
