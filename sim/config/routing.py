"""engine.routing as data: what the routing rule sees of the replicas, and how the `weighted` rule
weighs it (what is simulated: sim/runtime/routers.py, the scrape: sim/runtime/cluster.Scraper).

`staleness_s`: the replicas' load signals (requests in flight, KV blocks in use) are scraped every
`staleness_s` seconds, as a gateway polls each vLLM server's /metrics (the Gateway API Inference
Extension's endpoint picker: every 50 ms by default, its --refresh-metrics-interval); between two
scrapes a rule routes on the last one, blind to what it has routed since. 0 (the default): the
signals are exact at every arrival. Prefix-cache hits are always exact: llm-d's precise
prefix-cache scorer follows the servers' KV-cache events as they happen, not a scrape.

`weights` (the `weighted` rule only): each scorer scores every replica in [0, 1] and the replica
with the highest weighted sum wins. The default is BLIS's (inference-sim) llm-d parity setting:
prefix_affinity 3, queue_depth 2, kv_utilization 2.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.config.checks import MAX_SECONDS, _num, _section
from sim.config.errors import ScenarioError

KEYS = ("staleness_s", "weights")
SCORERS = ("prefix_affinity", "queue_depth", "kv_utilization")  # the weighted rule's (sim/runtime/routers.Weighted)
DEFAULT_WEIGHTS: tuple[tuple[str, float], ...] = (
    ("prefix_affinity", 3.0), ("queue_depth", 2.0), ("kv_utilization", 2.0))


@dataclass(frozen=True)
class RoutingConfig:
    staleness_s: float = 0.0                                 # s between scrapes of the load signals (0: exact)
    weights: tuple[tuple[str, float], ...] = DEFAULT_WEIGHTS  # scorer -> weight (the weighted rule)

    def as_yaml(self, router: str) -> dict:
        """As a scenario writes it under `router` (weights only for the weighted rule, which alone reads them)."""
        out: dict = {"staleness_s": self.staleness_s}
        if router == "weighted":
            out["weights"] = dict(self.weights)
        return out


def parse_routing(v: Any, at, router: str) -> RoutingConfig | None:
    """engine.routing as written; `at(key)` names an engine key's path; `router`: engine.router."""
    if v is None:
        return None
    m = _section(v, "routing", lambda k: at(k), KEYS)
    where = lambda k: at(f"routing.{k}")  # noqa: E731
    weights = DEFAULT_WEIGHTS
    if m.get("weights") is not None:
        if router != "weighted":
            raise ScenarioError(f"{where('weights')}: only the weighted router reads weights "
                                f"(engine.router is {router})")
        w = _section(m["weights"], "weights", where, SCORERS)
        weights = tuple((k, _num(w[k], where("weights." + k), 0, cap=1e6)) for k in SCORERS if k in w)
        if not any(x > 0 for _, x in weights):
            raise ScenarioError(f"{where('weights')}: no scorer has a weight above 0 (scorers: {', '.join(SCORERS)})")
    # at least 1 ms: a scrape per nanosecond would tick a day's run 1e14 times (a hang)
    staleness = _num(m.get("staleness_s", 0.0), where("staleness_s"), 0, cap=MAX_SECONDS)
    if 0 < staleness < 1e-3:
        raise ScenarioError(f"{where('staleness_s')}: {staleness:g} s; 0 (exact signals) or at least 0.001 s")
    return RoutingConfig(staleness_s=staleness, weights=weights)
