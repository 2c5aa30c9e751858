"""engine.autoscaling as data: replicas added and removed during the run by a horizontal
autoscaler (what is simulated: sim/runtime/autoscaler.py).

The rule is Kubernetes' Horizontal Pod Autoscaler's, on one metric: the requests in flight (waiting,
running or routed and not yet scheduled: what least_loaded balances) per replica. Every
`interval_s` the autoscaler wants ceil(in flight / target) replicas, within [min_replicas,
max_replicas], and does nothing while in flight / (target x replicas) is within `tolerance` of 1.
More replicas are started at once and serve `cold_start_s` later (weights loaded, engine warmed
up); fewer only when every wish over the last `scale_down_delay_s` was fewer (HPA's downscale
stabilisation window), and a replica taken away first drains: it gets no new requests and is
released when its last one finishes. Replicas held (starting, serving, draining) never exceed
max_replicas. Defaults are HPA's: a 15 s sync period, 10% tolerance, a 300 s window.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sim.config.checks import MAX_REPLICAS, MAX_SECONDS, _int, _num, _section
from sim.config.errors import ScenarioError

KEYS = ("min_replicas", "max_replicas", "target_in_flight", "interval_s", "cold_start_s", "scale_down_delay_s",
        "tolerance")


@dataclass(frozen=True)
class AutoscalingConfig:
    min_replicas: int
    max_replicas: int
    target_in_flight: float          # requests in flight per replica the autoscaler aims for
    interval_s: float = 15.0         # s between decisions (HPA's --horizontal-pod-autoscaler-sync-period)
    cold_start_s: float = 60.0       # s from the decision to start a replica until it serves
    scale_down_delay_s: float = 300.0  # s every wish must have been fewer replicas before removing any
    tolerance: float = 0.1           # no change while in flight / (target x replicas) is within 1 +- this

    def as_yaml(self) -> dict:
        return asdict(self)


def parse_autoscaling(v: Any, at, replicas: int | None) -> AutoscalingConfig | None:
    """engine.autoscaling as written; `at(key)` names an engine key's path; `replicas` (engine.replicas
    as written; None: min_replicas) is how many serve at the start, within [min_replicas, max_replicas]."""
    if v is None:
        return None
    m = _section(v, "autoscaling", lambda k: at(k), KEYS)
    where = lambda k: at(f"autoscaling.{k}")  # noqa: E731
    for key in ("max_replicas", "target_in_flight"):
        if m.get(key) is None:
            raise ScenarioError(f"{where(key)}: missing; engine.autoscaling needs max_replicas and "
                                "target_in_flight (requests in flight per replica), e.g. "
                                "{max_replicas: 8, target_in_flight: 32}")
    low = _int(m.get("min_replicas", 1), where("min_replicas"), lo=1, cap=MAX_REPLICAS)
    config = AutoscalingConfig(
        min_replicas=low,
        max_replicas=_int(m["max_replicas"], where("max_replicas"), lo=low, cap=MAX_REPLICAS),
        target_in_flight=_num(m["target_in_flight"], where("target_in_flight"), 0, open_lo=True, cap=1e9),
        # at least 0.1 s: a decision per microsecond would tick a day's run 1e11 times (a hang)
        interval_s=_num(m.get("interval_s", 15.0), where("interval_s"), 0.1, cap=MAX_SECONDS),
        cold_start_s=_num(m.get("cold_start_s", 60.0), where("cold_start_s"), 0, cap=MAX_SECONDS),
        scale_down_delay_s=_num(m.get("scale_down_delay_s", 300.0), where("scale_down_delay_s"), 0,
                                cap=MAX_SECONDS),
        tolerance=_num(m.get("tolerance", 0.1), where("tolerance"), 0, 1, open_hi=True))
    if replicas is not None and not config.min_replicas <= replicas <= config.max_replicas:
        raise ScenarioError(f"{at('replicas')}: {replicas} replicas serve at the start, outside engine.autoscaling's "
                            f"[{config.min_replicas}, {config.max_replicas}]")
    return config
