"""Running requests in steady decode, advanced together in O(1) per iteration.

Every member computes one token and samples one per iteration, so rather than adding 1 to each
member's counters every iteration, the pool keeps one `clock` (decode iterations it has run) and
stores each member's `computed` and `generated` in the RequestTable *minus* that clock; `leave`
writes the true values back. What a decode batch needs is kept as running aggregates:

- the context sum (stored computed sum + size x clock),
- when the next member finishes (a heap of the clock value at which each samples its last token),
- how many members cross into a new KV block at each step: a member with stored computed `s`
  computes token position `s + D` in the iteration that starts at clock `D`, which opens a new block
  when `(s + D) % block_size == 0`, i.e. when `D % block_size == (-s) % block_size`.

The members' ids live in a packed array: joins append, leaves move the last member into the gap.
`ids()` hands a Schedule a read-only numpy copy of it, made once per change (steady decode runs
share one), so a schedule's ids never change after the hand-over.
"""
from __future__ import annotations

import heapq
from array import array
from typing import ClassVar

import numpy as np

from sim.workload.request import RequestTable

_WRAP_TAKE_MAX = 1024  # runs ending within this many steps of a phase take counts by "wrap"
_RAMP = np.arange(_WRAP_TAKE_MAX)  # 0, 1, 2, ...: iteration offsets (read-only)
_RAMP.flags.writeable = False


class DecodePool:
    # (ClassVar: class attributes, also when mypyc compiles the class; setup.py)
    # each member computes one token per iteration (sim/schedulers/speculative.py: more)
    speculative: ClassVar[bool] = False
    lookahead: ClassVar[int] = 1  # tokens of the budget each member takes

    def __init__(self, requests: RequestTable, block_size: int):
        self.req, self.block_size = requests, block_size
        self._req = requests.scalars  # the same columns, one element at a time (sim/workload/request.py)
        self.clock = 0              # decode iterations run
        self.members: dict[int, int] = {}  # member -> its position in self._ids
        self.size = 0               # len(members), read several times an iteration
        self._ids = array("q")  # the members (int64, packed: a C write per change, no numpy scalar)
        self._view: np.ndarray | None = None  # ids() since the last change
        self._stored_sum = 0        # sum over members of (computed - clock at any time)
        # members opening a block at clock D, by D % block_size (a list: read and counted one at a
        # time, each join and leave; `phase_count` gives it as an array)
        self._phases = [0] * block_size
        self._finish_heap: list[tuple[int, int]] = []  # (clock when its last token is sampled, rid)
        # member -> its live heap key: an entry is current iff it matches (stale ones are skipped)
        self._finish_at: dict[int, int] = {}

    @property
    def phase_count(self) -> np.ndarray:
        """Members opening a block at clock D, by D % block_size, as an array."""
        return np.array(self._phases, dtype=np.int64)

    def context_sum(self) -> int:
        """Tokens the members hold in the KV cache before this iteration's decode."""
        return self._stored_sum + self.size * self.clock

    def ids(self) -> np.ndarray:
        """The members, as a read-only array that later changes to the pool leave alone (a copy:
        over immutable bytes, which numpy makes read-only itself)."""
        view = self._view
        if view is None:
            view = self._view = np.frombuffer(self._ids.tobytes(), np.int64)
        return view

    def computed(self, rid: int) -> int:
        stored: int = self._req.computed[rid]
        return stored + self.clock

    def join(self, rid: int) -> None:
        req, clock = self._req, self.clock
        # (typed reads: the columns are memoryviews, Any to mypyc; arithmetic on ints is native)
        computed: int = req.computed[rid]
        generated: int = req.generated[rid]
        output: int = req.output[rid]
        req.computed[rid] = stored = computed - clock
        req.generated[rid] = generated = generated - clock
        n = len(self.members)
        self._ids.append(rid)
        self._view = None
        self.members[rid] = n
        self.size = n + 1
        self._stored_sum += stored
        self._phases[(-stored) % self.block_size] += 1
        key = self._finish_at[rid] = output - generated
        heapq.heappush(self._finish_heap, (key, rid))

    def leave(self, rid: int) -> None:
        req, clock = self._req, self.clock
        stored: int = req.computed[rid]
        generated: int = req.generated[rid]
        pos, last = self.members.pop(rid), self._ids.pop()
        self._view = None
        del self._finish_at[rid]
        self.size -= 1
        if last != rid:  # the last member fills the gap
            self._ids[pos] = last
            self.members[last] = pos
        self._stored_sum -= stored
        self._phases[(-stored) % self.block_size] -= 1
        req.computed[rid] = stored + clock
        req.generated[rid] = generated + clock

    def growth(self, rid: int, kv) -> int:
        """Blocks `rid` must add to decode its next token."""
        return kv.growth(self.computed(rid), 1)

    def steps_to_next_finish(self) -> int:
        heap, live = self._finish_heap, self._finish_at
        while heap and live.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # a member that left (or left and came back with a new entry)
        return heap[0][0] - self.clock

    def new_blocks_now(self) -> int:
        """Blocks the members open in the next iteration."""
        return self._phases[self.clock % self.block_size]

    def slots_opened(self, count: int, block_size: int) -> tuple[int, list[int]]:
        """Blocks the members open over the `count` iterations after the next one, and the token
        slots (x `block_size`) opened by the end of each, cumulative: new_blocks_at(1, count)'s
        cumsum, walked in Python (a short run: fewer µs than four numpy calls)."""
        phases, bs, opened, slots = self._phases, self.block_size, 0, []
        for clock in range(self.clock + 1, self.clock + 1 + count):
            opened += phases[clock % bs]
            slots.append(opened * block_size)
        return opened, slots

    def new_blocks_at(self, first: int, count: int) -> np.ndarray:
        """Blocks the members open in each of `count` iterations, the first `first` steps ahead."""
        phase = (self.clock + first) % self.block_size
        end = phase + count
        if end <= _WRAP_TAKE_MAX:  # (a slice of a shared ramp: one numpy call less than arange per run)
            return self.phase_count.take(_RAMP[phase:end], mode="wrap")
        # a long run: the counts repeated (take's "wrap" reduces each index by repeated
        # subtraction, so over a 10M-token decode it was quadratic: 105 s at 3M tokens)
        return np.tile(self.phase_count, -(-end // self.block_size))[phase:end]

    def advance(self, steps: int) -> list[int]:
        """Run `steps` decode iterations; members that sampled their last token leave (returned)."""
        self.clock = clock = self.clock + steps
        heap, live, done = self._finish_heap, self._finish_at, []
        while heap and heap[0][0] <= clock:
            key, rid = heapq.heappop(heap)
            if live.get(rid) == key:  # (else a member that left, or left and came back)
                self.leave(rid)
                done.append(rid)
        return done


class WindowedDecodePool(DecodePool):
    """The decode pool over a sliding-window model's KV cache (sim/kv/cache.WindowedKVCache).

    Each opened block is one per layer group (`groups`). A member is *capped* from the iteration
    whose token position `c` reaches `window - 1`: from then on it attends `window` tokens, and its
    sliding groups free one block every `block_size` iterations, at the end of the iteration that
    computes position c with `(c + 2 - window) % block_size == 0` (the one after it no longer
    reaches that block). With stored computed `s` (computed - clock) that is clock
    `D % block_size == (window - 2 - s) % block_size`, counted in `close_count` as `phase_count`
    counts openings. A member becomes capped at clock `window - 1 - s` (a heap, like finishes); a
    decode run stops short of it, so within a run the capped set and both phase counts are fixed.
    """

    def __init__(self, requests: RequestTable, kv):
        super().__init__(requests, kv.block_size)
        self.groups, self.sliding_groups, self.window = kv.groups, kv.sliding_groups, kv.window
        self._behind = kv.layout.behind  # blocks behind the window at a token count, per group
        self.close_count = np.zeros(self.block_size, dtype=np.int64)
        self.capped: set[int] = set()
        self._capped_stored = 0      # sum over capped members of their stored computed
        self.behind_sum = 0          # sum over members of blocks freed behind their window (per group)
        self._cap_heap: list[tuple[int, int]] = []  # (clock at which it becomes capped, rid)

    def join(self, rid: int) -> None:
        super().join(rid)
        stored = int(self.req.computed[rid])
        self.behind_sum += self._behind(stored + self.clock, self.block_size)
        if stored + self.clock >= self.window - 1:
            self._cap(rid, stored)
        else:
            heapq.heappush(self._cap_heap, (self.window - 1 - stored, rid))

    def _cap(self, rid: int, stored: int) -> None:
        self.capped.add(rid)
        self._capped_stored += stored
        self.close_count[(self.window - 2 - stored) % self.block_size] += 1

    def leave(self, rid: int) -> None:
        stored = int(self.req.computed[rid])
        self.behind_sum -= self._behind(stored + self.clock, self.block_size)
        if rid in self.capped:
            self.capped.remove(rid)
            self._capped_stored -= stored
            self.close_count[(self.window - 2 - stored) % self.block_size] -= 1
        super().leave(rid)

    def window_sums(self) -> tuple[int, int]:
        """(sum over members of the tokens they attend in a windowed layer in the next iteration,
        min(computed + 1, window); how many are capped, whose term stays put as they advance)."""
        capped = len(self.capped)
        uncapped = self.context_sum() - (self._capped_stored + capped * self.clock)
        return uncapped + (self.size - capped) + capped * self.window, capped

    def new_blocks_now(self) -> int:
        return self.groups * self._phases[self.clock % self.block_size]

    def new_blocks_at(self, first: int, count: int) -> np.ndarray:
        return self.groups * super().new_blocks_at(first, count)

    def closes_after(self, step: int) -> int:
        """Blocks the members free at the end of the iteration `step` steps ahead (closes_at for
        one iteration, without the arrays)."""
        return self.sliding_groups * int(self.close_count[(self.clock + step) % self.block_size])

    def closes_at(self, first: int, count: int) -> np.ndarray:
        """Blocks the members free at the end of each of `count` iterations, `first` steps ahead."""
        clocks = np.arange(self.clock + first, self.clock + first + count)
        return self.sliding_groups * self.close_count[clocks % self.block_size]

    def steps_to_next_finish(self) -> int:
        """Iterations before a member finishes or becomes capped (a run stops at either)."""
        k = super().steps_to_next_finish()
        heap = self._cap_heap
        while heap and not self._uncapped(*heap[0]):
            heapq.heappop(heap)
        return min(k, heap[0][0] - self.clock) if heap else k

    def advance(self, steps: int) -> list[int]:
        closed = self.closes_after(0) if steps == 1 else int(self.closes_at(0, steps).sum())
        self.behind_sum += closed // self.sliding_groups
        done = super().advance(steps)
        heap = self._cap_heap
        while heap and heap[0][0] <= self.clock:
            key, rid = heapq.heappop(heap)
            if self._uncapped(key, rid):
                self._cap(rid, int(self.req.computed[rid]))
        return done

    def _uncapped(self, key: int, rid: int) -> bool:
        """Is this heap entry the live one for a current, not yet capped member?"""
        return rid in self.members and rid not in self.capped and key == self.window - 1 - int(self.req.computed[rid])
