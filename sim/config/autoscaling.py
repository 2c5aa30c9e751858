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
        "tolerance", "min_replicas_schedule", "schedule_period_s")


@dataclass(frozen=True)
class AutoscalingConfig:
    min_replicas: int
    max_replicas: int
    target_in_flight: float          # requests in flight per replica the autoscaler aims for
    interval_s: float = 15.0         # s between decisions (HPA's --horizontal-pod-autoscaler-sync-period)
    cold_start_s: float = 60.0       # s from the decision to start a replica until it serves
    scale_down_delay_s: float = 300.0  # s every wish must have been fewer replicas before removing any
    tolerance: float = 0.1           # no change while in flight / (target x replicas) is within 1 +- this
    # scheduled scaling (a cron floor, as KEDA's cron scaler): ((start_s, replicas), ...), each floor
    # holding from its start to the next (after the last: for ever, or the schedule repeats every
    # schedule_period_s); the floor at t is max(min_replicas, the schedule's). (): min_replicas only
    min_replicas_schedule: tuple[tuple[float, int], ...] = ()
    schedule_period_s: float | None = None

    def floor(self, t: float) -> int:
        """The fewest replicas wanted at time t (s)."""
        if not self.min_replicas_schedule:
            return self.min_replicas
        if self.schedule_period_s is not None:
            t = t % self.schedule_period_s
        floor = self.min_replicas_schedule[0][1]
        for start, n in self.min_replicas_schedule:
            if start > t:
                break
            floor = n
        return max(self.min_replicas, floor)

    def as_yaml(self) -> dict:
        out = asdict(self)
        out["min_replicas_schedule"] = [list(x) for x in self.min_replicas_schedule]
        if not self.min_replicas_schedule:
            del out["min_replicas_schedule"], out["schedule_period_s"]
        elif self.schedule_period_s is None:
            del out["schedule_period_s"]
        return out


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
    high = _int(m["max_replicas"], where("max_replicas"), lo=low, cap=MAX_REPLICAS)
    config = AutoscalingConfig(
        min_replicas=low,
        max_replicas=high,
        target_in_flight=_num(m["target_in_flight"], where("target_in_flight"), 0, open_lo=True, cap=1e9),
        # at least 0.1 s: a decision per microsecond would tick a day's run 1e11 times (a hang)
        interval_s=_num(m.get("interval_s", 15.0), where("interval_s"), 0.1, cap=MAX_SECONDS),
        cold_start_s=_num(m.get("cold_start_s", 60.0), where("cold_start_s"), 0, cap=MAX_SECONDS),
        scale_down_delay_s=_num(m.get("scale_down_delay_s", 300.0), where("scale_down_delay_s"), 0,
                                cap=MAX_SECONDS),
        tolerance=_num(m.get("tolerance", 0.1), where("tolerance"), 0, 1, open_hi=True),
        **_schedule(m, where, high))
    if replicas is not None and not config.min_replicas <= replicas <= config.max_replicas:
        raise ScenarioError(f"{at('replicas')}: {replicas} replicas serve at the start, outside engine.autoscaling's "
                            f"[{config.min_replicas}, {config.max_replicas}]")
    return config


def _schedule(m: dict, where, high: int) -> dict:
    """min_replicas_schedule: [[start_s, replicas], ...] (the first at 0, increasing; replicas
    within [1, max_replicas]) and schedule_period_s (after the last start); {} without one."""
    raw = m.get("min_replicas_schedule")
    if raw is None:
        if m.get("schedule_period_s") is not None:
            raise ScenarioError(f"{where('schedule_period_s')}: only with min_replicas_schedule")
        return {}
    at = where("min_replicas_schedule")
    if not isinstance(raw, list) or not raw or not all(isinstance(r, (list, tuple)) and len(r) == 2 for r in raw):
        raise ScenarioError(f"{at}: a list of [start_s, replicas] pairs (the first at 0), e.g. "
                            "[[0, 1], [28800, 3], [72000, 1]]")
    starts = [_num(t, f"{at}[{k}] start_s", 0, cap=MAX_SECONDS) for k, (t, _) in enumerate(raw)]
    counts = [_int(n, f"{at}[{k}] replicas", lo=1, hi=high) for k, (_, n) in enumerate(raw)]
    if starts[0] != 0 or any(b <= a for a, b in zip(starts, starts[1:])):
        raise ScenarioError(f"{at}: start times must begin at 0 and increase; got {starts[:6]}")
    period = m.get("schedule_period_s")
    if period is not None:
        period = _num(period, where("schedule_period_s"), 0, open_lo=True, cap=MAX_SECONDS)
        if period <= starts[-1]:
            raise ScenarioError(f"{where('schedule_period_s')}: {period:g} is not after the last start "
                                f"({starts[-1]:g} s)")
    return {"min_replicas_schedule": tuple(zip(starts, counts)), "schedule_period_s": period}
