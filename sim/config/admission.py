"""engine.admission as data: a gateway in front of the router that admits requests at a bounded
rate (what is simulated: sim/runtime/gateway.py).

A token bucket: `burst` tokens at the start, refilled at `rate` per second up to `burst`; each
arriving request takes one. When none is left, `on_empty: shed` turns the request away (counted,
never silently dropped: requests.csv marks it `shed`), and `queue` holds it at the gateway until a
token comes, in arrival order, turning it away only if that would take longer than `max_wait_s`.
The wait is the client's: TTFT and E2E count it from the request's own arrival.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sim.config.checks import MAX_COUNT, MAX_RATE, MAX_SECONDS, _choice, _num, _section
from sim.config.errors import ScenarioError

KEYS = ("rate", "burst", "on_empty", "max_wait_s")
ON_EMPTY = ("shed", "queue")


@dataclass(frozen=True)
class AdmissionConfig:
    rate: float                     # tokens (requests) per second the bucket refills
    burst: float                    # tokens it holds at most (and at the start)
    on_empty: str = "shed"          # shed | queue
    max_wait_s: float | None = None  # queue: the longest a request waits at the gateway (None: no limit)

    def as_yaml(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


def parse_admission(v: Any, at) -> AdmissionConfig | None:
    """engine.admission as written; `at(key)` names an engine key's path."""
    if v is None:
        return None
    m = _section(v, "admission", lambda k: at(k), KEYS)
    where = lambda k: at(f"admission.{k}")  # noqa: E731
    if m.get("rate") is None:
        raise ScenarioError(f"{where('rate')}: missing; engine.admission is a token bucket, e.g. "
                            "{rate: 20, burst: 40} (requests/s, and the most admitted at once)")
    on_empty = _choice(m.get("on_empty", "shed"), where("on_empty"), ON_EMPTY)
    wait = m.get("max_wait_s")
    if wait is not None and on_empty != "queue":
        raise ScenarioError(f"{where('max_wait_s')}: only with on_empty: queue (shed turns a request away at once)")
    return AdmissionConfig(
        rate=_num(m["rate"], where("rate"), 0, open_lo=True, cap=MAX_RATE),
        burst=_num(m.get("burst", 1), where("burst"), 1, cap=MAX_COUNT),
        on_empty=on_empty,
        max_wait_s=None if wait is None else _num(wait, where("max_wait_s"), 0, cap=MAX_SECONDS))
