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

import functools
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .checks import MAX_REPLICAS, _int, _num, _section

# name -> (bytes/s per GPU, latency s). Nominal link rates, one direction:
LINKS = {
    "nvlink": (None, 2e-6),        # the hardware preset's interconnect_bandwidth (H100: 450 GB/s)
    "infiniband": (50e9, 5e-6),    # NDR 400 Gb/s per GPU
    "pcie": (32e9, 10e-6),         # PCIe Gen4 x16 (L40S has no NVLink)
    "ethernet": (12.5e9, 20e-6),   # 100 GbE
}
POOL_KNOBS = ("scheduler", "max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size",
              "gpu_memory_utilization", "num_gpu_blocks", "policy")


@dataclass(frozen=True)
class DisaggregationConfig:
    prefill_replicas: int
    decode_replicas: int
    prefill: Any              # EngineConfig of the prefill pool
    decode: Any               # EngineConfig of the decode pool
    link: str                 # a LINKS name, or "custom"
    link_bandwidth: float | None  # bytes/s per GPU link; None: the hardware's interconnect
    link_latency_s: float
    raw: dict                 # as written (resolved scenarios write it back)
    prefill_hardware: Any = None  # HardwareSpec of that pool; None: the scenario's
    decode_hardware: Any = None

    def as_yaml(self) -> dict:
        return self.raw

    def bandwidth(self, hardware) -> float:
        return self.link_bandwidth or hardware.interconnect_bandwidth

    def transfer_s(self, tokens, kv_bytes_per_token: float, hardware):
        """Seconds to ship `tokens` tokens of KV (works on arrays)."""
        links = min(self.prefill.tensor_parallel_size, self.decode.tensor_parallel_size)
        return self.link_latency_s + tokens * kv_bytes_per_token / (self.bandwidth(hardware) * links)


def parse_disaggregation(v: Any, where, engine_raw: dict, parse_engine) -> DisaggregationConfig | None:
    """engine.disaggregation as written; `parse_engine(mapping, where)` validates each pool's engine
    (the scenario's engine keys with the pool's knobs over them)."""
    if v is None:
        return None
    at = lambda k: where(f"engine.disaggregation.{k}")  # noqa: E731
    m = _section(v, "disaggregation", lambda k: where(f"engine.{k}"),
                 ("prefill_replicas", "decode_replicas", "prefill", "decode", "link"))
    pools = {}
    hardware = {}
    for pool in ("prefill", "decode"):
        knobs = dict(_section(m.get(pool) or {}, pool, lambda k: at(k), (*POOL_KNOBS, "hardware")))
        gpu = knobs.pop("hardware", None)
        if gpu is not None:
            from .hardware import HARDWARE_PRESETS
            if gpu not in HARDWARE_PRESETS:
                from .errors import ScenarioError
                raise ScenarioError(f"{at(pool + '.hardware')}: unknown GPU {gpu!r}; allowed: "
                                    f"{', '.join(HARDWARE_PRESETS)}")
            hardware[pool] = HARDWARE_PRESETS[gpu]
        base = {k: x for k, x in engine_raw.items() if k not in ("disaggregation", "replicas")}
        pool_where = lambda k, pool=pool: where(k.replace("engine.", f"engine.disaggregation.{pool}.", 1)  # noqa: E731
                                                if k.split(".")[-1] in knobs else k)
        pools[pool] = parse_engine({**base, **knobs}, pool_where)
    link = m.get("link", "nvlink")
    if isinstance(link, dict):
        _section(link, "link", lambda k: at(f"link.{k}"), ("bandwidth_gbps", "latency_us"))
        # at least 1 Mbit/s and at most 1,000 s of latency: a transfer must end within the clock's
        # bound (1e-300 Gbit/s made every late request's latencies 0)
        bandwidth = _num(link.get("bandwidth_gbps"), at("link.bandwidth_gbps"), 1e-3, cap=1e6) * 1e9 / 8
        latency = _num(link.get("latency_us", 0.0), at("link.latency_us"), 0, cap=1e9) * 1e-6
        name = "custom"
    elif link in LINKS:
        (bandwidth, latency), name = LINKS[link], link
    else:
        from .errors import ScenarioError
        raise ScenarioError(f"{at('link')}: {link!r} is not one of {', '.join(LINKS)} or "
                            "{bandwidth_gbps: G, latency_us: U}")
    return DisaggregationConfig(
        _int(m.get("prefill_replicas"), at("prefill_replicas"), lo=1, hi=MAX_REPLICAS),
        _int(m.get("decode_replicas"), at("decode_replicas"), lo=1, hi=MAX_REPLICAS),
        pools["prefill"], pools["decode"], name, bandwidth, latency, dict(m),
        hardware.get("prefill"), hardware.get("decode"))


def pool_scenarios(scenario):
    """(prefill, decode): the scenario with each pool's engine (its own budget and cost model)."""
    from .cost import check_kv_cache_dtype, parse_cost_model

    d = scenario.engine.disaggregation
    out = []
    for e, hw in ((d.prefill, d.prefill_hardware), (d.decode, d.decode_hardware)):
        hw = hw or scenario.hardware
        spec = scenario.cost_model
        if e.tensor_parallel_size != scenario.engine.tensor_parallel_size or hw is not scenario.hardware:
            where = (f"{scenario.source or 'scenario'}: cost_model (the pool on {hw.name} "
                     f"at tensor_parallel_size {e.tensor_parallel_size})")
            spec = check_kv_cache_dtype(parse_cost_model(spec.as_yaml(), scenario.model, hw,
                                                         e.tensor_parallel_size, where), e.kv_cache_dtype, where)
        out.append(replace(scenario, hardware=hw, engine=replace(e, disaggregation=None), cost_model=spec))
    return out


class KVTransfers:
    """Requests whose prefill ended, on their way to the decode pool: each reaches a decode replica
    (chosen by the router when its KV arrives) after its transfer. Plays the closed loop's part
    for the decode replicas' inboxes (sim/cluster.UserInbox): next_time, done, finished."""

    def __init__(self, env, req, decode_schedulers: list, router, config: DisaggregationConfig,
                 kv_bytes_per_token: float, hardware, first_index: int):
        from .cluster import UserInbox

        self.env, self.req, self.schedulers, self.router = env, req, decode_schedulers, router
        self.config, self.kv_bytes, self.hardware, self.first = config, kv_bytes_per_token, hardware, first_index
        self.inboxes = [UserInbox(self) for _ in decode_schedulers]
        self.prefilled_at = np.full(len(req), np.nan)   # when each prefill ended (s)
        self.transfer_s = np.full(len(req), np.nan)     # how long its KV took to arrive (s)
        self.prefill_replica = np.full(len(req), -1, dtype=np.int64)
        self.bytes = 0.0
        self._due: list[tuple[float, int]] = []
        self._sent = self._delivered = 0

    @property
    def done(self) -> bool:
        return self._delivered == len(self.req)

    def next_time(self) -> float:
        return self._due[0][0] if self._due else np.inf

    def finished(self, rids) -> None:
        pass  # open loop: nobody waits for a request to finish

    def send(self, rid: int, now: float, prefill_replica: int) -> None:
        """`rid`'s prefill ended now on `prefill_replica`: ship its prompt's KV."""
        import heapq

        tokens = int(self.req.prompt[rid])
        seconds = float(self.config.transfer_s(tokens, self.kv_bytes, self.hardware))
        self.prefilled_at[rid], self.transfer_s[rid] = now, seconds
        self.prefill_replica[rid] = prefill_replica
        self.bytes += tokens * self.kv_bytes
        heapq.heappush(self._due, (now + seconds, rid))
        self.env.timeout(seconds).callbacks.append(self._arrive)

    def _arrive(self, _event) -> None:
        import heapq

        from .cluster import _loads

        t, rid = heapq.heappop(self._due)
        self._delivered += 1
        target = self.router.choose(rid, _loads(self.schedulers, self.inboxes))
        self.req.replica[rid] = self.first + target
        self.inboxes[target].deliver(rid, t)


@functools.cache
def prefill_only(cls):
    """The prefill pool's scheduler: `cls` whose requests leave when their prompt is computed."""

    class PrefillScheduler(cls):
        index = 0             # this replica's index (set by the builder)
        transfers: KVTransfers

        def _prompt_done(self, rid: int, now: float) -> bool:
            req, kv = self.req, self.kv
            kv.free_request(rid, kv.blocks_for(int(req.computed[rid])))
            del self.order[rid]
            # the decode replica recomputes the last prompt token to sample the first output token
            req.computed[rid] = int(req.prompt[rid]) - 1
            self.transfers.send(rid, now, self.index)
            return False

    PrefillScheduler.__name__ = f"Prefill{cls.__name__}"
    return PrefillScheduler


@functools.cache
def decode_side(cls):
    """The decode pool's scheduler: `cls` whose arriving requests bring their prompt's KV, so
    admission allocates blocks for all of it."""

    class DecodeScheduler(cls):
        incoming: set[int]  # arrived with their KV, not yet admitted (start_pools sets it)

        def add(self, rid: int) -> None:
            self.incoming.add(rid)
            super().add(rid)

        def _held_blocks(self, rid: int, computed: int) -> int:
            if rid in self.incoming:  # the KV arrives with it: none of it is in this cache yet
                return 0
            return super()._held_blocks(rid, computed)

        def _prompt_done(self, rid: int, now: float) -> bool:
            self.incoming.discard(rid)  # its KV is now this replica's like any other
            return super()._prompt_done(rid, now)

    DecodeScheduler.__name__ = f"Decode{cls.__name__}"
    return DecodeScheduler


def pool_utilization(steps, duration: float, prefill_replicas: int, decode_replicas: int) -> dict:
    """Busy share of each pool's replica-time (an iteration running)."""
    busy = steps.groupby(steps["replica"] >= prefill_replicas)["duration_s"].sum()
    share = lambda decode, n: float(busy.get(decode, 0.0)) / (duration * n) if duration > 0 else 0.0  # noqa: E731
    return {"prefill": share(False, prefill_replicas), "decode": share(True, decode_replicas)}


def start_pools(env, scenario, req, workload, recorder, rng, on_iteration, fast_forward: bool = True):
    """Build both pools' replicas (SimPy processes) on `env`: prefill replicas 0..P-1 read the
    arrivals, decode replicas P..P+D-1 read the transfers. Returns (schedulers, KVTransfers)."""
    from .cluster import make_inboxes
    from .engine import Replica
    from .errors import ScenarioError
    from .memory import kv_bytes_per_token_per_rank
    from .routers import make_router
    from .schedulers import build_scheduler, check_servable, prefix_caching

    d = scenario.engine.disaggregation
    if workload.users is not None:
        raise ScenarioError("engine.disaggregation: closed-loop users with disaggregated pools are not modelled")
    prefill_sc, decode_sc = pool_scenarios(scenario)
    for sc in (prefill_sc, decode_sc):
        if prefix_caching(sc.engine, workload):
            raise ScenarioError("engine.disaggregation: prefix caching over the workload's shared prefixes with "
                                "disaggregated pools is not modelled; set engine.enable_prefix_caching: false")
        check_servable(workload, sc.engine, sc.budget.num_gpu_blocks, f"{scenario.source or 'scenario'}: ")

    def pool(sc, n, wrap):
        out = []
        for i in range(n):
            # the pool's behaviour: the scheduler's class with two hooks (sim/schedulers/iteration_level.py)
            out.append(build_scheduler(sc.engine, req, sc.budget.num_gpu_blocks, workload, rng, wrap=wrap))
        return out

    prefill = pool(prefill_sc, d.prefill_replicas, prefill_only)
    decode = pool(decode_sc, d.decode_replicas, decode_side)
    for s in decode:
        s.incoming = set()
    tp = d.decode.tensor_parallel_size
    kv_bytes = kv_bytes_per_token_per_rank(scenario.model, tp, scenario.engine.kv_cache_dtype) * tp
    # nvlink: the slower pool's interconnect
    link_hw = min(prefill_sc.hardware, decode_sc.hardware, key=lambda h: h.interconnect_bandwidth)
    transfers = KVTransfers(env, req, decode, make_router(scenario.engine.router, d.decode_replicas), d, kv_bytes,
                            link_hw, d.prefill_replicas)
    for i, s in enumerate(prefill):
        s.index, s.transfers = i, transfers
    inboxes = make_inboxes(make_router(scenario.engine.router, d.prefill_replicas), env, req.arrival, prefill,
                           req.replica)
    prefill_cost, decode_cost = prefill_sc.cost(), decode_sc.cost()
    for i, (s, box) in enumerate(zip(prefill, inboxes)):
        Replica(env, i, s, prefill_cost, recorder, box, fast_forward=fast_forward, on_iteration=on_iteration)
    for j, (s, box) in enumerate(zip(decode, transfers.inboxes)):
        Replica(env, d.prefill_replicas + j, s, decode_cost, recorder, box, fast_forward=fast_forward,
                on_iteration=on_iteration)
    return prefill + decode, transfers
