"""Waiting-queue policies: which waiting request a scheduler considers next.

`push_front` puts a preempted request back first in line (vLLM V1 `prepend_request`); ordered
policies (sjf, priority) re-insert it by its key instead, as vLLM's priority queue does.
"""
from __future__ import annotations

import heapq
from collections import deque
from typing import Protocol

import numpy as np

from sim.config.errors import ScenarioError


class WaitingQueue(Protocol):
    def push(self, rid: int) -> None: ...
    def push_front(self, rid: int) -> None: ...
    def peek(self) -> int: ...
    def pop(self) -> int: ...
    def __len__(self) -> int: ...


class FCFSQueue(deque):
    """Arrival order: a deque, so that `len`, asked several times an iteration, is deque's own."""

    new_arrivals_last = True  # an arrival never jumps a blocked head of the line

    def __init__(self, keys: np.ndarray | None = None):
        super().__init__()

    push = deque.append
    push_front = deque.appendleft
    pop = deque.popleft  # (the head of the line, not deque's right end)

    def peek(self) -> int:
        return self[0]


class KeyedQueue:
    """Smallest key first; ties by request id (arrival order)."""

    new_arrivals_last = False

    def __init__(self, keys: np.ndarray):
        self._keys = keys
        self._heap: list[tuple[int, int]] = []

    def push(self, rid: int) -> None:
        heapq.heappush(self._heap, (int(self._keys[rid]), rid))

    push_front = push

    def peek(self) -> int:
        return self._heap[0][1]

    def pop(self) -> int:
        return heapq.heappop(self._heap)[1]

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self):
        return (rid for _, rid in self._heap)


# policy name -> (queue class, which RequestTable column orders it)
POLICIES = {"fcfs": (FCFSQueue, None), "sjf": (KeyedQueue, "output"), "priority": (KeyedQueue, "priority")}


def make_queue(policy: str, requests) -> WaitingQueue:
    if policy not in POLICIES:
        raise ScenarioError(f"engine.policy: {policy!r} is not one of {', '.join(POLICIES)}")
    cls, column = POLICIES[policy]
    return cls(getattr(requests, column) if column else None)
