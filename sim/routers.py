"""Routing rules: which replica serves a request. A rule is a `Router` plus one line in `ROUTERS`;
sim/cluster.py delivers requests with it and config validation reads the names from here. Nothing
here imports simpy (the real engine's machine may have none).
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from .errors import ScenarioError


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


ROUTERS: dict[str, type] = {"round_robin": RoundRobin, "least_loaded": LeastLoaded}


def make_router(name: str, num_replicas: int) -> Router:
    if name not in ROUTERS:
        raise ScenarioError(f"engine.router: {name!r} is not one of {', '.join(ROUTERS)}")
    return ROUTERS[name](num_replicas)


