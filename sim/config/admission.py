"""engine.admission as data: a gateway in front of the router that admits requests at a bounded
rate (what is simulated: sim/runtime/gateway.py).

A token bucket: `burst` tokens at the start, refilled at `rate` per second up to `burst`; each
arriving request takes one. When none is left, `on_empty: shed` turns the request away (counted,
never silently dropped: requests.csv marks it `shed`), and `queue` holds it at the gateway until a
token comes, in arrival order, turning it away only if that would take longer than `max_wait_s`.
The wait is the client's: TTFT and E2E count it from the request's own arrival.

`classes` gives a workload class (workload.classes) a bucket of its own, a tenant's quota: its
requests pass through that bucket alone, the others through the shared one (or freely, when only
classes have buckets).

`max_in_flight` bounds the requests past the gateway and not finished (waiting or running on any
replica): the others wait at the gateway in arrival order (after any bucket) and pass as requests
finish; one that has waited longer than `max_queue_wait_s` when its turn comes is turned away (the
client gave up). `queue_order: priority` lets the most urgent waiting request (the workload's
priority, a class's: lower first; ties by arrival) pass first instead of the earliest. Decided
during the run (sim/runtime/cluster.Gate), unlike the buckets.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sim.config.checks import MAX_COUNT, MAX_RATE, MAX_SECONDS, _choice, _int, _num, _section
from sim.config.errors import ScenarioError

KEYS = ("rate", "burst", "on_empty", "max_wait_s", "classes", "max_in_flight", "max_queue_wait_s", "queue_order")
QUEUE_ORDERS = ("arrival", "priority")
CLASS_KEYS = ("rate", "burst", "on_empty", "max_wait_s")
ON_EMPTY = ("shed", "queue")


@dataclass(frozen=True)
class Bucket:
    rate: float                     # tokens (requests) per second the bucket refills
    burst: float                    # tokens it holds at most (and at the start)
    on_empty: str = "shed"          # shed | queue
    max_wait_s: float | None = None  # queue: the longest a request waits at the gateway (None: no limit)

    def as_yaml(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class AdmissionConfig(Bucket):
    """The shared bucket (rate/burst/...), and a workload class's own (`classes`: a tenant's quota):
    a class with its own bucket passes through it alone; the others through the shared one, or
    freely when the shared one is not set (rate 0: only with classes or max_in_flight); and the
    gateway's concurrency limit, if any."""
    classes: tuple[tuple[str, Bucket], ...] = ()
    max_in_flight: int | None = None       # requests past the gateway and not finished, at most
    max_queue_wait_s: float | None = None  # the longest a request waits for that (None: no limit)
    queue_order: str = "arrival"            # who passes first when one may: arrival | priority (lower first)

    @property
    def shared(self) -> Bucket | None:
        return None if self.rate == 0 else Bucket(self.rate, self.burst, self.on_empty, self.max_wait_s)

    def as_yaml(self) -> dict:
        shared = self.shared
        out = shared.as_yaml() if shared is not None else {}
        if self.classes:
            out["classes"] = {name: b.as_yaml() for name, b in self.classes}
        out.update({k: getattr(self, k) for k in ("max_in_flight", "max_queue_wait_s") if getattr(self, k) is not None})
        if self.queue_order != "arrival":
            out["queue_order"] = self.queue_order
        return out


def parse_admission(v: Any, at) -> AdmissionConfig | None:
    """engine.admission as written; `at(key)` names an engine key's path."""
    if v is None:
        return None
    m = _section(v, "admission", lambda k: at(k), KEYS)
    classes: list[tuple[str, Bucket]] = []
    if m.get("classes") is not None:
        if not isinstance(m["classes"], dict) or not m["classes"]:
            raise ScenarioError(f"{at('admission.classes')}: {m['classes']!r} is not a mapping of workload class "
                                "names to their own bucket, e.g. {batch: {rate: 2, burst: 10}}")
        for name, section in m["classes"].items():
            where = f"admission.classes.{name}"
            classes.append((str(name), _bucket(_section(section, where, lambda k: at(k), CLASS_KEYS),
                                               lambda k, w=where: at(f"{w}.{k}"))))
    limit = None if m.get("max_in_flight") is None else _int(m["max_in_flight"], at("admission.max_in_flight"), lo=1,
                                                                cap=MAX_COUNT)
    queue_wait = m.get("max_queue_wait_s")
    if queue_wait is not None and limit is None:
        raise ScenarioError(f"{at('admission.max_queue_wait_s')}: only with max_in_flight (the wait for it)")
    wait = None if queue_wait is None else _num(queue_wait, at("admission.max_queue_wait_s"), 0, cap=MAX_SECONDS)
    order = _choice(m.get("queue_order", "arrival"), at("admission.queue_order"), QUEUE_ORDERS)
    if order != "arrival" and limit is None:
        raise ScenarioError(f"{at('admission.queue_order')}: only with max_in_flight (the order of its queue)")
    if m.get("rate") is None:
        if (classes or limit is not None) and all(m.get(k) is None for k in CLASS_KEYS):  # no shared bucket
            return AdmissionConfig(rate=0.0, burst=0.0, classes=tuple(classes), max_in_flight=limit,
                                   max_queue_wait_s=wait, queue_order=order)
        raise ScenarioError(f"{at('admission.rate')}: missing; engine.admission is a token bucket, e.g. "
                            "{rate: 20, burst: 40} (requests/s, and the most admitted at once), and/or a "
                            "concurrency limit, {max_in_flight: 64}")
    shared = _bucket(m, lambda k: at(f"admission.{k}"))
    return AdmissionConfig(shared.rate, shared.burst, shared.on_empty, shared.max_wait_s, tuple(classes),
                           max_in_flight=limit, max_queue_wait_s=wait, queue_order=order)


def _bucket(m: dict, where) -> Bucket:
    """One bucket's keys (rate required); `where(key)` names its path."""
    if m.get("rate") is None:
        raise ScenarioError(f"{where('rate')}: missing; a token bucket needs a rate, e.g. {{rate: 20, burst: 40}}")
    on_empty = _choice(m.get("on_empty", "shed"), where("on_empty"), ON_EMPTY)
    wait = m.get("max_wait_s")
    if wait is not None and on_empty != "queue":
        raise ScenarioError(f"{where('max_wait_s')}: only with on_empty: queue (shed turns a request away at once)")
    return Bucket(
        rate=_num(m["rate"], where("rate"), 0, open_lo=True, cap=MAX_RATE),
        burst=_num(m.get("burst", 1), where("burst"), 1, cap=MAX_COUNT),
        on_empty=on_empty,
        max_wait_s=None if wait is None else _num(wait, where("max_wait_s"), 0, cap=MAX_SECONDS))
