"""A sliding-window model's KV blocks, as the iteration-level scheduler meets them: an object handed
to it (sim/build.py), like the CPU-offload connector and the LoRA slots, holding everything the
scheduler does differently for such a model. Without one (`window` None) the scheduler runs the
paged cache's plain rules.

vLLM's hybrid KV-cache manager (`SlidingWindowManager`) frees the blocks wholly behind each
request's window as the request advances (sim/kv/cache.WindowedKVCache counts them per group), and
the decode pool tracks when each running request opens and closes blocks
(sim/schedulers/decode_pool.WindowedDecodePool). What that changes in a step:

- *When* freed blocks come back: vLLM frees a request's skipped blocks only as its pass over the
  running requests reaches that request (`remove_skipped_blocks` in `allocate_slots`); when the
  free count alone is short, the scheduler's preemption loop takes them back one request at a time
  (`lazy_releases`).
- A decode run's KV growth is no longer monotone: every iteration opens blocks and frees those
  behind windows (`run`, `run_length`).
- The batch's attention reads at most `window` tokens in a windowed layer (`schedule`'s stats).

Compiled with the scheduler (setup.py): its methods run once per event of such a model.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from sim.cost.batch import BatchStats, windowed_stats
from sim.schedulers.step import NO_IDS


class SlidingWindow:
    def __init__(self, kv: Any, pool: Any):
        self.kv: Any = kv      # a WindowedKVCache (sim/kv/cache.py)
        self.pool: Any = pool  # its WindowedDecodePool (sim/schedulers/decode_pool.py)
        # blocks each request freed behind its window as the last iteration ended (prefill chunks
        # here; decodes by arithmetic), and their total: not yet usable (lazy_releases)
        self.slid: dict[int, int] = {}
        self.released = 0

    # -- forming a schedule ---------------------------------------------------------------------
    def short(self, need: int) -> bool:
        """The blocks this iteration needs are more than those free without the ones the last
        iteration freed behind windows: the order in which vLLM gives those back then matters."""
        free: int = self.kv.free
        return need > free - self.released

    def lazy_releases(self, order: dict[int, None]) -> dict[int, int]:
        """The blocks each running request (`order`) freed behind its window as the last iteration
        ended, taken back from the free count: vLLM frees them only when its pass over the running
        requests reaches that request. The scheduler's preemption loop returns each as it goes."""
        kv, pool = self.kv, self.pool
        pending = {rid: freed for rid, freed in self.slid.items() if rid in order}  # (not finished)
        behind, bs, groups = kv.layout.behind, kv.block_size, kv.sliding_groups
        for rid in pool.members:  # the rest decoded one token: c - 1 -> c
            if rid not in self.slid:
                c = pool.computed(rid)
                pending[rid] = groups * (behind(c, bs) - behind(c - 1, bs))
        kv.free -= sum(pending.values())
        self.released = 0
        return pending

    def schedule(self, lens: np.ndarray, contexts: np.ndarray, decodes: int, context_sum: int, tokens: int,
                 prefilling: list[int], computed: np.ndarray, run: bool, someone_waits: bool
                 ) -> tuple[BatchStats, int, int]:
        """The batch's stats (windowed layers read at most `window` tokens), how many iterations
        it may repeat (`run`: a decode-only batch may), and the KV token slots it holds over every
        group, less the blocks freed behind windows (`tokens`: what one group holds)."""
        pool, kv = self.pool, self.kv
        window_sum, capped = pool.window_sums()
        stats = windowed_stats(lens, contexts, decodes, context_sum + decodes, window_sum, capped)
        max_steps = self.run_length(someone_waits) if run else 1
        behind = pool.behind_sum + sum(kv.layout.behind(int(computed[r]), kv.block_size) for r in prefilling)
        return stats, max_steps, kv.groups * tokens - kv.sliding_groups * kv.block_size * behind

    def run_length(self, someone_waits: bool) -> int:
        """Iterations a decode batch repeats unchanged, where the free count is not monotone: blocks
        go behind windows mid-run (and a member becoming capped ends a run: steps_to_next_finish).
        `someone_waits`: a waiting request has a seat but no blocks, so the run ends with the first
        iteration that frees some."""
        pool = self.pool
        k = pool.steps_to_next_finish()
        if k <= 1:
            return max(k, 1)
        if someone_waits:
            freeing = np.flatnonzero(pool.closes_at(0, k - 1))
            k = int(freeing[0]) + 1 if len(freeing) else k
            if k == 1:
                return 1
        # iteration j >= 1 may count on the blocks freed up to iteration j - 2 only: those of
        # j - 1 come back as vLLM's pass reaches each request, so the scheduler checks the order
        closed = np.concatenate(([0], pool.closes_at(0, k - 2).cumsum()))
        net = pool.new_blocks_at(1, k - 1).cumsum() - closed
        over = np.flatnonzero(net > self.kv.free)
        return 1 + int(over[0]) if len(over) else k

    # -- applying one -----------------------------------------------------------------------------
    def run(self, decode_tokens: int, steps: int) -> tuple[Any, Any, int]:
        """A decode run of `steps` iterations: iteration j >= 1 opens blocks, every iteration's end
        frees those behind the window. Returns the run's slot and token growth (OutcomeTelemetry)
        and the blocks the last iteration frees (after its usage is read: `release`)."""
        pool, kv, bs = self.pool, self.kv, self.kv.block_size
        growth: Any = NO_IDS
        tokens: Any = NO_IDS
        if steps > 1:
            shut = pool.closes_at(0, steps - 1).cumsum()
            net = pool.new_blocks_at(1, steps - 1).cumsum() - shut
            kv.free -= int(net[-1])
            growth = net * bs
            # every decode writes one token per group; a freed block takes its bs tokens along
            tokens = pool.groups * decode_tokens * np.arange(1, steps) - shut * bs
        closing: int = pool.closes_after(steps - 1)
        return growth, tokens, closing

    def release(self, closing: int) -> None:
        """The blocks the last iteration freed behind windows are free again, and remembered as not
        yet given back (short, lazy_releases)."""
        self.kv.free += closing
        self.released = closing

    def slide(self, rid: int, before: int, computed: int) -> None:
        """A prefill chunk took request `rid` from `before` to `computed` tokens: the blocks now
        behind its window are freed (and remembered, as a decode's are)."""
        self.slid[rid] = freed = self.kv.slide(before, computed)
        self.released += freed
