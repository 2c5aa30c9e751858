"""Multi-LoRA serving on one replica (engine.lora; vLLM's --enable-lora): which adapters a batch may
use and which must be loaded first.

As vLLM V1 does it:
- A batch uses at most `max_loras` distinct adapters. A waiting request whose adapter is not among
  the running requests' when that many are already in use is skipped (it keeps its place in line;
  requests behind it may join), as vLLM's scheduler skips it.
- The GPU holds `max_loras` adapter slots, least recently used first out. An iteration whose batch
  uses an adapter not in a slot loads it first, synchronously (vLLM activates a batch's adapters
  before its forward pass): `lora_loads` in the iteration's BatchStats, priced by sim/features/lora/cost.py.

Not modelled: the CPU-side adapter cache (`--max-cpu-loras`) and the first read of an adapter from
storage (every adapter is taken as in host memory already), adapters of different ranks (each is
sized at max_lora_rank), LoRA on MoE experts.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np


class LoRASlots:
    """One replica's adapters: in use by running requests, and resident in its GPU slots."""

    def __init__(self, max_loras: int, adapter: np.ndarray):
        self.max_loras = max_loras
        self.adapter = adapter.tolist()           # per request: its adapter id, -1 for none
        self.running: dict[int, int] = {}         # adapter -> running requests using it
        self.slots: OrderedDict = OrderedDict()   # adapter resident on the GPU, least recently used first
        self.loads = 0                            # adapters loaded into slots over the run

    def restart(self) -> None:
        """An autoscaled replica started again: no adapter resident."""
        assert not self.running, "restart with adapters in use"
        self.slots = OrderedDict()

    def admits(self, rid: int) -> bool:
        """May request `rid` join the running batch now?"""
        a = self.adapter[rid]
        return a < 0 or a in self.running or len(self.running) < self.max_loras

    def join(self, rid: int) -> None:
        a = self.adapter[rid]
        if a >= 0:
            self.running[a] = self.running.get(a, 0) + 1

    def leave(self, rid: int) -> None:
        a = self.adapter[rid]
        if a >= 0:
            left = self.running[a] - 1
            if left:
                self.running[a] = left
            else:
                del self.running[a]

    def batch(self) -> tuple[int, int]:
        """(adapters the next iteration uses, of them not yet resident: loaded first), the slots
        brought up to date (the batch's adapters most recently used)."""
        slots, loads = self.slots, 0
        for a in self.running:
            if a in slots:
                slots.move_to_end(a)
            else:
                slots[a] = None
                loads += 1
        while len(slots) > self.max_loras:  # the least recently used not in this batch
            slots.popitem(last=False)
        self.loads += loads
        return len(self.running), loads
