"""Disaggregated prefill and decode (DistServe, Splitwise, vLLM's KV connectors): prefill instances
compute prompts, ship each request's KV cache over a link, and decode instances generate.

    engine:
      scheduler: chunked
      disaggregation:
        prefill_replicas: 1
        decode_replicas: 3
        prefill: {max_num_batched_tokens: 8192}        # engine knobs of that pool (optional)
        decode: {max_num_seqs: 256}
        link: infiniband                               # nvlink | infiniband | pcie | ethernet,
                                                       # or {bandwidth_gbps: 400, latency_us: 5}

A request's life, as vLLM's disaggregated serving runs it (the proxy sends it to a prefill
instance with max_tokens 1, then to a decode instance that pulls the prompt's KV):
1. a prefill replica (chosen by `engine.router` over the prefill pool) computes the prompt; the
   token it samples is not streamed;
2. its KV (prompt tokens x KV bytes per token) crosses the link: latency + bytes / bandwidth, the
   TP ranks' shards in parallel over min(prefill TP, decode TP) links; the prefill replica frees
   its blocks when the prefill ends (the transfer is not made to hold them);
3. a decode replica (`engine.router` over the decode pool, at the moment the KV arrives) admits it
   when it has blocks for the whole prompt (else it waits, first in line, like any admission),
   recomputes the last prompt token and samples the first output token, which the client sees:
   **TTFT includes the prefill, the transfer and that first decode step**, as in vLLM;
4. it decodes there; a preemption recomputes on the decode replica.

Each pool is the scenario's engine with its own knobs (TP, max_num_seqs, budget, scheduler, memory)
and optionally its own GPU (`prefill: {hardware: h200}`), with its own KV budget and cost model.
Not modelled: link contention between
concurrent transfers, layer-wise pipelining of the transfer with the prefill, prefix caching,
closed-loop users and speculative decoding together with disaggregation (refused).
"""
from __future__ import annotations

import heapq

import numpy as np

from sim.config.disaggregation import DisaggregationConfig
from sim.runtime.cluster import UserInbox
from sim.runtime.routers import Signals


class KVTransfers:
    """Requests whose prefill ended, on their way to the decode pool: each reaches a decode replica
    (chosen by the router when its KV arrives) after its transfer. Plays the closed loop's part
    for the decode replicas' inboxes (sim/runtime/cluster.UserInbox): next_time, done, finished."""

    def __init__(self, env, req, decode_schedulers: list, router, config: DisaggregationConfig,
                 kv_bytes_per_token: float, hardware, first_index: int):
        self.env, self.req, self.schedulers, self.router = env, req, decode_schedulers, router
        self.config, self.kv_bytes, self.hardware, self.first = config, kv_bytes_per_token, hardware, first_index
        self.inboxes = [UserInbox(self) for _ in decode_schedulers]
        self.signals = Signals(decode_schedulers)  # exact (stale signals are refused with pools)
        self.signals.bind(self.inboxes)
        router.attach(self.signals)
        self.prefilled_at = np.full(len(req), np.nan)   # when each prefill ended (s)
        self.transfer_s = np.full(len(req), np.nan)     # how long its KV took to arrive (s)
        self.prefill_replica = np.full(len(req), -1, dtype=np.int64)
        self.bytes = 0.0
        self._due: list[tuple[float, int]] = []
        self._delivered = 0

    @property
    def done(self) -> bool:
        return self._delivered == len(self.req)

    def next_time(self) -> float:
        return self._due[0][0] if self._due else np.inf

    def finished(self, rids) -> None:
        pass  # open loop: nobody waits for a request to finish

    def send(self, rid: int, now: float, prefill_replica: int) -> None:
        """`rid`'s prefill ended now on `prefill_replica`: ship its prompt's KV."""
        tokens = int(self.req.prompt[rid])
        seconds = float(self.config.transfer_s(tokens, self.kv_bytes, self.hardware))
        self.prefilled_at[rid], self.transfer_s[rid] = now, seconds
        self.prefill_replica[rid] = prefill_replica
        self.bytes += tokens * self.kv_bytes
        heapq.heappush(self._due, (now + seconds, rid))
        self.env.timeout(seconds).callbacks.append(self._arrive)

    def _arrive(self, _event) -> None:
        t, rid = heapq.heappop(self._due)
        self._delivered += 1
        target = self.router.choose(rid, self.signals.loads())
        self.req.replica[rid] = self.first + target
        self.inboxes[target].deliver(rid, t)


def pool_utilization(steps, duration: float, prefill_replicas: int, decode_replicas: int) -> dict:
    """Busy share of each pool's replica-time (an iteration running)."""
    busy = steps.groupby(steps["replica"] >= prefill_replicas)["duration_s"].sum()
    share = lambda decode, n: float(busy.get(decode, 0.0)) / (duration * n) if duration > 0 else 0.0  # noqa: E731
    return {"prefill": share(False, prefill_replicas), "decode": share(True, decode_replicas)}
