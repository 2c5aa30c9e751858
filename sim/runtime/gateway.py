"""The gateway in front of the router (engine.admission; the rule: sim/config/admission.py): which
requests a token bucket admits, and when. Open-loop arrivals are known up front, so the whole
admission is decided before the run, in arrival order: `admit` gives each request the time it
passes the gateway, or NaN when it is turned away (shed). Nothing here imports simpy."""
from __future__ import annotations

import numpy as np

from sim.config.admission import AdmissionConfig, Bucket

EPS = 1e-12  # tokens: a bucket refilled to 1 - 1e-16 by float rounding holds a token


def admit_all(config: AdmissionConfig, arrival_s: np.ndarray, classes: np.ndarray | None = None,
              names: tuple[str, ...] = ()) -> np.ndarray:
    """`admit` over every request: each workload class with its own bucket (config.classes) through
    it, the others through the shared bucket, or admitted at arrival when there is none."""
    own = dict(config.classes)
    assert classes is not None or not own  # (config checks: bucket classes name workload classes)
    out = np.array(arrival_s, dtype=np.float64)  # no bucket: passes at once
    rest = np.ones(len(arrival_s), dtype=bool)
    for k, name in enumerate(names):
        if name in own:
            mine = classes == k
            out[mine] = admit(own[name], arrival_s[mine])
            rest &= ~mine
    if config.shared is not None and rest.any():
        out[rest] = admit(config.shared, arrival_s[rest])
    return out


def admit(config: Bucket, arrival_s: np.ndarray) -> np.ndarray:
    """Per request (arrivals ascending): when it passes the gateway (>= its arrival; later when it
    queued for a token), NaN when shed. The bucket is full at t = 0; queued requests take tokens
    in arrival order, so a request waits behind those queued before it."""
    rate, burst, queue = config.rate, config.burst, config.on_empty == "queue"
    limit = np.inf if config.max_wait_s is None else config.max_wait_s
    out = np.full(len(arrival_s), np.nan)
    tokens, last, free = burst, 0.0, 0.0  # bucket level at `last` (s); `free`: when the queue ahead clears
    for i, a in enumerate(arrival_s.tolist()):
        t = max(a, free) if queue else a
        tokens, last = min(burst, tokens + (t - last) * rate), t
        if tokens >= 1 - EPS:
            tokens -= 1
            out[i] = t
            free = t
            continue
        if not queue:
            continue  # shed
        at = t + (1 - tokens) / rate  # when the next token comes
        if at - a > limit:
            continue  # it would wait longer than max_wait_s: shed, and the bucket stays as it was
        tokens, last, free = 0.0, at, at
        out[i] = at
    return out
