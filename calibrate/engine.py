"""A real continuous-batching engine: the simulator's own scheduler objects driven in real time
over a real model step.

    schedule = scheduler.schedule(now)        # sim/schedulers: the very same objects as `servesim run`
    chunks = what each request computes       # Schedule -> SeqChunk (token ids, context, block table)
    tokens = step.run(chunks)                 # the model (calibrate/model.py), or a stand-in
    outcome = scheduler.update(schedule, 1, clock())  # one iteration at a time: no fast-forward

"Same semantics" holds by construction: admission, token budget, preemption by recompute and the
request/metrics bookkeeping are the simulator's code; only the iteration's duration is measured
instead of predicted. The engine reads only the `Schedule` and `StepOutcome` (sim/schedulers/step.py), never
the scheduler's internals: like vLLM's model runner it keeps its own per-request state (tokens
computed so far, dropped on preemption or finish). The scheduler's KV manager counts blocks;
`BlockTables` keeps the physical block ids the model needs on top of it, and every iteration checks
that the two agree.

Token ids: prompts are random ids drawn from the caller's rng; outputs are the model's greedy
samples, fed back as the next decode's input. A recompute prefills prompt + outputs so far.

Clock: time 0 is the engine's start and requests arrive at their workload times (a generator's first
request arrives at 0). Arrivals are admitted at iteration boundaries; an idle engine sleeps until the
next one. `clock`/`sleep` are wall time by default; calibrate/validate.py can pass a CPU-time clock
and tests a virtual one. This module must not import simpy (the GPU box has none): it reads only the pure-Python
parts of sim/.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pandas as pd

from sim.build import build_scheduler, check_servable
from sim.config.errors import ScenarioError
from sim.runtime.metrics import inter_token_latencies, requests_frame, steps_frame, summarize
from sim.runtime.recorder import Recorder
from sim.scenario import Scenario
from sim.schedulers import SCHEDULERS
from sim.schedulers.step import Schedule
from sim.workload.generators import Workload
from sim.workload.request import RequestTable

from .model import SeqChunk


class Step(Protocol):
    def run(self, chunks: list[SeqChunk]) -> list[int | None]:
        """One forward pass; the next token of every chunk with sample=True (else None). Returns
        once the device has finished."""


@dataclass
class EngineResult:
    requests: pd.DataFrame   # requests.csv schema (sim.runtime.metrics.requests_frame)
    steps: pd.DataFrame      # steps.csv schema, one row per iteration (count is always 1)
    step_s: np.ndarray       # per iteration: seconds inside step.run (the rest is engine overhead)
    stats: list              # per iteration: the BatchStats the simulator's cost model would price
    tokens: list[list[int]]  # per request: prompt ids followed by the generated ids
    duration_s: float        # engine start to the end, on the engine's clock
    summary: dict | None = None  # summary.json, computed by sim.runtime.metrics as `servesim run` does
    schedules: list | None = None  # per iteration: the Schedule it ran (None: read from a log)


class BlockTables:
    """Physical KV block ids per running request, on top of the count-only PagedKVCache."""

    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.free = list(range(num_blocks - 1, -1, -1))  # pop() hands out low ids first
        self.tables: dict[int, list[int]] = {}

    @property
    def used(self) -> int:
        return sum(len(t) for t in self.tables.values())

    def grow(self, rid: int, num_tokens: int) -> list[int]:
        """Make request `rid`'s table cover `num_tokens` tokens (it never shrinks while live)."""
        table = self.tables.setdefault(rid, [])
        need = -(-num_tokens // self.block_size)
        while len(table) < need:
            table.append(self.free.pop())
        return table

    def release(self, rid: int) -> None:
        self.free.extend(reversed(self.tables.pop(rid, [])))


def check_engine_scenario(scenario: Scenario) -> None:
    """What the real engine cannot run, as ScenarioErrors."""
    e, where = scenario.engine, f"{scenario.source}: " if scenario.source else ""
    if not SCHEDULERS[e.scheduler].iteration_level:
        runnable = ", ".join(n for n, c in SCHEDULERS.items() if c.iteration_level)
        raise ScenarioError(f"{where}engine.scheduler: the real engine runs iteration-level "
                            f"scheduling ({runnable}), not {e.scheduler}")
    if e.replicas != 1:
        raise ScenarioError(f"{where}engine.replicas: the real engine is one replica, got {e.replicas}")
    if e.tensor_parallel_size != 1:
        raise ScenarioError(f"{where}engine.tensor_parallel_size: the real engine runs on one "
                            f"device, got {e.tensor_parallel_size}")


def without_prefix_caching(scenario: Scenario) -> Scenario:
    """The scenario as this engine runs it: prefix caching off (its block tables hold no hashes)."""
    if scenario.engine.enable_prefix_caching is False:
        return scenario
    return dataclasses.replace(scenario, engine=dataclasses.replace(scenario.engine,
                                                                    enable_prefix_caching=False))


def check_workload(workload: Workload, where: str = "") -> None:
    """The real engine replays arrival times known up front. `where`: "file: " for messages."""
    if getattr(workload, "users", None) is not None or np.isnan(workload.arrival_s).any():
        raise ScenarioError(f"{where}workload.arrival: the real engine replays open-loop arrivals "
                            f"(a trace or an arrival process), not a closed loop of users")


def num_blocks(scenario: Scenario) -> int:
    """KV blocks of one replica, derived exactly as the simulator derives them."""
    return scenario.budget.num_gpu_blocks


class RealEngine:
    """Replays `workload` through `step` under `scenario`'s scheduler, drawing prompt token ids
    from `rng`. `clock`/`sleep` default to wall-clock time; `progress(done, total)` is called
    whenever requests finish."""

    def __init__(self, scenario: Scenario, step: Step, workload: Workload, rng: np.random.Generator,
                 *, progress: Callable[[int, int], None] | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep):
        check_engine_scenario(scenario)
        where = f"{scenario.source}: " if scenario.source else ""
        if scenario.model.sliding_layers:
            raise ScenarioError(f"{where}model: this engine's model attends every token; "
                                f"{scenario.model.name}'s sliding window is not in it (--engine vllm has it)")
        check_workload(workload, where)
        self.scenario, e = scenario, scenario.engine
        self.step, self.progress, self.clock, self.sleep = step, progress, clock, sleep
        self.req = RequestTable.from_workload(workload)
        self.req.replica[:] = 0
        blocks = num_blocks(scenario)
        check_servable(workload, e, blocks, where)  # as sim/simulate.py: refuse what would hang
        # the simulator's own scheduler; no prefix caching: BlockTables cannot share or re-hit
        # blocks, so a preempted request recomputes from nothing (validate simulates it so too)
        self.scheduler = build_scheduler(without_prefix_caching(scenario).engine, self.req, blocks, workload)
        self.kv = self.scheduler.kv  # counts blocks; BlockTables below holds their ids
        self.blocks = BlockTables(blocks, e.block_size)
        self.computed: dict[int, int] = {}  # running request -> tokens with KV (the model runner's view)
        vocab = scenario.model.vocab_size
        self.tokens = [rng.integers(0, vocab, size=int(p)).tolist() for p in self.req.prompt]
        self.recorder = Recorder(e.block_size)

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> EngineResult:
        req, sched, n = self.req, self.scheduler, len(self.req)
        self._step_s, self._schedules, self._done = [], [], 0
        nxt, t0 = 0, self.clock()
        while True:
            now = self.clock() - t0
            while nxt < n and req.arrival[nxt] <= now:
                sched.add(nxt)
                nxt += 1
            schedule = sched.schedule(now) if sched.has_work() else None
            if schedule is not None:
                self._iterate(schedule, now, t0)
            elif nxt < n:
                self.sleep(max(0.0, float(req.arrival[nxt]) - (self.clock() - t0)))
            elif sched.has_work():
                raise RuntimeError("the scheduler holds requests it can never run "
                                   "(a request larger than the KV cache or token budget?)")
            else:
                break
        duration = self.clock() - t0
        self._check_outputs()
        requests, steps = requests_frame(req), steps_frame(self.recorder)
        return EngineResult(requests=requests, steps=steps, step_s=np.array(self._step_s),
                            stats=[s.stats for s in self._schedules], schedules=self._schedules,
                            tokens=self.tokens, duration_s=duration,
                            summary=self._summary(requests, steps))

    def _summary(self, requests: pd.DataFrame, steps: pd.DataFrame) -> dict:
        """summary.json as sim/simulate.py computes it (mfu/mbu against the scenario's hardware
        peaks: estimates, meaningful only when the engine ran on that hardware)."""
        sc = self.scenario
        m, hw, e = sc.model, sc.hardware, sc.engine
        itl = inter_token_latencies(steps, self.recorder, self.req)
        s = summarize(self.req, requests, steps, self.recorder, itl=itl, max_num_seqs=e.max_num_seqs,
                      replicas=1, gpus=1, flops_per_token=m.flops_per_token,
                      weight_bytes=m.weight_bytes, kv_bytes_per_token=m.kv_bytes_per_token,
                      peak_flops=hw.bf16_flops, hbm_bandwidth=hw.hbm_bandwidth, slo=sc.slo)
        return {"scenario": sc.name, "engine": "real", **s}

    def _iterate(self, schedule: Schedule, start: float, t0: float) -> None:
        """One iteration that started (scheduling included) at `start` s after t0."""
        chunks, rids = self.plan(schedule)
        t_step = self.clock()
        sampled = self.step.run(chunks)
        end = self.clock()
        self._step_s.append(end - t_step)
        self._schedules.append(schedule)
        for rid, chunk, token in zip(rids, chunks, sampled):
            self.computed[rid] = chunk.context_len + len(chunk.token_ids)
            if chunk.sample:
                if token is None:
                    raise RuntimeError(f"the model step returned no token for request {rid}")
                self.tokens[rid].append(int(token))
        outcome = self.scheduler.update(schedule, 1, end - t0)
        took = end - t0 - start
        self.recorder.record(0, start, [took], took, schedule, outcome)
        for rid in outcome.finished:
            self.computed.pop(rid)
            self.blocks.release(rid)
        done = int(np.count_nonzero(~np.isnan(self.req.finish)))
        if done != self._done and self.progress is not None:
            self.progress(done, len(self.req))
        self._done = done

    # -- Schedule -> SeqChunks ------------------------------------------------------------------
    def plan(self, schedule: Schedule) -> tuple[list[SeqChunk], list[int]]:
        """The model's view of `schedule`, with block tables brought in line with the KV counts.

        Every request the schedule names computes its scheduled tokens on top of the context it
        already holds (0 for a new or a preempted-then-resumed request, whose earlier blocks are
        freed here: it is recomputed from scratch). A chunk samples iff it brings the request up to
        prompt + generated (its last prompt chunk, or a decode)."""
        for rid in schedule.preempted:
            self.computed.pop(rid, None)
            self.blocks.release(rid)
        chunks, rids = [], []
        for rid, t in schedule.num_scheduled_tokens.items():
            context = self.computed.get(rid, 0)
            seq = self.tokens[rid]
            assert context + t <= len(seq), (rid, context, t, len(seq))
            chunks.append(SeqChunk(token_ids=seq[context:context + t], context_len=context,
                                   block_table=list(self.blocks.grow(rid, context + t)),
                                   sample=context + t == len(seq)))
            rids.append(rid)
        assert self.blocks.used == self.kv.used, (self.blocks.used, self.kv.used)
        return chunks, rids

    def _check_outputs(self) -> None:
        req = self.req
        for rid in range(len(req)):
            if np.isnan(req.finish[rid]):
                continue
            if len(self.tokens[rid]) != req.prompt[rid] + req.output[rid]:
                raise RuntimeError(f"request {rid}: {len(self.tokens[rid]) - req.prompt[rid]} "
                                   f"tokens generated, expected {req.output[rid]}")
        assert not self.blocks.tables and self.blocks.used == self.kv.used == 0


def run_engine(scenario: Scenario, step: Step, workload: Workload, rng: np.random.Generator,
               **kwargs) -> EngineResult:
    """Replay `workload` (the simulator's very arrays) through `step`; see RealEngine."""
    return RealEngine(scenario, step, workload, rng, **kwargs).run()
