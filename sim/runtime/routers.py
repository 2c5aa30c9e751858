"""Routing rules: which replica serves a request. A rule is a `Router` plus one line in `ROUTERS`;
sim/runtime/cluster.py delivers requests with it and config validation reads the names from here. Nothing
here imports simpy (the real engine's machine may have none).

A rule that reads the replicas' state sees it through `Signals`: the requests in flight and the KV
blocks in use on each, exact at every arrival or, with engine.routing.staleness_s, as of the last
scrape (sim/runtime/cluster.Scraper takes them), and the KV caches themselves for prefix lookups
(always exact: llm-d follows the servers' KV-cache events, not a scrape).
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from sim.config.errors import ScenarioError
from sim.config.routing import DEFAULT_WEIGHTS, RoutingConfig


class Router(Protocol):
    """A routing rule, built as `Rule(num_replicas, routing)` (routing: engine.routing or None)."""

    def plan(self, num_requests: int) -> np.ndarray | None:
        """The replica of every request, decided before the run; None if the rule needs the
        replicas' state at each arrival (then `choose` is asked, request by request)."""

    def choose(self, rid: int, loads: list[int]) -> int:
        """The replica for request `rid` arriving now; `loads[i]`: requests waiting or running on
        replica i, including those routed to it and not yet handed to its scheduler (as the
        `Signals` show them: exact, or as of the last scrape)."""

    def attach(self, signals: Signals | SignalView) -> None:
        """What the rule may read of the replicas beyond their loads (a rule that reads nothing
        more ignores it); called once, before the first `choose`."""


class Signals:
    """What rules read of the replicas: requests in flight (`loads`), the fraction of KV blocks in
    use (`kv_usage`), and the KV caches (`caches`, for prefix lookups). With `stale`, loads and
    usage are the last `scrape()`'s (the first is taken at time 0), else exact at every call.
    `bind(inboxes)`: the requests routed to each replica and not yet scheduled count as its load."""

    def __init__(self, schedulers: list, stale: bool = False):
        self.schedulers, self.stale = schedulers, stale
        self.caches = [s.kv for s in schedulers]
        self.loras = [getattr(s, "lora", None) for s in schedulers]  # adapter slots (engine.lora), or None
        self.inboxes: list = []
        self._loads: list[int] = [0] * len(schedulers)
        self._usage: list[float] = [0.0] * len(schedulers)

    def bind(self, inboxes: list) -> None:
        self.inboxes = inboxes
        if self.stale:
            self.scrape()

    def exact_loads(self) -> list[int]:
        return [s.load() + box.pending() for s, box in zip(self.schedulers, self.inboxes)]

    def loads(self) -> list[int]:
        return self._loads if self.stale else self.exact_loads()

    def exact_usage(self) -> list[float]:
        return [c.used / c.num_blocks for c in self.caches]

    def kv_usage(self) -> list[float]:
        return self._usage if self.stale else self.exact_usage()

    def scrape(self) -> None:
        self._loads = self.exact_loads()
        self._usage = self.exact_usage()

    def view(self, replicas: list[int]) -> SignalView:
        return SignalView(self, replicas)


class SignalView:
    """The `Signals` of some replicas (an autoscaled fleet's serving ones), indexed 0.. in that order."""

    def __init__(self, signals: Signals, replicas: list[int]):
        self.signals, self.replicas = signals, replicas
        self.caches = [signals.caches[i] for i in replicas]
        self.loras = [signals.loras[i] for i in replicas]

    def kv_usage(self) -> list[float]:
        usage = self.signals.kv_usage()
        return [usage[i] for i in self.replicas]


class RoundRobin:
    def __init__(self, num_replicas: int, routing: RoutingConfig | None = None):
        self.num_replicas = num_replicas

    def attach(self, signals: Signals | SignalView) -> None:
        pass  # reads nothing

    def plan(self, num_requests: int) -> np.ndarray:
        return np.arange(num_requests) % self.num_replicas

    def choose(self, rid: int, loads: list[int]) -> int:
        return rid % self.num_replicas


class LeastLoaded:
    def __init__(self, num_replicas: int, routing: RoutingConfig | None = None):
        self.num_replicas = num_replicas

    def attach(self, signals: Signals | SignalView) -> None:
        pass  # reads the loads only

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
    the replicas' caches through `attach` (sim/build.py calls it); without prefix caching it is
    least_loaded."""

    MAX_IMBALANCE = 1.0  # a replica may carry up to 2 x + 1 the lightest load and still win on hits

    def __init__(self, num_replicas: int, routing: RoutingConfig | None = None):
        self.num_replicas = num_replicas
        self.caches: list = []

    def attach(self, signals: Signals | SignalView) -> None:
        self.caches = signals.caches

    def plan(self, num_requests: int) -> None:
        return None

    def choose(self, rid: int, loads: list[int]) -> int:
        lightest = int(np.argmin(loads))
        hits = _cached_blocks(self.caches, rid)
        best = max(hits, default=0)
        if best == 0:
            return lightest
        winner = min((i for i, h in enumerate(hits) if h == best), key=lambda i: (loads[i], i))
        limit = loads[lightest] * (1 + self.MAX_IMBALANCE) + 1
        return winner if loads[winner] <= limit else lightest


def _cached_blocks(caches: list, rid: int) -> list[int]:
    """Blocks of request `rid`'s prompt each replica's cache holds (a cache without prefix caching
    holds no identified block: 0)."""
    return [len(c.lookup(rid, int(c.prompt[rid]))) if hasattr(c, "prompt") else 0 for c in caches]


def _prefix_hits(caches: list, rid: int) -> list[float]:
    """Each replica's cached share of request `rid`'s prompt: blocks found / the prompt's full
    blocks (llm-d's prefix scorer; 0 everywhere without prefix caching)."""
    full = [int(c.prompt[rid]) // c.block_size if hasattr(c, "prompt") else 0 for c in caches]
    return [h / f if f else 0.0 for h, f in zip(_cached_blocks(caches, rid), full)]


def _queue_depth(loads: list[int]) -> list[float]:
    """The Gateway API Inference Extension's queue scorer, min-max normalised over the replicas:
    the lightest 1, the heaviest 0, all 1 when equal. Its measure here is the requests in flight
    (waiting or running, as BLIS's queue-depth scorer counts), not the waiting ones only."""
    lo, hi = min(loads), max(loads)
    return [1.0] * len(loads) if hi == lo else [(hi - x) / (hi - lo) for x in loads]


class Weighted:
    """llm-d's scorer-and-picker scheme: every scorer gives each replica a score in [0, 1],
    prefix_affinity (the cached share of the prompt), queue_depth (min-max over the requests in
    flight), kv_utilization (1 - the fraction of KV blocks in use); the replica with the highest
    weighted sum wins, ties to the lowest index (llm-d picks among ties at random). Weights:
    engine.routing.weights (default prefix_affinity 3, queue_depth 2, kv_utilization 2)."""

    def __init__(self, num_replicas: int, routing: RoutingConfig | None = None):
        self.num_replicas = num_replicas
        self.weights = routing.weights if routing is not None else DEFAULT_WEIGHTS
        self.signals: Signals | SignalView | None = None

    def attach(self, signals: Signals | SignalView) -> None:
        self.signals = signals

    def plan(self, num_requests: int) -> None:
        return None

    def scores(self, rid: int, loads: list[int]) -> list[float]:
        """Each replica's weighted score for request `rid`."""
        signals = self.signals
        assert signals is not None, "Weighted.attach(signals) first"
        total = [0.0] * len(loads)
        for name, weight in self.weights:
            if weight == 0:
                continue
            if name == "queue_depth":
                part = _queue_depth(loads)
            elif name == "kv_utilization":
                part = [1.0 - u for u in signals.kv_usage()]
            else:  # prefix_affinity
                part = _prefix_hits(signals.caches, rid)
            total = [t + weight * p for t, p in zip(total, part)]
        return total

    def choose(self, rid: int, loads: list[int]) -> int:
        total = self.scores(rid, loads)
        return total.index(max(total))  # ties: the lowest index


class LoRAAffinity:
    """Send a request for a LoRA adapter where that adapter is in use or resident in the GPU's slots
    (no load, and it can join a batch already using it), else where a slot is free (after the
    Gateway API Inference Extension's LoRA affinity scorer), each time the least loaded of those,
    unless its load exceeds the least loaded replica's by more than 2 x + 1 requests (PrefixAware's
    bound), when the least loaded wins. A base-model request, or a run without engine.lora: least
    loaded."""

    MAX_IMBALANCE = 1.0

    def __init__(self, num_replicas: int, routing: RoutingConfig | None = None):
        self.num_replicas = num_replicas
        self.loras: list = []

    def attach(self, signals: Signals | SignalView) -> None:
        self.loras = signals.loras

    def plan(self, num_requests: int) -> None:
        return None

    def choose(self, rid: int, loads: list[int]) -> int:
        lightest = int(np.argmin(loads))
        slots = self.loras
        if not slots or slots[0] is None or slots[0].adapter[rid] < 0:
            return lightest
        a = slots[0].adapter[rid]
        for fits in ((lambda s: a in s.running or a in s.slots), (lambda s: len(s.running) < s.max_loras)):
            ok = [i for i, s in enumerate(slots) if fits(s)]
            if ok:
                winner = min(ok, key=lambda i: (loads[i], i))
                limit = loads[lightest] * (1 + self.MAX_IMBALANCE) + 1
                return winner if loads[winner] <= limit else lightest
        return lightest


ROUTERS: dict[str, type] = {"round_robin": RoundRobin, "least_loaded": LeastLoaded,
                            "prefix_aware": PrefixAware, "weighted": Weighted, "lora_affinity": LoRAAffinity}


def make_router(name: str, num_replicas: int, routing: RoutingConfig | None = None) -> Router:
    """The rule `name` over `num_replicas` replicas; every rule is built as `ROUTERS[name](num_replicas,
    routing)` (engine.routing: what a rule may read of it, e.g. the weighted rule's weights)."""
    if name not in ROUTERS:
        raise ScenarioError(f"engine.router: {name!r} is not one of {', '.join(ROUTERS)}")
    return ROUTERS[name](num_replicas, routing)
