"""Iteration-level scheduling (Orca / vLLM): every iteration, running requests compute first (in
admission order), then waiting requests join while `max_num_seqs`, the token budget and KV blocks
allow. `continuous` and `chunked` differ only in how a waiting prompt meets the budget; see
`admit_tokens` in their files.

Semantics follow vLLM V1's scheduler: when a running request cannot get the block it needs, the
most recently admitted running request is preempted by recompute (blocks freed, back to the front
of the waiting queue) until it fits or is itself preempted; an iteration that preempted admits
nobody. A waiting request joins only if its whole sequence fits in the free blocks, not only the
chunk it starts with (vLLM 0.32's `scheduler_reserve_full_isl`, on by default; found by
`servesim validate --engine vllm`, docs/validation.md).

Running requests are either decoding (in the `DecodePool`, advanced in O(1) per iteration) or
still computing their prompt (`prefilling`, recomputes included). Nobody joins while a prompt is
only partly scheduled, so prefilling requests are always the most recently admitted: every
iteration the pool's decodes take one token each, then the prefilling requests' chunks.
"""
from __future__ import annotations

from collections.abc import Callable
from math import isnan  # (on one element: ~10x cheaper than np.isnan)
from typing import Any, ClassVar

import numpy as np
from mypy_extensions import mypyc_attr

from sim.cost.batch import BatchStats
from sim.kv.cache import PagedKVCache
from sim.schedulers.decode_pool import DecodePool
from sim.schedulers.step import NO_IDS, Schedule, StepOutcome, new_tuple
from sim.schedulers.window import SlidingWindow
from sim.workload.request import RequestTable

_WALK = 24  # a decode run up to this long has its block openings counted in Python, not numpy
_NO_HITS: list[int] = []  # a resumed request's lookup: none (read only; a cache keeps no empty hit list)


@mypyc_attr(allow_interpreted_subclasses=True)  # (compiled: setup.py)
class IterationLevelScheduler:
    # Facts the rest of servesim reads instead of branching on a scheduler's name:
    # (ClassVar: class attributes, also when mypyc compiles the class; setup.py)
    kv_cache: ClassVar[type] = PagedKVCache  # KV memory: blocks allocated as tokens are computed
    token_budget: ClassVar[bool] = True      # max_num_batched_tokens limits every iteration
    chunks_prompts: ClassVar[bool] = True    # a prompt may be split over iterations (else whole or none)
    iteration_level: ClassVar[bool] = True   # requests join and leave at every iteration (vLLM's kind)
    prefix_caching: ClassVar[bool] = True    # may run over sim/kv/prefix_cache.PrefixKVCache (vLLM V1: on)

    def __init__(self, requests: RequestTable, kv, queue, *, max_num_seqs: int,
                 max_num_batched_tokens: int, pool=None, reserve_full_isl: bool = True,
                 handoff: Callable[[int, float], None] | None = None, connector=None, lora=None,
                 window: SlidingWindow | None = None, **_unused):
        self.req, self.waiting = requests, queue
        # a disaggregated prefill replica's: where a computed prompt's KV goes instead of decoding
        # here, handoff(rid, now) (like vLLM's KV connector handed to its scheduler)
        self.handoff = handoff
        # KV offloading to CPU memory (sim/features/kv_offloading/cpu_tier.CpuOffload), like vLLM's KV
        # connector: consulted as requests are admitted, computed and leave; None: no tier behind the GPU cache
        self.connector: Any = connector
        self.loading: dict[int, float] = {}  # admitted, waiting for its load from CPU -> when it is in
        # multi-LoRA serving (sim/features/lora/slots.LoRASlots): which adapters a batch may use, which
        # it must load; None: every request on the base model
        self.lora: Any = lora
        # a sliding-window model's blocks (sim/schedulers/window.py, over a WindowedKVCache and its
        # pool): what it changes in a step; None: the paged cache's plain rules
        self.window = window
        # a PagedKVCache, its sliding-window subclass or a PrefixKVCache: the same count API,
        # duck-typed (the windowed one adds `layout` and its group counts)
        self.kv: Any = kv
        self._req = requests.scalars  # the same columns, one element at a time (sim/workload/request.py)
        self.reserve_full_isl = reserve_full_isl  # vLLM's scheduler_reserve_full_isl (_admit)
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        # a hybrid's state blocks per running request (sim/kv/cache.StateKVCache): full, never waste
        self._state_blocks: int = getattr(kv, "states", 0)
        # running decodes: one token each (DecodePool), speculative (sim/schedulers/speculative.py)
        # or over a sliding window (the window's own pool)
        if pool is None:
            pool = window.pool if window is not None else DecodePool(requests, kv.block_size)
        self.pool = pool
        # constant facts of the cache and the pool, typed (kv and pool are duck-typed: compiled,
        # every read of theirs is a Python attribute lookup, and arithmetic on it is boxed)
        self._block_size: int = kv.block_size
        self._num_blocks: int = kv.num_blocks
        self._lookahead: int = pool.lookahead
        self.prefilling: list[int] = []  # running, prompt not yet all computed; admission order
        # every running request, admission order (a dict for O(1) removal; values unused)
        self.order: dict[int, None] = {}
        self.retry_at = np.inf           # only an arrival or a finished iteration creates new work
        self._fifo = getattr(queue, "new_arrivals_last", False)  # arrivals never pass a blocked head
        self._preempted: list[int] = []  # preempted while forming the current schedule

    # -- the contract ---------------------------------------------------------------------------
    def add(self, rid: int) -> None:
        self.waiting.push(rid)

    def has_work(self) -> bool:
        return len(self.order) > 0 or len(self.waiting) > 0 or len(self.loading) > 0

    def load(self) -> int:
        return len(self.order) + len(self.waiting) + len(self.loading)

    def admit_tokens(self, want: int, budget: int) -> int:
        """Tokens of a waiting request's prefill to schedule now (0: it cannot join)."""
        raise NotImplementedError

    def schedule(self, now: float) -> Schedule | None:
        if self.loading:
            self._join_loaded(now)
        if not self.order and not len(self.waiting):
            return None
        pool, kv = self.pool, self.kv
        self._preempted = []
        size: int = pool.size
        budget = self.max_num_batched_tokens - size * self._lookahead  # decodes first
        chunks = self._prefill_chunks(budget) if self.prefilling else []
        need: int = pool.new_blocks_now()
        if chunks:  # (skipping empty generators: this runs every iteration)
            need += sum(kv.growth(self._computed(rid), t) for rid, t in chunks)
        window = self.window
        if window is not None and window.short(need):
            # vLLM frees the blocks behind windows only as it reaches each request: order matters
            chunks = self._preempt_until_fits(now, chunks, window.lazy_releases(self.order))
            preempted = bool(self._preempted)
        else:
            preempted = not kv.allocate(need)
            if preempted:
                chunks = self._preempt_until_fits(now, chunks)
            elif pool.speculative:  # members hold their lookahead blocks
                pool.reserve_all()
        if not preempted and self.waiting:
            budget -= sum(t for _, t in chunks)
            chunks += self._admit(now, budget)
        if not self.order:
            return None  # everything was preempted and nothing may join in this iteration
        return self._schedule(chunks, preempted)

    def update(self, schedule: Schedule, steps: int, now: float) -> StepOutcome:
        kv, window = self.kv, self.window
        growth, tokens, closing, finished = NO_IDS, None, 0, []
        if window is not None:
            window.slid = {}
        if schedule.decode_tokens:
            if window is not None:  # blocks open and go behind windows as the run goes
                growth, tokens, closing = window.run(schedule.decode_tokens, steps)
            elif steps > 1:  # the later iterations of a run; _run_length checked they fit
                if steps <= _WALK:
                    opened, growth = self.pool.slots_opened(steps - 1, self._block_size)
                    kv.allocate(opened)
                else:
                    cumulative = self.pool.new_blocks_at(1, steps - 1).cumsum()
                    kv.allocate(int(cumulative[-1]))
                    growth = cumulative * self._block_size
            finished = self.pool.advance(steps)
        free: int = kv.free
        used = self._num_blocks - free  # held in the last iteration, before the finished release theirs
        if window is not None:  # (the last iteration's, freed after its usage is read)
            window.release(closing)
        if finished:
            self._finish(finished, now)
        if schedule.prefill_tokens:
            self._commit_prefills(schedule, finished, now)
        # finished; kv_blocks_used, kv_slot_growth, kv_token_growth (None: every decode one token)
        return new_tuple(StepOutcome, (tuple(finished), (used, growth, tokens)))

    def _commit_prefills(self, schedule: Schedule, finished: list[int], now: float) -> None:
        """The iteration's prefill chunks are computed; a prompt done samples its first token."""
        req, kv, window = self._req, self.kv, self.window
        ids: list[int] = schedule.prefill_ids.tolist()
        lens: list[int] = schedule.stats.prefill_lens.tolist()
        for rid, t in zip(ids, lens):
            before: int = req.computed[rid]
            computed = before + t
            req.computed[rid] = computed
            kv.commit(rid, computed)  # (prefix caching: its full prompt blocks become cacheable)
            if self.connector is not None:  # (offloading: and are copied to CPU memory)
                self.connector.computed(rid, computed)
            if window is not None:  # (blocks now behind its window are freed)
                window.slide(rid, before, computed)
            prompt: int = req.prompt[rid]
            generated: int = req.generated[rid]
            if computed < prompt + generated:
                continue  # more of the prompt to come
            self.prefilling.remove(rid)
            if self._prompt_done(rid, now):
                finished.append(rid)

    def _prompt_done(self, rid: int, now: float) -> bool:
        """Its prompt (recompute included) is all computed: it samples a token, then finishes
        (True) or decodes; on a disaggregated prefill replica its KV is handed off instead."""
        req = self._req
        handoff = self.handoff
        if handoff is not None:
            self._hand_off(rid, now, handoff)
            return False
        generated: int = req.generated[rid]
        generated += 1
        req.generated[rid] = generated
        self._first_or_resumed_token(rid, now)
        output: int = req.output[rid]
        if generated >= output:
            self._finish([rid], now)
            return True
        self.pool.join(rid)
        return False

    def _hand_off(self, rid: int, now: float, handoff: Callable[[int, float], None]) -> None:
        """A prefill replica's request leaves with its prompt's KV (sim/runtime/disaggregation.py):
        its blocks are freed as the prefill ends, and the decode replica it reaches recomputes the
        last prompt token to sample the first output token, as vLLM's disaggregated serving does."""
        req, kv = self._req, self.kv
        computed: int = req.computed[rid]
        kv.free_request(rid, kv.blocks_for(computed))
        del self.order[rid]
        prompt: int = req.prompt[rid]
        req.computed[rid] = prompt - 1
        handoff(rid, now)

    # -- running requests -----------------------------------------------------------------------
    def _computed(self, rid: int) -> int:
        return self.pool.computed(rid) if rid in self.pool.members else self._req.computed[rid]

    def _prefill_chunks(self, budget: int) -> list[tuple[int, int]]:
        req, chunks = self._req, []
        for rid in self.prefilling:
            t = min(req.prompt[rid] + req.generated[rid] - req.computed[rid], max(budget, 0))
            chunks.append((rid, t))
            budget -= t
        return chunks

    def _preempt_until_fits(self, now: float, chunks, pending=None) -> list[tuple[int, int]]:
        """vLLM V1's loop: each running request in admission order gets its blocks, preempting
        from the most recently admitted end until it does (or is itself preempted). `pending`: the
        blocks behind each one's window, freed as the loop reaches it (sliding window)."""
        take, pool = dict(chunks), self.pool
        ids, i = list(self.order), 0
        while i < len(ids):
            rid = ids[i]
            if pending:
                self.kv.free += pending.pop(rid, 0)
            member = rid in pool.members
            need = pool.growth(rid, self.kv) if member else self.kv.growth(self._computed(rid), take.get(rid, 0))
            while not self.kv.allocate(need):
                victim = ids.pop()
                if pending:
                    self.kv.free += pending.pop(victim, 0)
                self._preempt(victim, now)
                if victim == rid:
                    member = False
                    break
            if member and pool.speculative:
                pool.reserve(rid)
            i += 1
        still_running = set(ids)
        return [(rid, t) for rid, t in chunks if rid in still_running]

    def _preempt(self, rid: int, now: float) -> None:
        req = self._req
        if rid in self.pool.members:
            self.pool.leave(rid)
        else:
            self.prefilling.remove(rid)
        del self.order[rid]
        computed = req.computed[rid]
        if self.connector is not None:
            self.connector.left(rid, computed)
        if self.lora is not None:
            self.lora.leave(rid)
        self.kv.free_request(rid, self.kv.blocks_for(computed), preempted=True, computed=computed)
        self._preempted.append(rid)
        req.computed[rid] = 0
        req.preemptions[rid] += 1
        if req.generated[rid] > 0 and isnan(req.resume_from[rid]):
            # its last token came when the previous iteration ended (if it was preempted again
            # before sampling since, the gap still starts at that older token)
            req.resume_from[rid] = now
        self.waiting.push_front(rid)

    def _finish(self, rids: list[int], now: float) -> None:
        req, kv = self._req, self.kv
        for rid in rids:  # a handful at a time: scalar indexing beats building an index array
            req.finish[rid] = now
            computed = req.computed[rid]
            if self.connector is not None:
                self.connector.left(rid, computed)
            if self.lora is not None:
                self.lora.leave(rid)
            kv.free_request(rid, kv.blocks_for(computed), computed=computed)
            del self.order[rid]

    def _first_or_resumed_token(self, rid: int, now: float) -> None:
        req = self._req
        if isnan(req.first_token[rid]):
            req.first_token[rid] = now
        elif not isnan(req.resume_from[rid]):  # the token after a recompute: a longer gap
            self.req.resume_gaps.append((now - req.resume_from[rid], now))
            req.resume_from[rid] = np.nan

    # -- waiting requests -----------------------------------------------------------------------
    def _admit(self, now: float, budget: int) -> list[tuple[int, int]]:
        req, kv, waiting = self._req, self.kv, self.waiting
        admitted = []
        skipped: list[int] = []  # (LoRA: waiting for an adapter slot; back at the head afterwards)
        while len(waiting) and len(self.order) < self.max_num_seqs and budget > 0:
            rid = waiting.peek()
            if self.lora is not None and not self.lora.admits(rid):
                skipped.append(waiting.pop())  # vLLM skips it: those behind it may still join
                continue
            computed = req.computed[rid]
            total = req.prompt[rid] + req.generated[rid]
            # prefix caching: a new or resumed request starts from its longest cached prefix
            hits = kv.lookup(rid, total) if computed == 0 else _NO_HITS
            if self.connector is not None and computed == 0:
                loaded: int = self.connector.lookup(rid, total, len(hits))
                if loaded:  # blocks past the GPU hits are loaded from CPU memory, not recomputed
                    if not self._start_load(rid, hits, loaded, total, now):
                        break
                    continue
            start = computed + len(hits) * kv.block_size
            t = self.admit_tokens(total - start, budget)
            # a waiting request holds no blocks here: a preempted one freed them (recompute), and a
            # disaggregated decode replica's arrival brings its computed tokens' KV from elsewhere
            held = len(hits)
            if t == 0 or (self.reserve_full_isl and t < total - start
                          and not kv.can_take(hits, kv.sequence_blocks(total) - held)):
                break  # the whole sequence must fit, not just this chunk (vLLM 0.32's default)
            # (blocks_for(start + t) - held but for a sliding window, whose chunk's blocks are all
            # allocated before the ones behind the window are freed: growth)
            new = kv.blocks_for(start + t) - held if self.window is None else kv.growth(start, t)
            if not kv.admit(rid, hits, new, total):
                break  # head-of-line: whoever is first in line waits for room
            if hits:
                req.computed[rid] = start
            waiting.pop()
            admitted.append((rid, t))
            self.prefilling.append(rid)
            self.order[rid] = None
            if self.lora is not None:
                self.lora.join(rid)
            if isnan(req.first_scheduled[rid]):
                req.first_scheduled[rid] = now
            budget -= t
        for rid in reversed(skipped):
            waiting.push_front(rid)
        return admitted

    def _start_load(self, rid: int, hits: list[int], loaded: int, total: int, now: float) -> bool:
        """vLLM's asynchronous load (WAITING_FOR_REMOTE_KVS): GPU blocks for the hits and the loaded
        blocks now, the request out of the running batch (no seat, no budget) until its load ends
        (`_join_loaded`). False: no room, head-of-line as any admission."""
        kv, req = self.kv, self._req
        held = len(hits)
        if self.reserve_full_isl and not kv.can_take(hits, kv.sequence_blocks(total) - held):
            return False
        if not kv.admit(rid, hits, loaded, total):
            return False
        req.computed[rid] = (held + loaded) * self._block_size
        self.waiting.pop()
        ready: float = self.connector.start_load(rid, held, loaded, now)
        self.loading[rid] = ready
        self.retry_at = min(self.retry_at, ready)
        if isnan(req.first_scheduled[rid]):
            req.first_scheduled[rid] = now
        return True

    def _join_loaded(self, now: float) -> None:
        """Requests whose load has ended join the running batch (as vLLM's waiting requests do,
        while seats last), their loaded blocks cached on the GPU from now on; `retry_at` becomes
        the next load's end, for a replica that would otherwise sit idle."""
        req, kv = self._req, self.kv
        for rid, ready in list(self.loading.items()):  # (loads end in the order they started)
            if ready > now or len(self.order) >= self.max_num_seqs:
                break
            del self.loading[rid]
            self.connector.loaded(rid)
            kv.commit(rid, req.computed[rid])
            self.order[rid] = None
            self.prefilling.append(rid)
        self.retry_at = min(self.loading.values()) if self.loading else np.inf

    # -- the schedule ---------------------------------------------------------------------------
    def _schedule(self, chunks: list[tuple[int, int]], preempted: bool) -> Schedule:
        req, pool, kv = self.req, self.pool, self.kv
        prefill_tokens, ids, lens, contexts = 0, NO_IDS, NO_IDS, NO_IDS
        if chunks:  # (most iterations have none)
            chunks = [(rid, t) for rid, t in chunks if t > 0]
        if chunks:
            sizes = [t for _, t in chunks]
            prefill_tokens = sum(sizes)
            ids = np.array([rid for rid, _ in chunks], dtype=np.int64)
            lens = np.array(sizes, dtype=np.int64)
            contexts = req.computed[ids]
        decodes: int = pool.size
        context_sum: int = pool.context_sum()
        held = context_sum  # KV tokens held before this iteration's writes
        if self.prefilling:
            computed = self._req.computed
            held += sum(computed[rid] for rid in self.prefilling)
        tokens = held + decodes + prefill_tokens
        if pool.speculative and decodes:  # verification priced like prefill chunks, plus the draft
            v_lens, v_contexts, draft_seqs, draft_context = pool.batch()
            stats = BatchStats(prefill_lens=np.concatenate((lens, v_lens)),
                               prefill_contexts=np.concatenate((contexts, v_contexts)),
                               draft_seqs=draft_seqs, draft_context_sum=draft_context)
            max_steps = 1
        elif self.window is not None:
            someone_waits = bool(len(self.waiting)) and len(self.order) < self.max_num_seqs
            stats, max_steps, tokens = self.window.schedule(
                lens, contexts, decodes, context_sum, tokens, self.prefilling, req.computed,
                bool(decodes) and not self.prefilling and not preempted, someone_waits)
        else:
            # (every field, in order: sim/cost/batch.py; one per event)
            if self.lora is None:
                stats = new_tuple(BatchStats, (lens, contexts, decodes, context_sum + decodes, 0, 0, 0, 0, 0))
            else:  # LoRA: the batch's adapters, and those it loads first
                adapters, loads = self.lora.batch()
                stats = new_tuple(BatchStats, (lens, contexts, decodes, context_sum + decodes, 0, 0, 0, adapters,
                                               loads))
            max_steps = self._run_length() if decodes and not self.prefilling and not preempted else 1
            if self._state_blocks:  # each running request's linear-attention states fill their blocks
                tokens += self._state_blocks * self._block_size * (decodes + len(self.prefilling))
        if self.loading:
            max_steps = 1  # (a load ending may let its request join at the next boundary)
        free: int = kv.free
        # every field, in order (sim/schedulers/step.py): built as a tuple, at one schedule per event
        return new_tuple(Schedule, (
            pool.ids() if decodes else NO_IDS, ids, stats,             # decode_ids, prefill_ids, stats
            decodes + len(chunks), prefill_tokens, decodes,            # num_seqs, prefill/decode tokens
            ((self._num_blocks - free) * self._block_size, self._num_blocks,  # telemetry: kv_slots,
             tokens, len(self.waiting), kv.cached_blocks),             # kv_blocks_total, kv_tokens,
                                                                       # waiting, kv_blocks_cached
            max_steps, self._arrival_sensitive(),                      # max_steps, arrival_sensitive
            tuple(self._preempted) if self._preempted else ()))        # preempted

    def _run_length(self) -> int:
        """Iterations this decode batch repeats unchanged: until a member finishes or the free
        blocks run out (block by block only when they might: a member opens at most one block
        every block_size iterations)."""
        k: int = self.pool.steps_to_next_finish()
        free: int = self.kv.free
        size: int = self.pool.size
        if k <= 1 or free >= size * -(-(k - 1) // self._block_size):
            return max(k, 1)
        opened = self.pool.new_blocks_at(1, k - 1).cumsum()
        return 1 + int(opened.searchsorted(free, side="right"))

    def _arrival_sensitive(self) -> bool:
        """Could a request arriving during a decode run join before the run ends? Not when every
        seat is taken, nor behind a blocked head of a FIFO line (it only gets more blocked)."""
        if len(self.order) >= self.max_num_seqs:
            return False
        # (with LoRA a head waiting for an adapter slot is skipped: an arrival may join past it)
        return not (len(self.waiting) and self._fifo and self.lora is None)
