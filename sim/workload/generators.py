"""Requests to replay: arrival times and lengths as numpy arrays, from a trace or a seeded generator.

CONTRACT (owned by the workload engineer):
    Workload dataclass below.
    parse_workload(raw: dict, where: str, base_dir: Path) -> WorkloadConfig
        Validates the scenario's `workload:` mapping; `where` is the scenario file as the user should
        read it. Relative paths resolve against base_dir and must exist. Raises ScenarioError
        ("<where>: workload.<key path>: <what is allowed>").
    build_workload(cfg: WorkloadConfig, rng: np.random.Generator) -> Workload
        Vectorised and deterministic for a given rng; draws arrivals, prompt, output, priority in
        that order (closed loop: the users' start offsets and think times stand for arrivals).
        Trace problems raise ScenarioError naming the trace file and line.
The YAML format is in docs/workload.md.
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from sim.config.checks import (
    MAX_COUNT,
    MAX_RATE,
    MAX_REQUESTS,
    MAX_SECONDS,
    MAX_TOKENS,
    MIN_RATE,
    _check_keys,
    _choice,
    _int,
    _num,
    _show,
    read_text,
)
from sim.config.errors import ScenarioError, ServesimWarning
from sim.workload.traces import TIME_UNITS, TRACE_FORMATS, read_lengths, read_trace, shown


@dataclass(frozen=True)
class Users:
    """A closed loop's users: each sends a request, waits for it to finish, thinks, sends the next.
    Request ids go in arrival order, given during the run (sim/runtime/cluster.py `ClosedLoopRouter`)."""
    start_s: np.ndarray  # float64 [min(users, n)]: when user u sends its first request
    think_s: np.ndarray  # float64 [n]: think time after request i finishes, before its user's next
    # multi-turn sessions (sim/workload/sessions.py): turns of the k-th conversation to start, int64 [n];
    # None: every request is a conversation of its own (its prompt shares nothing with the last)
    turns: np.ndarray | None = None
    max_context: int | None = None  # tokens: a conversation ends before its prompt + output exceed it
    # agents: how many requests user u sends in all, int64 [users] (then it stops); None: users send
    # until the workload's num_requests have arrived
    calls: np.ndarray | None = None
    # an agent-session trace: each user's calls as recorded (sim/workload/sessions.py sends them so)
    script: AgentScript | None = None
    # agents with fan-out: the calls of each step, sent together (the next step waits for all of
    # them), int64 over every user's steps in turn, user u's at fan_out[fan_offsets[u]:fan_offsets[u + 1]];
    # None: one call a step
    fan_out: np.ndarray | None = None
    fan_offsets: np.ndarray | None = None


@dataclass(frozen=True)
class AgentScript:
    """The calls of recorded agent sessions (workload.format agent_sessions), user u's (the u-th session
    to start) at rows offsets[u]:offsets[u + 1], in order: each call's whole prompt, its output, and its
    tool's time after it (s, time_scale applied)."""
    offsets: np.ndarray  # int64 [users + 1]
    prompt: np.ndarray   # int64 [calls]
    output: np.ndarray   # int64 [calls]
    tool_s: np.ndarray   # float64 [calls]


@dataclass(frozen=True)
class Workload:
    arrival_s: np.ndarray      # float64 [n], seconds from the start, sorted ascending (closed loop: nan)
    prompt_tokens: np.ndarray  # int64 [n], >= 1
    output_tokens: np.ndarray  # int64 [n], >= 1
    priority: np.ndarray       # int64 [n], lower = more urgent (policy: priority); 0 when unknown
    users: Users | None = None  # closed loop: arrival times are only known during the run
    # per request, what its prompt shares with others: (ids, unit tokens): the prompt's first
    # len(ids) x unit tokens are identified unit by unit by chained ids (sim/kv/prefix_cache.py); a
    # request without one (None) shares nothing. None for the whole workload: no prefix identity.
    prefix: list | None = None
    # workload.classes: each request's class (an index into class_names), int64 [n]; None: one class
    classes: np.ndarray | None = None
    class_names: tuple[str, ...] = ()
    # workload.adapters: each request's LoRA adapter id (0..count-1), -1 for the base model, int64 [n];
    # None: every request on the base model
    adapter: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.arrival_s)


# ---- arrival processes: n arrival times in seconds, the first at t=0 (burst: at `at`) ----

class ArrivalProcess(Protocol):
    def times(self, rng: np.random.Generator, n: int) -> np.ndarray: ...


@dataclass(frozen=True)
class Poisson:
    rate: float  # requests/s; gaps are exponential with mean 1/rate

    def times(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return _cumulative(rng.exponential(1.0 / self.rate, size=n - 1))


@dataclass(frozen=True)
class Gamma:
    rate: float  # requests/s
    cv: float    # coefficient of variation of the gaps: 1 = Poisson, > 1 burstier, < 1 smoother

    def times(self, rng: np.random.Generator, n: int) -> np.ndarray:
        shape = 1.0 / self.cv**2  # gamma(k, theta) has cv 1/sqrt(k) and mean k*theta = 1/rate
        return _cumulative(rng.gamma(shape, 1.0 / (self.rate * shape), size=n - 1))


@dataclass(frozen=True)
class Constant:
    rate: float  # requests/s, exactly 1/rate apart

    def times(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.arange(n, dtype=np.float64) / self.rate


@dataclass(frozen=True)
class Burst:
    at: float = 0.0  # seconds; every request arrives then

    def times(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.at, dtype=np.float64)


@dataclass(frozen=True)
class Profile:
    """A rate that changes over time, e.g. a day of traffic: `rates[i]` req/s from `starts_s[i]`
    until the next start; after the last, that rate holds, or (`period_s`) the whole profile
    repeats every period. Poisson arrivals at the rate of the moment (a non-homogeneous Poisson
    process), drawn by inverting the cumulative rate: unit-rate arrival times E_k mapped to the t
    with integral of rate over [0, t] = E_k. The first arrival is where it falls, not at 0."""
    starts_s: tuple[float, ...]  # s, from 0, increasing
    rates: tuple[float, ...]     # req/s, >= 0
    period_s: float | None = None

    def cumulative(self) -> np.ndarray:
        """Expected arrivals by each start (and, with a period, by its end)."""
        starts, rates = np.asarray(self.starts_s), np.asarray(self.rates)
        ends = np.append(starts[1:], self.period_s) if self.period_s is not None else starts[1:]
        return np.concatenate(([0.0], np.cumsum(rates[:len(ends)] * (ends - starts[:len(ends)]))))

    def times(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.at(np.cumsum(rng.exponential(1.0, size=n)))

    def at(self, expected: np.ndarray) -> np.ndarray:
        """The times by which `expected` arrivals are expected (the inverse of the cumulative rate)."""
        starts, rates, cum = np.asarray(self.starts_s), np.asarray(self.rates), self.cumulative()
        shift = np.zeros(len(expected))
        if self.period_s is not None:  # whole periods first, then within one
            whole = np.floor(expected / cum[-1])
            expected, shift = expected - whole * cum[-1], whole * self.period_s
        j = np.minimum(np.searchsorted(cum, expected, side="right") - 1, len(rates) - 1)
        rate = rates[j]
        inside = np.divide(expected - cum[j], rate, out=np.zeros(len(expected)), where=rate > 0)
        return shift + starts[j] + inside


@dataclass(frozen=True)
class ClosedLoop:
    """Not a list of times: `users` users, each with one request in flight at a time (Users)."""
    users: int                         # concurrent users, >= 1
    think_time: float                  # s, mean pause between a response and the user's next request
    think_dist: str = "exponential"    # exponential | fixed
    turns: LengthDist | None = None    # turns per conversation (sim/workload/sessions.py); None: one each
    max_context: int | None = None     # tokens a conversation may reach (prompt + output)

    def plan(self, rng: np.random.Generator, n: int) -> Users:
        """User u starts at a uniform time in [0, think_time) (all at 0 when it is 0); the think
        time after each of the n requests is drawn up front."""
        starts = min(self.users, n)
        if self.think_time == 0:
            return Users(np.zeros(starts), np.zeros(n))
        start = rng.uniform(0.0, self.think_time, size=starts)
        return Users(start, _pauses(rng, self.think_time, self.think_dist, n))


def _pauses(rng: np.random.Generator, mean: float, dist: str, n: int) -> np.ndarray:
    """n pauses (s) of mean `mean`: exponential, or all `mean` (`fixed`; or a mean of 0: no draw)."""
    if dist == "exponential" and mean > 0:
        return rng.exponential(mean, size=n)
    return np.full(n, float(mean))


@dataclass(frozen=True)
class Agents:
    """Agent sessions arriving open loop: `sessions` of them, Poisson at `rate` sessions/s (the
    first at 0); each makes `steps` LLM calls one after another, a tool running `tool_time` s
    (mean) between a call's last token and the next call, whose prompt is the whole session so far
    plus the tool's result (a multi-turn conversation: sim/workload/sessions.py). With `fan_out`, a
    step is that many calls sent together on the same context (sub-agents, a map over documents), the
    tool running after the last of them; the next step's context holds all their answers. The
    requests are the sessions' calls: their count is the sum of the steps' calls, drawn up front."""
    rate: float                        # sessions/s
    sessions: int
    steps: LengthDist                  # LLM steps per session, >= 1
    tool_time: float                   # s, mean
    tool_dist: str = "exponential"     # exponential | fixed
    max_context: int | None = None     # tokens a session's context may reach (then it starts afresh)
    fan_out: LengthDist | None = None  # calls per step, >= 1 (None: one)

    def expected_requests(self) -> float:
        """The sessions' calls on average (a length distribution's mean steps x mean calls a step:
        fixed, uniform, lognormal)."""
        fan = 1.0 if self.fan_out is None else _mean(self.fan_out)
        return self.sessions * _mean(self.steps) * fan

    def plan(self, rng: np.random.Generator) -> Users:
        """Session start times, then each session's steps, (with fan_out: each step's calls,) then the
        tool time after every call; turns without end (a session's calls, `calls`, end it)."""
        start = Poisson(self.rate).times(rng, self.sessions)
        steps = self.steps.sample(rng, self.sessions)
        fan = offsets = None
        calls = steps.astype(np.int64)
        if self.fan_out is not None:
            if int(steps.sum()) > MAX_REQUESTS:
                raise ScenarioError(f"workload.arrival: {self.sessions} agent sessions take {int(steps.sum()):,} "
                                    f"steps, more than servesim's {MAX_REQUESTS:,} requests in one run")
            fan = self.fan_out.sample(rng, int(steps.sum())).astype(np.int64)
            offsets = np.concatenate(([0], np.cumsum(steps))).astype(np.int64)
            calls = np.add.reduceat(fan, offsets[:-1]) if len(fan) else np.zeros(0, np.int64)
        n = int(calls.sum())
        if n > MAX_REQUESTS:  # (checked before the lengths are drawn for them)
            raise ScenarioError(f"workload.arrival: {self.sessions} agent sessions make {n:,} calls, more than "
                                f"servesim's {MAX_REQUESTS:,} requests in one run; fewer sessions or steps")
        think = _pauses(rng, self.tool_time, self.tool_dist, n)
        return Users(start, think, np.full(n, n, dtype=np.int64), self.max_context, calls, fan_out=fan,
                     fan_offsets=offsets)


def _mean(d: LengthDist) -> float:
    """A count distribution's mean (fixed, uniform, lognormal before its cap)."""
    return float(d.value if isinstance(d, Fixed) else (d.low + d.high) / 2 if isinstance(d, Uniform)
                 else d.mean if isinstance(d, Lognormal) else 1.0)


def _cumulative(gaps: np.ndarray) -> np.ndarray:
    out = np.zeros(len(gaps) + 1, dtype=np.float64)
    np.cumsum(gaps, out=out[1:])
    return out


# ---- length (and priority) distributions: n int64 values ----

class LengthDist(Protocol):
    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray: ...


@dataclass(frozen=True)
class Fixed:
    value: int

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.value, dtype=np.int64)


@dataclass(frozen=True)
class Uniform:
    low: int
    high: int  # inclusive

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.low, self.high, size=n, endpoint=True, dtype=np.int64)


@dataclass(frozen=True)
class Lognormal:
    mean: float       # tokens: mean and std of the lognormal itself, not of its logarithm
    std: float
    min: int = 1      # after rounding, values are clipped to [min, max]
    max: int | None = None

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        sigma2 = np.log1p((self.std / self.mean) ** 2)  # from mean = e^(mu + s^2/2), var = (e^s^2 - 1) mean^2
        x = rng.lognormal(np.log(self.mean) - sigma2 / 2, np.sqrt(sigma2), size=n)
        return np.clip(np.rint(x), self.min, self.max).astype(np.int64)


@dataclass(frozen=True)
class Empirical:
    trace: Path   # absolute
    column: str   # prompt | output: which of the trace's lengths to resample
    format: str | None = None  # the trace's format (None: detected), as workload.format
    # any CSV: its own column name for prompt_tokens / output_tokens, as workload.columns (no
    # arrival column needed: only the lengths are read)
    columns: tuple[tuple[str, str], ...] | None = None

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.columns is not None:
            lengths = read_lengths(self.trace, dict(self.columns)[f"{self.column}_tokens"])
        else:  # a trace's lengths only
            lengths = read_trace(self.trace, self.format)[f"{self.column}_tokens"].to_numpy()
        return lengths[rng.integers(0, len(lengths), size=n)]  # with replacement


ARRIVALS = {"poisson": Poisson, "gamma": Gamma, "constant": Constant, "burst": Burst,
            "profile": Profile, "closed_loop": ClosedLoop, "agents": Agents}
THINK_DISTS = ("exponential", "fixed")
LENGTHS = {"fixed": Fixed, "uniform": Uniform, "lognormal": Lognormal, "empirical": Empirical}
PRIORITIES = {"fixed": Fixed, "uniform": Uniform}
TURN_DISTS = {"fixed": Fixed, "uniform": Uniform, "lognormal": Lognormal}  # turns per conversation


@dataclass(frozen=True)
class RequestClass:
    """A kind of traffic in the mix (chat, RAG, batch, a tenant): its share of the requests, its own
    lengths (None: the workload's) and priority (policy: priority; lower = sooner). Its SLO, if it
    has its own, is the scenario's `slo.classes.<name>`."""
    name: str
    share: float                         # of all requests, (0, 1]; the shares sum to 1
    prompt_tokens: LengthDist | None = None
    output_tokens: LengthDist | None = None
    priority: int = 0


@dataclass(frozen=True)
class WorkloadConfig:
    trace: Path | None = None                   # absolute; set = replay it, None = generate
    arrival: ArrivalProcess | ClosedLoop | Agents | None = None  # generator only
    prompt_tokens: LengthDist | None = None     # generator only
    output_tokens: LengthDist | None = None     # generator only
    num_requests: int | None = None             # generator: how many; trace: the first N (None = all)
    time_scale: float = 1.0                     # arrival offsets are divided by it (2 = twice the rate)
    priority: LengthDist | None = None          # None: the trace's `priority` column, else all 0
    prefix: SharedPrefix | None = None        # generator: shared system prompts
    # trace: its format (None: detected, sim/workload/traces.FORMATS), or a CSV's column mapping
    # ((key, column) pairs: arrival, prompt_tokens, output_tokens[, priority]) and arrival time unit
    format: str | None = None
    columns: tuple[tuple[str, str], ...] | None = None
    time_unit: str = "s"
    hash_block_tokens: int = 512  # tokens per id of a CSV's hash_ids column (Mooncake's blocks: 512)
    classes: tuple[RequestClass, ...] | None = None  # generator: a mix of request classes
    adapters: SharedAdapters | None = None      # LoRA adapters the requests use (engine.lora serves them)

    def read(self):
        """The trace's table (sim/workload/traces.read_trace) with this section's format options."""
        return read_trace(self.trace, self.format, dict(self.columns) if self.columns else None, self.time_unit,
                          self.hash_block_tokens)


@dataclass(frozen=True)
class SharedPrefix:
    """A share of requests starts with one of `groups` system prompts of `tokens` tokens."""
    tokens: int
    groups: int
    share: float

    def draw(self, rng: np.random.Generator, prompt_tokens: np.ndarray) -> list:
        chosen = rng.random(len(prompt_tokens)) < self.share
        group = rng.integers(0, self.groups, size=len(prompt_tokens))
        # (ids, unit tokens): one unit of `tokens` (or the whole prompt, if shorter) per group
        return [((("prefix", int(g)),), int(min(self.tokens, p))) if c else None
                for c, g, p in zip(chosen.tolist(), group.tolist(), prompt_tokens.tolist())]


@dataclass(frozen=True)
class SharedAdapters:
    """A share of requests names one of `count` LoRA adapters: uniformly (zipf_s 0), or the k-th most
    popular with weight 1 / k^zipf_s (a few hot adapters and a long tail, as multi-tenant serving sees)."""
    count: int
    share: float
    zipf_s: float = 0.0

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        chosen = rng.random(n) < self.share
        weights = 1.0 / np.arange(1, self.count + 1, dtype=np.float64) ** self.zipf_s
        which = rng.choice(self.count, size=n, p=weights / weights.sum())
        return np.where(chosen, which, -1).astype(np.int64)


def build_workload(cfg: WorkloadConfig, rng: np.random.Generator) -> Workload:
    """The requests `cfg` describes; every random draw comes from `rng`. A closed loop's arrival
    times are nan (the run fills them in); time_scale divides its think times and start offsets."""
    users, prefix, which, adapter = None, None, None, None
    if cfg.trace is not None:
        arrival, prompt, output, priority, prefix, users, adapter = _replay(cfg, rng)
    else:  # a generator: parse_workload set all four (agents: the steps set the count)
        n, process = cfg.num_requests, cfg.arrival
        assert process is not None
        if isinstance(process, Agents):  # the sessions' calls: as many as their steps
            users = process.plan(rng)
            n = len(users.think_s)
            arrival = np.full(n, np.nan)
        elif isinstance(process, ClosedLoop):
            assert n is not None
            users, arrival = process.plan(rng, n), np.full(n, np.nan)
        else:
            assert n is not None
            arrival = process.times(rng, n)
        if cfg.classes is None:
            assert cfg.prompt_tokens is not None and cfg.output_tokens is not None
            prompt = cfg.prompt_tokens.sample(rng, n)
            output = cfg.output_tokens.sample(rng, n)
            priority = np.zeros(n, dtype=np.int64)
        else:
            which, prompt, output, priority = _mix(cfg, rng, n)
    if cfg.priority is not None:
        priority = cfg.priority.sample(rng, len(arrival))
    if cfg.prefix is not None:  # drawn last: workloads without a prefix keep their numbers
        prefix = cfg.prefix.draw(rng, prompt)
    if cfg.adapters is not None:  # (after that: likewise)
        adapter = cfg.adapters.draw(rng, len(prompt))
    if users is not None:
        loop = cfg.arrival
        if isinstance(loop, ClosedLoop):
            turns = loop.turns.sample(rng, len(prompt)) if loop.turns is not None else None  # (last again)
            users = Users(users.start_s, users.think_s, turns, loop.max_context)
        users = replace(users, start_s=users.start_s / cfg.time_scale, think_s=users.think_s / cfg.time_scale)
        if users.script is not None:  # (a recorded session's tool times: as its think times)
            users = replace(users, script=replace(users.script, tool_s=users.script.tool_s / cfg.time_scale))
    arrival = arrival / cfg.time_scale
    # the times the simulation will use, after time_scale: past MAX_SECONDS a float64 clock no
    # longer resolves a step (its spacing at 1e15 s is 0.125 s), and late requests came out with
    # latencies of 0
    for what, values in (("arrival times", arrival),
                         ("closed-loop start and think times",
                          np.concatenate((users.start_s, users.think_s,
                                          users.script.tool_s if users.script is not None else np.zeros(0)))
                          if users is not None else np.zeros(0))):
        finite = values[np.isfinite(values)]
        if len(finite) and float(finite.max()) > MAX_SECONDS:
            raise ScenarioError(f"workload.time_scale: {what} reach {float(finite.max()):.3g} s (time_scale "
                                f"{cfg.time_scale:g}), past servesim's {MAX_SECONDS:g} s bound; raise "
                                f"time_scale or use fewer requests")
    return Workload(arrival_s=arrival, prompt_tokens=prompt,
                    output_tokens=output, priority=priority, users=users, prefix=prefix, classes=which,
                    class_names=tuple(c.name for c in cfg.classes) if cfg.classes else (), adapter=adapter)


def _mix(cfg: WorkloadConfig, rng: np.random.Generator, n: int) -> tuple[np.ndarray, ...]:
    """(class, prompt, output, priority) of n requests in a mix of classes: each request's class
    drawn by share, then the prompts class by class, then the outputs class by class."""
    classes = cfg.classes
    assert classes is not None
    which = rng.choice(len(classes), size=n, p=np.array([c.share for c in classes]) / sum(c.share for c in classes))
    prompt, output = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    members = [np.flatnonzero(which == k) for k in range(len(classes))]
    for lengths, key in ((prompt, "prompt_tokens"), (output, "output_tokens")):
        for c, idx in zip(classes, members):
            dist = getattr(c, key) or getattr(cfg, key)
            lengths[idx] = dist.sample(rng, len(idx))
    priority = np.array([c.priority for c in classes], dtype=np.int64)[which]
    return which.astype(np.int64), prompt, output, priority


def _replay(cfg: WorkloadConfig, rng: np.random.Generator) -> tuple[Any, ...]:
    table = cfg.read()
    num_requests, trace = cfg.num_requests, cfg.trace
    assert trace is not None
    if table.attrs.get("agent_sessions"):
        if num_requests is not None:
            raise ScenarioError(f"{shown(trace)}: workload.num_requests: not with agent sessions (their calls "
                                "set how many requests there are)")
        return _sessions(table)
    if num_requests is not None:
        if num_requests > len(table):
            raise ScenarioError(f"{shown(trace)}: has {len(table)} requests, fewer than "
                                f"workload.num_requests = {num_requests}")
        table = table.iloc[:num_requests]
    columns = tuple(table[c].to_numpy(copy=True) for c in
                    ("arrival_s", "prompt_tokens", "output_tokens", "priority"))
    if np.isnan(columns[0]).all():  # a vLLM benchmark without start_times: its rate and burstiness
        if "request_rate" not in table.attrs:  # e.g. ShareGPT: lengths only
            raise ScenarioError(f"{shown(trace)}: has no arrival times to replay; use it as a length "
                                "distribution (prompt_tokens: {dist: empirical, trace: ...}) with an arrival process")
        columns = (bench_arrivals(table.attrs, len(table), rng, trace), *columns[1:])
    adapter = None
    if "adapter" in table:  # (a trace's adapter column: each request's LoRA adapter, -1 the base model)
        if cfg.adapters is not None:
            raise ScenarioError(f"{shown(trace)}: has an adapter column and workload.adapters draws them too; "
                                "keep one")
        adapter = table["adapter"].to_numpy(copy=True)
    return (*columns, table["prefix"].tolist() if "prefix" in table else None, None, adapter)


def _sessions(table) -> tuple[Any, ...]:
    """An agent-session trace as a closed loop: one user per session, the sessions in order of their
    start (ties: first appearance), each sending its recorded calls one after another, one
    conversation (sim/workload/sessions.py). The request arrays hold the calls in that order (the
    run sets each one's lengths as it is sent, so the checks before the run see every call)."""
    session = table["session"].to_numpy()
    first = np.unique(session, return_index=True)[1]          # each session's first row
    start = table["start_s"].to_numpy()[first]
    order = np.argsort(start, kind="stable")                   # user u = the u-th session to start
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    rows = np.argsort(rank[session], kind="stable")            # calls grouped by user, in file order
    calls = np.bincount(rank[session], minlength=len(order)).astype(np.int64)
    offsets = np.concatenate(([0], np.cumsum(calls))).astype(np.int64)
    prompt, output = table["prompt_tokens"].to_numpy()[rows], table["output_tokens"].to_numpy()[rows]
    script = AgentScript(offsets, prompt, output, table["tool_s"].to_numpy(dtype=np.float64)[rows])
    n = len(rows)
    users = Users(start[order].astype(np.float64), np.zeros(n), calls.copy(), None, calls, script)
    return np.full(n, np.nan), prompt.copy(), output.copy(), np.zeros(n, dtype=np.int64), None, users, None


def bench_arrivals(attrs: dict, n: int, rng: np.random.Generator, trace: Path) -> np.ndarray:
    """Arrivals as `vllm bench serve` sends them: gamma gaps with shape = burstiness and mean 1 /
    request_rate (burstiness 1: Poisson), the first at 0; request_rate inf: all at once. Said in a
    warning: the benchmark's own send times are unknown."""
    rate, burst = attrs["request_rate"], attrs["burstiness"]
    warnings.warn(f"{shown(trace)}: no start_times (run vllm bench serve with --save-detailed to keep "
                  f"them); arrivals drawn from its request_rate {rate:g} req/s and burstiness {burst:g}, "
                  "as vllm bench serve draws them", ServesimWarning, stacklevel=2)
    if not np.isfinite(rate):
        return np.zeros(n)
    gaps = rng.gamma(burst, 1.0 / (rate * burst), size=n)
    gaps[0] = 0.0
    return np.cumsum(gaps)


# ---- parsing the YAML section ----

GENERATOR_KEYS = ("arrival", "prompt_tokens", "output_tokens", "num_requests")
SECTION_KEYS = ("trace", "format", "columns", "time_unit", "hash_block_tokens", "time_scale", "priority", "prefix",
                *GENERATOR_KEYS, "classes", "adapters")
CLASS_KEYS = ("name", "share", "prompt_tokens", "output_tokens", "priority")
# a class name: shown in tables, figures, CSV cells and YAML keys, so none of their syntax ([, $, ", =, ",")
CLASS_NAME = re.compile(r"[\w .:/@+-]{1,64}")
COLUMN_KEYS = ("arrival", "prompt_tokens", "output_tokens", "priority", "hash_ids")


def parse_workload(raw: dict, where: str, base_dir: Path) -> WorkloadConfig:
    """The validated `workload:` section: a trace XOR a generator (see the module docstring)."""
    top = _Keys(raw, where, "workload", SECTION_KEYS)
    top.only()
    time_scale = top.number("time_scale", default=1.0, high=1e6, floor=1e-6)
    num_requests = top.maybe_integer("num_requests", 1, high=MAX_REQUESTS)
    priority = None if raw.get("priority") is None else _dist(top, "priority", PRIORITIES, 0, base_dir)
    adapters = None
    if raw.get("adapters") is not None:
        keys = _Keys(raw["adapters"], top.where, "workload.adapters", ("count", "share", "zipf_s"))
        keys.only()
        adapters = SharedAdapters(keys.integer("count", 1, high=MAX_COUNT), keys.number("share", low=0, high=1),
                                  keys.number("zipf_s", low=0, high=10, default=0.0))
    if raw.get("trace") is not None:
        clash = [k for k in (*GENERATOR_KEYS[:3], "prefix", "classes") if raw.get(k) is not None]
        if clash:
            raise top.fail(clash[0], "not allowed with workload.trace (a trace gives arrivals and "
                                     "lengths: use either trace or a generator)")
        fmt, columns, time_unit, block_tokens = _trace_format(top, raw)
        return WorkloadConfig(trace=top.file("trace", base_dir), time_scale=time_scale, num_requests=num_requests,
                              priority=priority, format=fmt, columns=columns, time_unit=time_unit,
                              hash_block_tokens=block_tokens, adapters=adapters)
    classes = _classes(top, raw, base_dir)
    agents = isinstance(raw.get("arrival"), dict) and raw["arrival"].get("process") == "agents"
    if agents and raw.get("num_requests") is not None:
        raise top.fail("num_requests", "not with agents: the sessions' steps set how many requests there are")
    missing = [k for k in GENERATOR_KEYS if raw.get(k) is None
               and not (classes and k in ("prompt_tokens", "output_tokens")
                        and all(getattr(c, k) is not None for c in classes))
               and not (agents and k == "num_requests")]
    if missing:
        raise ScenarioError(f"{where}: workload: needs either trace or all of "
                            f"{', '.join(GENERATOR_KEYS)} (missing {', '.join(missing)})")
    arrival = _arrival(top, base_dir)
    prefix = None
    assert num_requests is not None or agents  # (a generator needs it: `missing` above)
    if raw.get("prefix") is not None:
        keys = _Keys(raw["prefix"], top.where, "workload.prefix", ("tokens", "groups", "share"))
        keys.only()
        prefix = SharedPrefix(keys.integer("tokens", 1), keys.integer("groups", 1, high=MAX_COUNT),
                                        keys.number("share", low=0, high=1))
    rate = getattr(arrival, "rate", None)
    count = arrival.sessions if isinstance(arrival, Agents) else num_requests
    assert count is not None
    if rate is not None and count / (rate * time_scale) > MAX_SECONDS:
        raise top.fail("arrival.rate", f"{count} {'sessions' if agents else 'requests'} at {rate:g} "
                                       f"{'sessions' if agents else 'req'}/s "
                                       f"(time_scale {time_scale:g}) span more than "
                                       f"{MAX_SECONDS:g} s; raise the rate or lower num_requests")
    prompt, output = (_dist(top, k, LENGTHS, 1, base_dir) if raw.get(k) is not None else None
                      for k in ("prompt_tokens", "output_tokens"))
    return WorkloadConfig(arrival=arrival, time_scale=time_scale, num_requests=num_requests, priority=priority,
                          prefix=prefix, classes=classes, prompt_tokens=prompt, output_tokens=output,
                          adapters=adapters)


def _classes(top: _Keys, raw: dict, base_dir: Path) -> tuple[RequestClass, ...] | None:
    """workload.classes: a list of {name, share, prompt_tokens?, output_tokens?, priority?}; the
    shares sum to 1 (within 1e-6), names are unique, and a class's priority replaces
    workload.priority (so both are refused)."""
    v = raw.get("classes")
    if v is None:
        return None
    if not isinstance(v, list) or not v:
        what = "an empty list" if isinstance(v, list) else f"{_show(v)} is not a list of classes"
        raise top.fail("classes", f"{what}; e.g. [{{name: chat, share: 0.8}}, "
                                  "{name: batch, share: 0.2, output_tokens: {dist: fixed, value: 1024}}]")
    if raw.get("priority") is not None:
        raise top.fail("priority", "not with workload.classes (each class has its own priority)")
    out: list[RequestClass] = []
    for i, item in enumerate(v):
        keys = _Keys(item, top.where, f"workload.classes[{i}]", CLASS_KEYS)
        keys.only()
        name = item.get("name")
        if not isinstance(name, str) or not CLASS_NAME.fullmatch(name) or not name.strip():
            raise keys.fail("name", f"{_show(name)} is not a class name (1 to 64 letters, digits, spaces and "
                                    "_ - . : / @ +, as a tenant or traffic name)")
        if name in (c.name for c in out):
            raise keys.fail("name", f"{name!r} names two classes")
        out.append(RequestClass(
            name=name, share=keys.number("share", high=1),
            prompt_tokens=_dist(keys, "prompt_tokens", LENGTHS, 1, base_dir) if item.get("prompt_tokens") is not None
            else None,
            output_tokens=_dist(keys, "output_tokens", LENGTHS, 1, base_dir) if item.get("output_tokens") is not None
            else None,
            priority=keys.integer("priority", 0, default=0, high=MAX_COUNT)))
    total = sum(c.share for c in out)
    if abs(total - 1) > 1e-6:
        raise top.fail("classes", f"the shares sum to {total:g}; they must sum to 1")
    return tuple(out)


def _trace_format(top: _Keys, raw: dict) -> tuple[str | None, tuple[tuple[str, str], ...] | None, str, int]:
    """(format, columns, time_unit, hash_block_tokens): workload.format (a name of
    sim/workload/traces.TRACE_FORMATS, read now: a format registered later is accepted), or
    workload.columns + time_unit for any CSV."""
    fmt, columns, time_unit = None, None, WorkloadConfig.time_unit
    if raw.get("format") is not None:
        fmt = top.choice("format", tuple(TRACE_FORMATS))
    if raw.get("columns") is not None:
        if fmt is not None:
            raise top.fail("columns", "give workload.format or workload.columns, not both "
                                      "(columns reads any CSV)")
        keys = _Keys(raw["columns"], top.where, "workload.columns", COLUMN_KEYS)
        keys.only()
        missing = [k for k in COLUMN_KEYS[:3] if raw["columns"].get(k) is None]
        if missing:
            raise keys.fail(missing[0], "missing: name the CSV column for each of arrival, prompt_tokens, "
                                        "output_tokens (priority optional)")
        bad = [k for k, v in raw["columns"].items() if not isinstance(v, str) or not v]
        if bad:
            raise keys.fail(bad[0], "must be a column name (text)")
        columns = tuple((k, raw["columns"][k]) for k in COLUMN_KEYS if k in raw["columns"])
        time_unit = top.choice("time_unit", tuple(TIME_UNITS), "s")
    elif raw.get("time_unit") is not None:
        raise top.fail("time_unit", "only with workload.columns (the other formats fix their unit)")
    block_tokens = top.integer("hash_block_tokens", 1, default=WorkloadConfig.hash_block_tokens)
    return fmt, columns, time_unit, block_tokens


def _arrival(top: _Keys, base_dir: Path) -> ArrivalProcess | ClosedLoop | Agents:
    keys = top.sub("arrival", "process")
    process = keys.choice("process", tuple(ARRIVALS))
    keys.only(ARRIVALS[process])
    if process == "burst":
        return Burst(keys.number("at", default=0.0, low=0, high=MAX_SECONDS))
    if process == "gamma":
        return Gamma(_rate(keys), keys.number("cv", high=1e3, floor=1e-3))
    if process == "profile":
        return _profile(keys, base_dir)
    if process == "closed_loop":
        turns = keys.raw.get("turns")
        if isinstance(turns, dict):
            turns = _dist(keys, "turns", TURN_DISTS, 1, Path("."))
        elif turns is not None:
            turns = Fixed(keys.integer("turns", 1))
        if turns is None and keys.raw.get("max_context") is not None:
            raise keys.fail("max_context", "only with workload.arrival.turns (it bounds a conversation)")
        return ClosedLoop(keys.integer("users", 1, high=MAX_COUNT),
                          keys.number("think_time", low=0, high=MAX_SECONDS),
                          keys.choice("think_dist", THINK_DISTS, "exponential"), turns,
                          keys.maybe_integer("max_context", 2))
    if process == "agents":
        steps = keys.raw.get("steps")
        agents = Agents(_rate(keys), keys.integer("sessions", 1, high=MAX_COUNT),
                        _dist(keys, "steps", TURN_DISTS, 1, Path(".")) if isinstance(steps, dict)
                        else Fixed(keys.integer("steps", 1)),
                        keys.number("tool_time", low=0, high=MAX_SECONDS),
                        keys.choice("tool_dist", THINK_DISTS, "exponential"), keys.maybe_integer("max_context", 2),
                        None if keys.raw.get("fan_out") is None else
                        _dist(keys, "fan_out", TURN_DISTS, 1, Path(".")) if isinstance(keys.raw["fan_out"], dict)
                        else Fixed(keys.integer("fan_out", 1, high=MAX_COUNT)))
        calls = agents.expected_requests()
        if calls > MAX_REQUESTS:
            raise keys.fail("sessions", f"{agents.sessions:,} sessions of {calls / agents.sessions:g} calls on "
                                        f"average make more than servesim's {MAX_REQUESTS:,} requests in one run")
        return agents
    return ARRIVALS[process](_rate(keys))


def _profile(keys: _Keys, base_dir: Path) -> Profile:
    """arrival: {process: profile, rates: [[start_s, req/s], ...] or a CSV file (columns start_s,rate;
    relative to the scenario's folder), period_s: optional}."""
    raw = keys.raw.get("rates")
    at = keys.at("rates")
    if isinstance(raw, str):
        path = keys.file("rates", base_dir)
        text = read_text(path, "rate profile").strip().splitlines()
        header = [h.strip() for h in text[0].split(",")] if text else []
        if header[:2] != ["start_s", "rate"]:
            raise ScenarioError(f"{shown(path)}: a rate profile CSV has the header start_s,rate (req/s from "
                                f"that second on); got {','.join(header)!r}")
        rows: list = []
        for line_no, line in enumerate(text[1:], start=2):
            cells = line.split(",")
            try:
                rows.append([float(cells[0]), float(cells[1])])
            except (ValueError, IndexError):
                raise ScenarioError(f"{shown(path)}:{line_no}: {line[:60]!r} is not start_s,rate numbers") from None
        raw, at = rows, shown(path)
    if not isinstance(raw, list) or not raw or not all(isinstance(r, (list, tuple)) and len(r) == 2 for r in raw):
        raise ScenarioError(f"{at}: a list of [start_s, rate] pairs (req/s from that second on, the first "
                            "at 0), or a CSV file with columns start_s,rate; e.g. [[0, 2], [3600, 8]]")
    starts = [_num(t, f"{at}[{k}] start_s", 0, cap=MAX_SECONDS) for k, (t, _) in enumerate(raw)]
    rates = [_num(r, f"{at}[{k}] rate", 0, cap=MAX_RATE) for k, (_, r) in enumerate(raw)]
    if starts[0] != 0 or any(b <= a for a, b in zip(starts, starts[1:])):
        raise ScenarioError(f"{at}: start times must begin at 0 and increase; got {starts[:6]}")
    period = keys.number("period_s", default=None, low=0, high=MAX_SECONDS)
    if period is not None and period <= starts[-1]:
        raise keys.fail("period_s", f"{period:g} is not after the last start ({starts[-1]:g} s): the "
                                    "profile repeats once its last segment ends")
    if max(rates) < MIN_RATE or (period is None and rates[-1] < MIN_RATE):
        raise ScenarioError(f"{at}: without period_s the last rate holds for ever, so it must be at least "
                            f"{MIN_RATE:g} req/s (with period_s, some segment's must be)")
    return Profile(tuple(starts), tuple(rates), period)


def _rate(keys: _Keys) -> float:
    return keys.number("rate", high=MAX_RATE, floor=MIN_RATE)  # req/s


def _dist(top: _Keys, key: str, table: dict, lo: int, base_dir: Path) -> LengthDist:
    """One `{dist: ..., ...}` mapping; values (lengths, priorities) must be integers >= lo."""
    keys = top.sub(key, "dist")
    dist = keys.choice("dist", tuple(table))
    keys.only(table[dist])
    if dist == "fixed":
        return Fixed(keys.integer("value", lo))
    if dist == "uniform":
        low = keys.integer("low", lo)
        return Uniform(low, keys.integer("high", low))
    if dist == "lognormal":
        lowest = keys.integer("min", 1, default=1)
        return Lognormal(keys.number("mean"), keys.number("std"), lowest,
                         keys.maybe_integer("max", lowest))
    default_column = {"prompt_tokens": "prompt", "output_tokens": "output"}[key]
    column = keys.choice("column", ("prompt", "output"), default_column)
    fmt = keys.choice("format", tuple(TRACE_FORMATS), None)
    columns = None
    if keys.raw.get("columns") is not None:
        if fmt is not None:
            raise keys.fail("columns", "give format or columns, not both (columns reads any CSV)")
        mapping = _Keys(keys.raw["columns"], keys.where, f"{keys.path}.columns", ("prompt_tokens", "output_tokens"))
        mapping.only()
        wanted = f"{column}_tokens"
        name = mapping.raw.get(wanted)
        if not isinstance(name, str) or not name:
            raise mapping.fail(wanted, "missing: name the CSV column that holds the lengths to resample")
        columns = tuple((k, v) for k, v in mapping.raw.items() if isinstance(v, str))
    return Empirical(keys.file("trace", base_dir), column, fmt, columns)


_REQUIRED = object()


class _Keys:
    """One mapping of the section: typed getters whose errors name the file and the key path."""

    def __init__(self, raw: Any, where: str, path: str, allowed: tuple[str, ...]):
        if not isinstance(raw, dict):
            raise ScenarioError(f"{where}: {path}: {_show(raw)} is not a mapping; allowed keys: "
                                f"{', '.join(allowed)}")
        self.raw, self.where, self.path, self.allowed = raw, where, path, allowed

    def only(self, cls: type | None = None) -> None:
        """Reject keys outside `allowed` (plus the fields of `cls`, once the dist is known)."""
        if cls is not None:
            self.allowed = self.allowed + tuple(f.name for f in fields(cls))
        _check_keys(self.raw, self.path, lambda path: f"{self.where}: {path}", self.allowed)

    def sub(self, key: str, kind_key: str) -> _Keys:
        return _Keys(self.raw[key], self.where, f"{self.path}.{key}", (kind_key,))

    def at(self, key: str) -> str:
        return f"{self.where}: {self.path}.{key}"

    def fail(self, key: str, what: str) -> ScenarioError:
        return ScenarioError(f"{self.at(key)}: {what}")

    def _get(self, key: str, default: Any, allowed: str) -> Any:
        if self.raw.get(key) is not None:  # YAML `key:` with no value (null) counts as absent
            return self.raw[key]
        if default is _REQUIRED:
            raise self.fail(key, f"missing (expected {allowed})")
        return default

    def integer(self, key: str, low: int, default: Any = _REQUIRED, high: int = MAX_TOKENS) -> int:
        value = self._get(key, default, f"an integer >= {low}")
        return value if value is default else _int(value, self.at(key), lo=low, cap=high)

    def maybe_integer(self, key: str, low: int, high: int = MAX_TOKENS) -> int | None:
        """An integer >= low, or None when the key is absent."""
        return None if self.raw.get(key) is None else self.integer(key, low, high=high)

    def number(self, key: str, default: Any = _REQUIRED, low: float | None = None,
               high: float = MAX_TOKENS, floor: float | None = None) -> float:
        """A finite number > 0 (or >= low when `low` is given); `high` and `floor` are sanity
        bounds, said apart."""
        value = self._get(key, default, "a number > 0" if low is None else f"a number >= {low}")
        if value is default:
            return value
        if low is None:
            value = _num(value, self.at(key), 0, open_lo=True, cap=high)
        else:
            value = _num(value, self.at(key), low, cap=high)
        if floor is not None and value < floor:
            raise self.fail(key, f"{value!r} is less than {floor:g}, the least servesim accepts here")
        return value

    def choice(self, key: str, options: tuple[str, ...], default: Any = _REQUIRED) -> str:
        value = self._get(key, default, f"one of {', '.join(options)}")
        return value if value is default and default is not _REQUIRED else _choice(value, self.at(key), options)

    def file(self, key: str, base_dir: Path) -> Path:
        value = self._get(key, _REQUIRED, "a file path")
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, f"{value!r} is not a file path")
        resolved = (Path(base_dir) / Path(value).expanduser()).resolve()
        if not resolved.is_file():
            raise self.fail(key, f"no such file {value!r} (looked in {shown(Path(base_dir).resolve())})")
        return resolved
