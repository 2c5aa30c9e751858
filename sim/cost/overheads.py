"""vLLM V1's engine overheads on a GPU: what a measured step cost (kernel time) does not hold.

Kernel tables time the GPU's work. A real server adds host time to every iteration and request
handling to every request. vLLM V1 hides most per-iteration host work behind the GPU: with
asynchronous scheduling the CPU schedules iteration N + 1 and processes iteration N - 1's output
while the GPU runs N, and decode batches replay CUDA graphs. So an iteration lasts

    max(gpu, host_per_iteration_s) + per_iteration_s + tp_sync_per_iteration_s x (TP > 1)

(`host` hidden unless the GPU work is shorter; `per_iteration_s` never hidden, e.g. the sampled
tokens' device-to-host copy; `tp_sync` the extra per-step synchronisation of TP workers), and a
request's client-side times carry

    TTFT, E2E  += frontend_s + frontend_per_prompt_token_s x prompt tokens
                  (HTTP, tokenisation, handing the request to the engine core, detokenising and
                  streaming the token back: work of the API-server process, not of the GPU)
    TTFT, E2E  += one iteration, when `async_scheduling` and the request arrived while the
                  iteration before its first one was running: that iteration's successor was
                  already scheduled without it, so it joins one iteration later (priced as the
                  iteration it arrived during: the one scheduled without it is of that make-up,
                  while its own first iteration also holds its prefill chunk)

and two sources of spread real servers show and a deterministic engine does not (fitted on the
same runs: their TTFT p99 ran up to 1.4x the simulated one, E2E p90 ~10% past its median where
the simulation had none):

    frontend   the request handling above is not the same for every request (the API server's
               event loop is shared by every stream): each request's frontend_s is drawn from a
               lognormal of mean frontend_s and coefficient of variation `frontend_cv`
    stalls     the engine pauses now and then (Python garbage collection, the API server's loop
               blocked by a burst of streams): pauses arrive as a Poisson process of
               `stall_rate_per_s` per engine, each of exponential length with mean `stall_s`,
               and delay every token of the requests in flight across it

The frontend, the scheduling lag and the stalls shift a request's tokens, so ITL is unchanged
(a stall lengthens one gap of the requests it crosses: their TPOT, as the client measures it);
they are applied to the request times after the engine simulation (the engine
itself is not delayed: for an open-loop workload that is the same as delaying every arrival; a
closed-loop user's think time starts from the engine's finish, not the client's).

Each value's source is in docs/validation.md: the defaults for measured profiles are fitted to real
vLLM serving on H100 (bench/fidelity.py --fit), the roofline and fitted (v1) profiles carry none.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from sim.config.errors import ScenarioError


@dataclass(frozen=True)
class EngineOverheads:
    host_per_iteration_s: float = 0.0        # CPU time per iteration the GPU work hides
    per_iteration_s: float = 0.0             # per iteration, not hidden
    tp_sync_per_iteration_s: float = 0.0     # per iteration with tensor_parallel_size > 1
    frontend_s: float = 0.0                  # per request, on TTFT and E2E
    frontend_per_prompt_token_s: float = 0.0  # per prompt token, on TTFT and E2E
    async_scheduling: bool = False           # a request arriving mid-iteration joins one later
    frontend_cv: float = 0.0                 # spread of the per-request frontend time (lognormal; 0: fixed)
    stall_rate_per_s: float = 0.0            # engine pauses per second per engine (Poisson)
    stall_s: float = 0.0                     # their mean length, s (exponential)

    def step_floor_and_adder(self, tensor_parallel_size: int) -> tuple[float, float]:
        """(floor, adder): an iteration of GPU time g lasts max(g, floor) + adder."""
        adder = self.per_iteration_s + (self.tp_sync_per_iteration_s if tensor_parallel_size > 1 else 0.0)
        return self.host_per_iteration_s, adder

    @property
    def on_requests(self) -> bool:
        """Does it change request times after the engine simulation?"""
        return bool(self.frontend_s or self.frontend_per_prompt_token_s or self.async_scheduling
                    or (self.stall_rate_per_s and self.stall_s))

    def as_dict(self) -> dict:
        return asdict(self)

    def apply(self, arrival: np.ndarray, prompt: np.ndarray, first_scheduled: np.ndarray,
              first_token: np.ndarray, finish: np.ndarray, replica: np.ndarray,
              steps: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
              durations: np.ndarray, rng: np.random.Generator | None = None
              ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
        """Shift `first_token` and `finish` (in place) by each request's frontend time, scheduling
        lag and stalls; returns the first token's shift (s) and, where the times spread
        (`spreads`), each request's frontend time and the pauses during its decode (s). `steps` =
        (replica, start, total, count) per row of steps.csv, `durations` every iteration's length in
        row order (the recorder's); `rng` draws the spread (needed when it is set)."""
        lag = (scheduling_lag(arrival, first_scheduled, replica, steps, durations)
               if self.async_scheduling and len(durations) else 0.0)
        front, on_first, on_finish = self.parts(arrival, prompt, first_token + lag, finish + lag, replica, rng)
        first_token += front + on_first + lag
        finish += front + on_finish + lag
        return front + on_first + lag, ((front, on_finish - on_first) if self.spreads else None)

    @property
    def spreads(self) -> bool:
        """Does it draw per-request times (frontend_cv, stalls)? Then requests.csv records each
        request's frontend time and the pauses during its decode (frontend_s, stall_s)."""
        return self.frontend_cv > 0 or (self.stall_rate_per_s > 0 and self.stall_s > 0)

    def shifts(self, arrival: np.ndarray, prompt: np.ndarray, first_token: np.ndarray, finish: np.ndarray,
               replica: np.ndarray, rng: np.random.Generator | None) -> tuple[np.ndarray, np.ndarray]:
        """Per request, what the frontend and the stalls add to its first token and to its last,
        given the engine's times for them (the lag in)."""
        front, on_first, on_finish = self.parts(arrival, prompt, first_token, finish, replica, rng)
        return front + on_first, front + on_finish

    def parts(self, arrival: np.ndarray, prompt: np.ndarray, first_token: np.ndarray, finish: np.ndarray,
              replica: np.ndarray, rng: np.random.Generator | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(frontend time, pauses before the first token, pauses before the last) per request.
        Draws, in this order: one frontend factor per request, then per engine its stalls."""
        n = len(arrival)
        front = self.frontend_s + self.frontend_per_prompt_token_s * prompt.astype(np.float64)
        front = np.broadcast_to(front, arrival.shape).astype(np.float64)
        if self.frontend_cv > 0 and n:
            assert rng is not None, "frontend_cv needs the run's generator"
            front = front * mean_one_lognormal(rng, self.frontend_cv, n)
        if not (self.stall_rate_per_s > 0 and self.stall_s > 0 and n):
            return front, np.zeros(n), np.zeros(n)
        assert rng is not None, "stalls need the run's generator"
        on_first, on_finish = stall_delays(rng, self.stall_rate_per_s, self.stall_s, arrival, first_token,
                                           finish, replica)
        return front, on_first, on_finish


def mean_one_lognormal(rng: np.random.Generator, cv: float, n: int) -> np.ndarray:
    """n draws of a lognormal with mean 1 and coefficient of variation `cv`."""
    sigma = float(np.sqrt(np.log1p(cv * cv)))
    return rng.lognormal(-0.5 * sigma * sigma, sigma, n)


def stall_delays(rng: np.random.Generator, rate_per_s: float, mean_s: float, arrival: np.ndarray,
                 first_token: np.ndarray, finish: np.ndarray, replica: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per request, what the engine's pauses add to its first token and to its last (each engine's
    pauses: Poisson at `rate_per_s` over the span its requests cover, exponential lengths of mean
    `mean_s`). A pause starting at s of length d holds everything the engine would do after s until
    s + d: a request in flight across it waits all of it, one arriving during it the rest of it
    (s + d - arrival). Unserved requests (NaN times): 0."""
    to_first, to_finish = np.zeros(len(arrival)), np.zeros(len(arrival))
    served = np.isfinite(finish) & np.isfinite(first_token)
    for r in np.unique(replica[served]):
        mine = np.flatnonzero(served & (replica == r))
        lo, hi = float(arrival[mine].min()), float(finish[mine].max())
        k = int(rng.poisson(rate_per_s * (hi - lo)))
        at = np.sort(rng.uniform(lo, hi, k))
        length = rng.exponential(mean_s, k)
        cum = np.concatenate(([0.0], np.cumsum(length)))
        a = arrival[mine]
        after = np.searchsorted(at, a, side="right")  # the pauses starting after each arrival
        start = cum[after]
        # the pause under way when the request arrived (the last one starting before it), its rest
        last = after - 1
        rest = np.where(last >= 0, np.maximum(0.0, at[np.maximum(last, 0)] + length[np.maximum(last, 0)] - a), 0.0) \
            if k else np.zeros(len(mine))
        to_first[mine] = cum[np.searchsorted(at, first_token[mine], side="right")] - start + rest
        to_finish[mine] = cum[np.searchsorted(at, finish[mine], side="right")] - start + rest
    return to_first, to_finish


def scheduling_lag(arrival: np.ndarray, first_scheduled: np.ndarray, replica: np.ndarray,
                   steps: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
                   durations: np.ndarray) -> np.ndarray:
    """Per request: if it arrived while the iteration before its first one was running (so that,
    scheduled one iteration ahead, it would have joined one iteration later), the length of that
    iteration, else 0. A request's first iteration always starts a row of steps.csv (an arrival
    cuts a fast-forwarded run), so the iteration before it is the last of the row before."""
    rep, start, total, count = steps
    first = np.concatenate(([0], np.cumsum(count)[:-1])).astype(np.int64)  # row -> its first iteration
    last_len = durations[first + count - 1]
    end = start + total
    lag = np.zeros(len(arrival))
    for r in np.unique(rep):
        rows = np.flatnonzero(rep == r)
        mine = np.flatnonzero((replica == r) & ~np.isnan(first_scheduled))
        if not len(mine) or not len(rows):
            continue
        s = start[rows]
        j = np.searchsorted(s, first_scheduled[mine])  # the row that starts at first_scheduled
        j = np.minimum(j, len(rows) - 1)
        found = s[j] == first_scheduled[mine]
        prev = j - 1
        has_prev = found & (prev >= 0)
        p = rows[np.maximum(prev, 0)]
        # the previous row ran right up to this one (busy), and its last iteration started before
        # the request arrived
        busy = has_prev & np.isclose(end[p], first_scheduled[mine], rtol=0, atol=1e-12)
        arrived_mid = arrival[mine] > end[p] - last_len[p]
        hit = busy & arrived_mid
        lag[mine[hit]] = last_len[p[hit]]
    return lag


def parse_overheads(options: dict, defaults: EngineOverheads, where: str) -> EngineOverheads:
    """`defaults` with the scenario's `cost_model.measured` overhead keys applied (numbers checked
    by the caller; async_scheduling here)."""
    given = {f.name: options[f.name] for f in fields(EngineOverheads) if f.name in options}
    if "async_scheduling" in given and not isinstance(given["async_scheduling"], bool):
        raise ScenarioError(f"{where}.async_scheduling: must be true or false, got {given['async_scheduling']!r}")
    return replace(defaults, **given)


OVERHEAD_KEYS = tuple(f.name for f in fields(EngineOverheads))
# the terms on request times only (the others change an iteration's length)
REQUEST_KEYS = ("frontend_s", "frontend_per_prompt_token_s", "async_scheduling", "frontend_cv",
                "stall_rate_per_s", "stall_s")
# what a profile of whole timed engine iterations (v1: their host work in them) can carry: the request
# terms, and what a server adds to each iteration beyond the engine timed (e.g. sending each step's
# tokens to a separate API-server process); not the host floor, which the iterations already hold
WHOLE_ITERATION_KEYS = (*REQUEST_KEYS, "per_iteration_s", "tp_sync_per_iteration_s")


# The defaults for kernel-table (measured) step costs: fitted to real vLLM V1 serving on H100 by
# `python bench/fidelity.py --fit --write` (its figures and provenance in the file).
DEFAULTS_FILE = Path(__file__).resolve().parents[1] / "profiles" / "vllm_v1_overheads.yaml"


@lru_cache(maxsize=1)
def _defaults_doc() -> dict:
    return yaml.safe_load(DEFAULTS_FILE.read_text())


def default_overheads() -> EngineOverheads:
    """The fitted defaults (DEFAULTS_FILE's `overheads`)."""
    return overheads_from_mapping(_defaults_doc()["overheads"], str(DEFAULTS_FILE))


def overheads_from_mapping(values, where: str, allowed: tuple[str, ...] = OVERHEAD_KEYS) -> EngineOverheads:
    """An EngineOverheads from a mapping of its fields (a profile's or the defaults file's), keys
    among `allowed`."""
    if not isinstance(values, dict) or not set(values) <= set(allowed):
        raise ScenarioError(f"{where}: overheads must be a mapping with keys among {', '.join(allowed)}")
    out: dict[str, Any] = {}
    for k, v in values.items():
        if k == "async_scheduling":
            if not isinstance(v, bool):
                raise ScenarioError(f"{where}: overheads.{k}: must be true or false, got {v!r}")
        elif isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 10:
            raise ScenarioError(f"{where}: overheads.{k}: must be seconds in [0, 10), got {v!r}")
        out[k] = v if k == "async_scheduling" else float(v)
    return EngineOverheads(**out)


def check_serving_error(band: Any, where: str) -> dict:
    """A profile's `metadata.serving_error` (calibrate --from-bench: its error against the user's
    server, the plan's band): slower >= 1, faster in (0, 1], basis text."""
    ok = (isinstance(band, dict) and set(band) == {"slower", "faster", "basis"}
          and all(isinstance(band[k], (int, float)) and not isinstance(band[k], bool) for k in ("slower", "faster"))
          and 1 <= band["slower"] < 10 and 0 < band["faster"] <= 1 and isinstance(band["basis"], str))
    if not ok:
        raise ScenarioError(f"{where}: must be a mapping of slower (>= 1), faster (in (0, 1]) and basis (text)")
    return band
