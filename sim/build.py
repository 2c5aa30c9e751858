"""The one place that turns a Scenario (plain data, sim/config/) into running parts: each replica's
scheduler over its KV manager, the cost model that prices its iterations, and the wiring of
replicas behind routers or into disaggregated pools.

    cost = cost_model(scenario)                         # the plug-ins the scenario names, built once
    check_servable(workload, scenario.engine, blocks)   # a request that could never run: refused
    scheduler = build_scheduler(engine, requests, blocks, workload, rng)

Features are chosen here, once, and handed in as objects: a prefix-caching KV manager, a
speculative pool, a sliding-window KV manager, a disaggregated prefill replica's handoff. The
simulator (sim/simulate.py) and the real engine (calibrate/engine.py) both set replicas up through
these functions, so the two share admission and memory semantics by construction.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from sim.config.errors import ScenarioError
from sim.cost import registry as cost
from sim.cost.eager import EagerCost, capture_limit, graph_limited, launch_floor_s
from sim.cost.expert_parallel import ExpertParallelCost
from sim.cost.pipeline import PipelineCost, hop_link
from sim.cost.registry import check_kv_cache_dtype, parse_cost_model
from sim.cost.speculative import SpeculativeCost
from sim.features import registry as features
from sim.features.contract import Wiring
from sim.kv.cache import PagedKVCache, StateKVCache, WindowedKVCache
from sim.kv.prefix_cache import PrefixKVCache, request_chains
from sim.presets import models
from sim.presets.memory import kv_bytes_per_token_per_rank
from sim.runtime.routers import Router, Signals, make_router
from sim.scenario import EngineConfig, Scenario
from sim.schedulers import SCHEDULERS, Scheduler
from sim.schedulers.decode_pool import WindowedDecodePool
from sim.schedulers.queues import make_queue
from sim.schedulers.speculative import SpeculativePool
from sim.schedulers.window import SlidingWindow
from sim.workload.request import RequestTable
from sim.workload.sessions import Sessions

if TYPE_CHECKING:
    from sim.presets.models import KVLayout
    from sim.runtime.autoscaler import Autoscaler
    from sim.runtime.cluster import ClosedLoopRouter, Gate
    from sim.runtime.disaggregation import KVTransfers
    from sim.workload.generators import Workload


def cost_model(scenario: Scenario):
    """A fresh cost model for one simulation (no file is read: the spec was resolved); with
    speculative decoding, the target's plus the draft's (sim/cost/speculative.py); with pipeline
    parallelism, its busiest stage's through the pipeline (sim/cost/pipeline.py)."""
    e = scenario.engine
    tp = e.tensor_parallel_size
    target = scenario.cost_model.build(scenario.stage_model, scenario.hardware, tp, e.kv_cache_dtype,
                                       e.data_parallel_size)
    floor = launch_floor_s(scenario.stage_model, tp)
    if e.enforce_eager:  # no CUDA graphs: no iteration shorter than the host's launches (sim/cost/eager.py)
        target = EagerCost(target, floor)
    else:  # an iteration too large for a CUDA graph: the same floor (where it can bind)
        query = 1 + (e.speculative.num_speculative_tokens if e.speculative is not None else 0)
        limit = capture_limit(e.max_cudagraph_capture_size, e.max_num_seqs, e.max_num_batched_tokens, query,
                              scenario.hardware.name)
        target = graph_limited(target, floor, limit)
    if e.data_parallel_size > 1:  # DP attention in front of one expert-parallel group: its all-to-all
        return ExpertParallelCost(target, scenario.model, scenario.hardware, tp, e.data_parallel_size,
                                  e.all2all_backend)
    target = features.wrap_cost(scenario, target)  # what the features add to an iteration (LoRA's adapters)
    if e.pipeline_parallel_size > 1:
        bandwidth, latency = hop_link(scenario.hardware, e.gpus_per_replica)
        m = scenario.model
        return PipelineCost(target, e.pipeline_parallel_size, e.max_num_batched_tokens,
                            m.hidden_size * m.dtype_bytes / bandwidth, latency)
    spec = scenario.engine.speculative
    if spec is None:
        return target
    draft = None
    if spec.draft_model is not None:  # the draft's own cost: measured where shipped, else roofline
        m = models.MODEL_PRESETS[spec.draft_model]
        drafted = cost.default_cost_model(m, scenario.hardware, tp)
        if drafted.overheads is not None:  # the draft runs inside the target's iteration: its kernel
            drafted = dataclasses.replace(drafted, options={**drafted.options, "overheads": None})  # time only
        draft = drafted.build(m, scenario.hardware, tp)
    return SpeculativeCost(target, spec, draft, scenario.model.num_layers)


def kv_cache_for(e: EngineConfig, num_blocks: int, num_requests: int, layout: KVLayout | None = None):
    """One replica's KV cache without prefix caching: the scheduler's kind, windowed for a
    sliding-window model's layer groups (`layout`, from its MemoryBudget) where it is paged."""
    cls = SCHEDULERS[e.scheduler]
    if layout is not None and layout.sliding_groups and cls.kv_cache is PagedKVCache:
        return WindowedKVCache(num_blocks, e.block_size, layout, e.max_num_batched_tokens)
    if layout is not None and layout.state_groups and cls.kv_cache is PagedKVCache:
        return StateKVCache(num_blocks, e.block_size, layout)
    return cls.kv_cache.for_replica(num_blocks, e.block_size, num_requests)


def build_scheduler(e: EngineConfig, requests: RequestTable, num_blocks: int,
                    workload: Workload, rng: np.random.Generator | None = None,
                    layout: KVLayout | None = None,
                    handoff: Callable[[int, float], None] | None = None,
                    parts: Callable[[object], dict] | None = None) -> Scheduler:
    """One replica's scheduler with its own KV cache of `num_blocks` blocks and waiting queue.
    `rng`: the run's seeded generator (speculative decoding draws its acceptances from it);
    `layout`: a sliding-window model's KV-cache groups (sim/scenario.py turned prefix caching,
    speculative decoding and disaggregation off or away for it); `handoff(rid, now)`: where a
    disaggregated prefill replica sends each computed prompt (sim/runtime/disaggregation.py);
    `parts(kv)`: the features' collaborators over this replica's KV cache, by the scheduler's
    keyword (sim/features/registry.scheduler_parts: e.g. a CPU tier, "connector")."""
    cls = SCHEDULERS[e.scheduler]
    caching = prefix_caching(e, workload)
    if caching and e.speculative is not None:
        raise ScenarioError("engine.speculative: speculative decoding together with prefix caching over "
                            "the workload's shared prefixes is not modelled; set "
                            "engine.enable_prefix_caching: false")
    if caching:
        prompt = requests.prompt.tolist()
        # (multi-turn sessions: their chains are given as they arrive, sim/workload/sessions.py)
        shared = workload.prefix if workload.prefix is not None else [None] * len(prompt)
        hashes = request_chains(shared, prompt, e.block_size)
        kv = PrefixKVCache(num_blocks, e.block_size, hashes, prompt)
    elif caching_on(e) and e.speculative is None:
        # Nothing shared, but vLLM still caches every request's own full blocks: a preempted
        # request's resumption hits what is left of them (found against real vLLM,
        # docs/validation.md). Own blocks only: no lookups before a preemption, no hit-rate columns.
        # (the prompt column itself, not a list: read only for a request freed without its
        # computed tokens, and a million-request run would hold 36 MB of ints for it)
        kv = PrefixKVCache(num_blocks, e.block_size, [[]] * len(requests), requests.prompt, reports=False)
    else:
        kv = kv_cache_for(e, num_blocks, len(requests), layout)
    pool = None
    if e.speculative is not None:
        pool = SpeculativePool(requests, kv, e.speculative, rng if rng is not None else np.random.default_rng(0))
    make: Callable[..., Scheduler] = cls  # (each scheduler's __init__ takes what it needs of these)
    extra: dict = {} if handoff is None else {"handoff": handoff}  # (a disaggregated prefill replica's)
    if isinstance(kv, WindowedKVCache):  # what a sliding window changes in a step, and its decode pool
        extra["window"] = SlidingWindow(kv, WindowedDecodePool(requests, kv))
    if parts is not None:  # what the features hand this replica's scheduler (sim/features/)
        extra.update(parts(kv))
    # pipeline parallelism: an iteration is S of vLLM's batches in flight, each with its own budget
    # (sim/cost/pipeline.py)
    return make(requests=requests, kv=kv, pool=pool, queue=make_queue(e.policy, requests), **extra,
               max_num_seqs=e.max_num_seqs,
               max_num_batched_tokens=e.max_num_batched_tokens * e.pipeline_parallel_size,
               reserve_full_isl=e.scheduler_reserve_full_isl, batch_timeout_s=e.batch_timeout_s,
               max_output_tokens=int(workload.output_tokens.max(initial=1)))


def caching_on(e: EngineConfig) -> bool:
    """Prefix caching on (or left at vLLM's default, on) for a scheduler that has it."""
    return SCHEDULERS[e.scheduler].prefix_caching and e.enable_prefix_caching is not False


def prefix_caching(e: EngineConfig, workload: Workload) -> bool:
    """Is prefix caching across requests simulated: on, and the workload says what its prompts
    share (a trace's hash_ids, workload.prefix)?"""
    if workload.users is not None and workload.users.turns is not None:
        return caching_on(e)  # multi-turn sessions: each turn's prompt starts with the last's tokens
    return caching_on(e) and workload.prefix is not None and len(workload.prefix) == len(workload)


def servable(e: EngineConfig, num_blocks: int, max_output: int, layout: KVLayout | None = None):
    """`fits(prompt, output)`: would one more request of these lengths pass check_servable below
    (a conversation's growing prompt is checked as it grows: sim/workload/sessions.py)?"""
    cls = SCHEDULERS[e.scheduler]
    capacity = num_blocks * e.block_size
    whole_prompts = cls.token_budget and not cls.chunks_prompts
    kv = kv_cache_for(e, num_blocks, 0, layout)

    def fits(prompt: int, output: int) -> bool:
        # the workload's longest output beside it: static batching reserves that much for everyone
        need, _ = kv.slots_needed(np.array([prompt, prompt]), np.array([output, max_output]),
                                            e.block_size)
        if need[0] > capacity:
            return False
        return not whole_prompts or prompt + output - 1 <= e.max_num_batched_tokens
    return fits


def check_servable(w: Workload, e: EngineConfig, num_blocks: int, where: str = "",
                   layout: KVLayout | None = None) -> None:
    """A request that could never be scheduled would hang the replica: refuse it up front."""
    if len(w) == 0:
        raise ScenarioError(f"{where}workload: no requests to simulate")
    cls = SCHEDULERS[e.scheduler]
    capacity = num_blocks * e.block_size  # KV token slots per replica
    need, what = kv_cache_for(e, num_blocks, 0, layout).slots_needed(w.prompt_tokens, w.output_tokens, e.block_size)
    worst = int(np.argmax(need))
    if need[worst] > capacity:
        raise ScenarioError(
            f"{where}workload: request {worst} needs {int(need[worst])} KV token slots "
            f"({what}) but the cache holds {capacity} ({num_blocks} blocks x {e.block_size}); "
            f"raise engine.num_gpu_blocks / gpu_memory_utilization or shorten the request"
            + ("; engine.lora's adapter slots hold GPU memory beside the weights: fewer max_loras or a lower "
               "max_lora_rank leave more for the cache" if e.lora is not None else ""))
    if cls.token_budget and not cls.chunks_prompts:
        longest = w.prompt_tokens + w.output_tokens - 1
        worst = int(np.argmax(longest))
        if longest[worst] > e.max_num_batched_tokens:
            raise ScenarioError(
                f"{where}engine.max_num_batched_tokens: {e.max_num_batched_tokens} is below request "
                f"{worst}'s {int(longest[worst])} tokens (prompt + output - 1, what a recompute "
                f"prefills); the {e.scheduler} scheduler prefills whole prompts, so raise it to at "
                f"least {int(longest[worst])} or use a scheduler that chunks prompts "
                f"({', '.join(n for n, c in SCHEDULERS.items() if c.chunks_prompts)})")


def pool_scenarios(scenario):
    """(prefill, decode): the scenario with each pool's engine (its own budget and cost model)."""
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


def start_pools(env, scenario, req, workload, recorder, rng, on_iteration, fast_forward: bool = True):
    """Build both pools' replicas (SimPy processes) on `env`: prefill replicas 0..P-1 read the
    arrivals, decode replicas P..P+D-1 read the transfers. Returns (schedulers, KVTransfers)."""
    from sim.runtime.cluster import make_inboxes  # (simpy: see build_replicas)
    from sim.runtime.disaggregation import KVTransfers
    from sim.runtime.engine import Replica

    d = scenario.engine.disaggregation
    routing = scenario.engine.routing
    if workload.users is not None:
        raise ScenarioError("engine.disaggregation: closed-loop users with disaggregated pools are not modelled")
    prefill_sc, decode_sc = pool_scenarios(scenario)
    for sc in (prefill_sc, decode_sc):
        if prefix_caching(sc.engine, workload):
            raise ScenarioError("engine.disaggregation: prefix caching over the workload's shared prefixes with "
                                "disaggregated pools is not modelled; set engine.enable_prefix_caching: false")
        check_servable(workload, sc.engine, sc.budget.num_gpu_blocks, f"{scenario.source or 'scenario'}: ")

    def shipper(i: int) -> Callable[[int, float], None]:
        """Prefill replica i's handoff: its requests' KV onto the link (transfers: made below,
        before anything runs)."""
        return lambda rid, now: transfers.send(rid, now, i)

    blocks = prefill_sc.budget.num_gpu_blocks
    prefill = [build_scheduler(prefill_sc.engine, req, blocks, workload, rng, handoff=shipper(i))
               for i in range(d.prefill_replicas)]
    # a decode replica is a plain scheduler: an arrival's computed tokens (prompt - 1) came with
    # their KV, and a waiting request holds no blocks here (sim/schedulers/iteration_level._admit)
    decode = [build_scheduler(decode_sc.engine, req, decode_sc.budget.num_gpu_blocks, workload, rng)
              for _ in range(d.decode_replicas)]
    tp = d.decode.tensor_parallel_size
    kv_bytes = kv_bytes_per_token_per_rank(scenario.model, tp, scenario.engine.kv_cache_dtype) * tp
    # nvlink: the slower pool's interconnect
    link_hw = min(prefill_sc.hardware, decode_sc.hardware, key=lambda h: h.interconnect_bandwidth)
    router = scenario.engine.router
    transfers = KVTransfers(env, req, decode, make_router(router, d.decode_replicas, routing), d, kv_bytes,
                            link_hw, d.prefill_replicas)
    inboxes = make_inboxes(make_router(router, d.prefill_replicas, routing), env, req.arrival, prefill,
                           req.replica)
    prefill_cost, decode_cost = cost_model(prefill_sc), cost_model(decode_sc)
    for i, (s, box) in enumerate(zip(prefill, inboxes)):
        Replica(env, i, s, prefill_cost, recorder, box, fast_forward=fast_forward, on_iteration=on_iteration)
    for j, (s, box) in enumerate(zip(decode, transfers.inboxes)):
        Replica(env, d.prefill_replicas + j, s, decode_cost, recorder, box, fast_forward=fast_forward,
                on_iteration=on_iteration)
    return prefill + decode, transfers


def _restart(scheduler) -> None:
    """An autoscaled replica started again is a new pod: its caches, GPU and CPU, start empty."""
    scheduler.kv.restart()
    for feature in ("connector", "lora"):
        if getattr(scheduler, feature, None) is not None:
            getattr(scheduler, feature).restart()


@dataclass(frozen=True)
class Replicas:
    """What build_replicas started on the SimPy environment."""
    schedulers: list                     # one per replica (a disaggregated run: prefill pool first)
    transfers: KVTransfers | None        # disaggregated pools: the KV on its way between them
    loop: ClosedLoopRouter | None        # closed-loop users: who sent what, their sessions
    autoscaler: Autoscaler | None = None  # engine.autoscaling: the fleet's changes, its GPU-hours
    gate: Gate | None = None              # engine.admission.max_in_flight: who passed the gateway, when
    features: dict = dataclasses.field(default_factory=dict)  # each active feature's run state (sim/features/)


def build_replicas(env, scenario: Scenario, req: RequestTable, workload: Workload, cost, recorder,
                   rng: np.random.Generator, on_iteration, fast_forward: bool = True) -> Replicas:
    """Every replica of `scenario` as a SimPy process on `env`, fed by its router (open loop),
    by the users (closed loop) or by the KV transfers (a disaggregated decode pool)."""
    # imported here, not above: they need simpy, and the real engine (calibrate/engine.py) builds
    # its scheduler through this module where simpy may not be installed
    from sim.runtime.autoscaler import Autoscaler
    from sim.runtime.cluster import ClosedLoopRouter, Gate, Scraper, make_inboxes
    from sim.runtime.engine import Replica

    e = scenario.engine
    if e.disaggregation is not None:  # prefill and decode pools, KV shipped between them
        schedulers, transfers = start_pools(env, scenario, req, workload, recorder, rng, on_iteration,
                                            fast_forward)
        return Replicas(schedulers, transfers, None)
    blocks, layout = scenario.budget.num_gpu_blocks, scenario.budget.layout
    a = e.autoscaling
    # an autoscaled fleet: every replica it may hold is built (idle until started); data-parallel
    # ranks are engines of their own, each behind the router like a replica (vLLM's DP front end
    # balances requests over them)
    built = (e.replicas if a is None else a.max_replicas) * e.data_parallel_size
    parts = features.scheduler_parts(scenario, workload)
    schedulers = [build_scheduler(e, req, blocks, workload, rng, layout, parts=parts) for _ in range(built)]
    fleet = None
    router: Router
    routing = e.routing
    if a is None:
        router = make_router(e.router, built, routing)
    else:
        from sim.runtime.autoscaler import Fleet, FleetRouter

        fleet = Fleet(built, e.replicas)
        router = FleetRouter(lambda n: make_router(e.router, n, routing), fleet)
    staleness = 0.0 if routing is None else routing.staleness_s
    signals = Signals(schedulers, stale=staleness > 0)
    loop = None
    inboxes: list
    gate = None
    adm = e.admission
    wiring = Wiring(env, scenario, req, workload, schedulers, rng, fleet=fleet)
    states = {key: f.wire(scenario.features[key], wiring) for key, f in features.active(scenario)}
    if wiring.inboxes is not None:  # a feature routes the arrivals (sim/features/faults)
        inboxes = wiring.inboxes()
    elif workload.users is None and adm is not None and adm.max_in_flight is not None:  # a concurrency limit: live
        gate = Gate(env, router, req.arrival, schedulers, req.replica, signals, adm.max_in_flight,
                    adm.max_queue_wait_s, req.priority if adm.queue_order == "priority" else None)
        inboxes = gate.inboxes
        if staleness > 0:
            Scraper(env, signals, staleness, gate, always_known=False)
    elif workload.users is None:
        inboxes = make_inboxes(router, env, req.arrival, schedulers, req.replica, signals, staleness)
    else:  # closed loop: arrivals are filled in as users' requests finish
        sessions = None
        if workload.users.turns is not None:  # multi-turn: prompts grow turn by turn
            shared = [s.kv for s in schedulers if isinstance(s.kv, PrefixKVCache) and s.kv.reports]
            sessions = Sessions(req, workload.users, workload.prefix, shared, e.block_size,
                                servable(e, blocks, int(workload.output_tokens.max()), layout))
        loop = ClosedLoopRouter(env, req, workload.users, schedulers, router, signals, sessions)
        inboxes = loop.inboxes
        if staleness > 0:
            Scraper(env, signals, staleness, loop, always_known=False)
    alone = len(schedulers) == 1 and workload.users is None  # (an open loop's inbox: planned)
    make = wiring.replica_class or Replica
    replicas = [make(env, i, sched, cost, recorder, inbox, fast_forward=fast_forward, on_iteration=on_iteration,
                     alone=alone) for i, (sched, inbox) in enumerate(zip(schedulers, inboxes))]
    for started in wiring.started:
        started(replicas)
    scaler = None
    if a is not None and fleet is not None:
        from sim.runtime.autoscaler import Autoscaler

        def done() -> bool:  # nothing more will arrive: every user done, or no arrival due anywhere
            if wiring.done is not None:  # (faults: a request lost and waiting for a replica is still to come)
                return wiring.done()
            return loop.done if loop is not None else all(box.next_arrival() == np.inf for box in inboxes)

        loads = wiring.loads if wiring.loads is not None else signals.exact_loads  # (bound to the inboxes)
        scaler = Autoscaler(env, a, fleet, loads, done, req,
                            on_start=lambda i: _restart(schedulers[i]), up=wiring.replica_up)
    return Replicas(schedulers, None, loop, scaler, gate, states)
