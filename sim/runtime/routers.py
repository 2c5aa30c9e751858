"""Routing rules: which replica serves a request. A rule is a `Router` plus one line in `ROUTERS`;
sim/runtime/cluster.py delivers requests with it and config validation reads the names from here. Nothing
here imports simpy (the real engine's machine may have none).
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from sim.config.errors import ScenarioError


class Router(Protocol):
    def plan(self, num_requests: int) -> np.ndarray | None:
        """The replica of every request, decided before the run; None if the rule needs the
        replicas' state at each arrival (then `choose` is asked, request by request)."""

    def choose(self, rid: int, loads: list[int]) -> int:
        """The replica for request `rid` arriving now; `loads[i]`: requests waiting or running on
        replica i, including those routed to it and not yet handed to its scheduler."""


class RoundRobin:
    def __init__(self, num_replicas: int):
        self.num_replicas = num_replicas

    def plan(self, num_requests: int) -> np.ndarray:
        return np.arange(num_requests) % self.num_replicas

    def choose(self, rid: int, loads: list[int]) -> int:
        return rid % self.num_replicas


class LeastLoaded:
    def __init__(self, num_replicas: int):
        self.num_replicas = num_replicas

    def plan(self, num_requests: int) -> None:
        return None

    def choose(self, rid: int, loads: list[int]) -> int:
        return int(np.argmin(loads))  # ties: the lowest index


class PrefixAware:
    """Send a request to the replica whose KV cache holds the longest prefix of its prompt (after
    llm-d's precise prefix-cache scorer), trading cache hits against load with one rule: the
    replica with the most cached blocks wins (ties: the less loaded, then the lower index) unless
    its load exceeds the least loaded replica's by more than `MAX_IMBALANCE` x that + 1 requests,
    when the least loaded wins instead; with nothing cached anywhere, the least loaded wins. Sees
    the replicas' caches through `attach` (sim/simulate.py calls it); without prefix caching it is
    least_loaded."""

    MAX_IMBALANCE = 1.0  # a replica may carry up to 2 x + 1 the lightest load and still win on hits

    def __init__(self, num_replicas: int):
        self.num_replicas = num_replicas
        self.caches: list = []

    def attach(self, caches: list) -> None:
        self.caches = caches

    def plan(self, num_requests: int) -> None:
        return None

    def choose(self, rid: int, loads: list[int]) -> int:
        lightest = int(np.argmin(loads))
        hits = [len(c.lookup(rid, int(c.prompt[rid]))) if hasattr(c, "prompt") else 0 for c in self.caches]
        best = max(hits, default=0)
        if best == 0:
            return lightest
        winner = min((i for i, h in enumerate(hits) if h == best), key=lambda i: (loads[i], i))
        limit = loads[lightest] * (1 + self.MAX_IMBALANCE) + 1
        return winner if loads[winner] <= limit else lightest


ROUTERS: dict[str, type] = {"round_robin": RoundRobin, "least_loaded": LeastLoaded,
                            "prefix_aware": PrefixAware}


def make_router(name: str, num_replicas: int) -> Router:
    if name not in ROUTERS:
        raise ScenarioError(f"engine.router: {name!r} is not one of {', '.join(ROUTERS)}")
    return ROUTERS[name](num_replicas)


