"""Step costs: how long one engine iteration (one forward pass) of a batch takes, the per-iteration
half of the cost models (sim/cost/registry.py parses a scenario's `cost_model` and builds one of these).

Every model is called ~1e5-1e6 times per run, so per-call work is a handful of float operations
on constants precomputed in __init__; `steps > 1` (decode fast-forward) is one numpy expression.
Compiled by mypyc with the engine (setup.py); the source stays the reference.
"""
from __future__ import annotations

from dataclasses import dataclass
from operator import mul
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from mypy_extensions import mypyc_attr

from sim.cost.batch import BatchStats, WindowedBatchStats
from sim.presets.hardware import HardwareSpec
from sim.presets.memory import kv_bytes_per_token_per_rank
from sim.presets.models import ModelSpec


class CostModel(Protocol):
    """What the engine asks a cost model (sim/runtime/fast_forward.Runner). Only step_times is
    needed: StepCost below gives the other two from it, and `as_cost_model` adapts any object
    that has step_times alone (a plug-in)."""

    def step_times(self, stats: BatchStats, steps: int = 1) -> np.ndarray:
        """Durations in seconds of `steps` consecutive iterations of this batch; iteration j
        (0-based) has every decode's context grown by j tokens (decode_context_sum + j*num_decodes).
        steps > 1 is only asked for batches without prefill chunks."""
        ...

    def step_time(self, stats: BatchStats) -> float:
        """step_times(stats, 1)[0] without the array: the engine prices most single iterations so."""
        ...

    def decode_line(self, stats: BatchStats) -> tuple[float, float, int, int, float] | None:
        """For a batch without prefill chunks: (a, b, c, n, s) such that iteration j of its run takes
        (a + b * (c + n*j)) * s seconds (c, n whole numbers), the very floats step_times gives (a
        test); None where that is not so. The engine then walks a run's first iterations in
        Python, up to the next arrival, instead of pricing 32 with numpy."""
        ...

    def decode_times(self, stats: BatchStats, steps: int) -> list[float] | None:
        """For a batch without prefill chunks where decode_line is None: step_times(stats, steps)
        as a list of the very same floats, or None. The engine walks these the same way."""
        ...


@mypyc_attr(allow_interpreted_subclasses=True)  # (compiled: setup.py; plug-ins subclass it)
class StepCost:
    """The base of servesim's cost models: the two fast paths derived from step_times, for a model
    that has no faster way. A wrapper (ScaledCost, WindowedCost) passes each fast path of the model
    it wraps on, so wrapping never makes a run slower."""

    def step_times(self, stats: BatchStats, steps: int = 1) -> np.ndarray:
        raise NotImplementedError

    def step_time(self, stats: BatchStats) -> float:
        return float(self.step_times(stats, 1)[0])

    def decode_line(self, stats: BatchStats) -> tuple[float, float, int, int, float] | None:
        return None

    def decode_times(self, stats: BatchStats, steps: int) -> list[float] | None:
        """step_times(stats, steps) as Python floats, priced without numpy where a model can (a
        measured profile's table lookups); None: it cannot, and step_times prices the run."""
        return None


class _Plain(StepCost):
    """A cost model with step_times only (a plug-in), given the fast paths' defaults."""

    def __init__(self, inner: Any):
        self.inner = inner

    def step_times(self, stats: BatchStats, steps: int = 1) -> np.ndarray:
        return self.inner.step_times(stats, steps)


def as_cost_model(cost: Any) -> CostModel:
    """`cost` itself if it has both fast paths, else `cost` with their defaults."""
    if isinstance(cost, StepCost) or all(hasattr(cost, k) for k in ("step_time", "decode_line", "decode_times")):
        return cost
    return _Plain(cost)


def prefill_attention_work(stats: BatchStats) -> float:
    """Sum over prefill chunks of chunk x context + chunk^2 / 2: (query, key) pairs of causal
    attention, the unit of the profile's `prefill_attention_work` coefficient."""
    # Python ints: whole token counts far below 2**53, so this equals numpy's float64 dot exactly.
    lens, contexts = stats.prefill_lens.tolist(), stats.prefill_contexts.tolist()
    return float(sum(c * x for c, x in zip(lens, contexts))) + 0.5 * float(sum(c * c for c in lens))


def _context_sum(stats: Any) -> Any:
    """stats.decode_context_sum as it is: an int from a scheduler, a float from WindowedCost (the
    layer-averaged sum), which compiled code would refuse as BatchStats' annotated int."""
    return stats.decode_context_sum


class WindowedCost(StepCost):
    """A sliding-window model's attention: `fraction` of the layers attend at most `window` tokens
    (their query at position p: min(p + 1, window) keys), the rest everything. Attention work is
    linear in the keys attended in each layer, so the wrapped model (built for full attention)
    sees the layer-averaged context: decode sums (1 - f) x full + f x windowed, growing by
    n - f x capped per iteration; each prefill chunk's context lowered so its causal pairs equal
    the average (floored at 0, which over-prices chunks much longer than the window)."""

    def __init__(self, inner: CostModel, fraction: float, window: int):
        self.inner, self.fraction, self.window = as_cost_model(inner), fraction, window

    def step_times(self, stats: BatchStats, steps: int = 1) -> np.ndarray:
        return self.inner.step_times(self.attended(stats), steps)

    def step_time(self, stats: BatchStats) -> float:
        return self.inner.step_time(self.attended(stats))

    def decode_line(self, stats: BatchStats) -> tuple[float, float, int, int, float] | None:
        return self.inner.decode_line(self.attended(stats))

    def decode_times(self, stats: BatchStats, steps: int) -> list[float] | None:
        return self.inner.decode_times(self.attended(stats), steps)

    def attended(self, stats: BatchStats) -> BatchStats:
        f, w = self.fraction, self.window
        contexts = stats.prefill_contexts
        # Any: an int left as it is, a float where the window lowers it (compiled, a float-typed
        # local would turn the int into a float); WindowedBatchStats is built at run time
        context_sum: Any = stats.decode_context_sum
        growth: Any = None
        windowed: Any = stats
        if stats.num_decodes and isinstance(windowed, WindowedBatchStats):  # (static batching: full KV)
            context_sum = (1 - f) * windowed.decode_context_sum + f * windowed.decode_window_sum
            growth = windowed.num_decodes - f * windowed.decode_capped
        if len(stats.prefill_lens):
            x = stats.prefill_lens.astype(np.float64)
            c = contexts.astype(np.float64)
            k = np.clip(w - c, 0, x)  # queries still inside the window: they attend c + i keys
            cut = (x * c + x * (x + 1) / 2) - (k * c + k * (k + 1) / 2 + (x - k) * w)
            contexts = np.maximum(c - f * cut / x, 0.0)
        elif growth is None:
            return stats
        # (built, not dataclasses.replace: this runs every iteration)
        return WindowedBatchStats(stats.prefill_lens, contexts, stats.num_decodes, context_sum,
                                  stats.padded_tokens, stats.draft_seqs, stats.draft_context_sum,
                                  decode_context_growth=growth)


class ScaledCost(StepCost):
    """Another model's step times x `factor`: what the planner simulates to carry a profile's
    measured error (held-out MAPE) into its answer."""

    def __init__(self, inner: CostModel, factor: float):
        self.inner, self.factor = as_cost_model(inner), factor

    def step_times(self, stats: BatchStats, steps: int = 1) -> np.ndarray:
        return self.inner.step_times(stats, steps) * self.factor

    def step_time(self, stats: BatchStats) -> float:
        return self.inner.step_time(stats) * self.factor  # (one float64 product, as above)

    def decode_line(self, stats: BatchStats) -> tuple[float, float, int, int, float] | None:
        line = self.inner.decode_line(stats)
        if line is None or line[4] != 1.0:  # (a scale of a scale would round twice: priced, not walked)
            return None
        a, b, c, n, _ = line
        return a, b, c, n, self.factor

    def decode_times(self, stats: BatchStats, steps: int) -> list[float] | None:
        times = self.inner.decode_times(stats, steps)
        if times is None:
            return None
        f = self.factor
        return [t * f for t in times]  # (step_times' array x factor, element by element)


class UnitCost(StepCost):
    """Every iteration costs 1.0, so simulated time counts iterations."""

    def step_times(self, stats: BatchStats, steps: int = 1) -> np.ndarray:
        return np.ones(steps)


class RooflineCost(StepCost):
    """Per layer group, time = max(FLOPs / (peak x eff), bytes / (bandwidth x eff)), summed over
    groups (no overlap between groups), plus TP all-reduces and a CPU overhead per iteration.
    Groups: linear layers + lm_head; prefill attention; decode attention. All per TP rank."""

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, tensor_parallel_size: int = 1, *,
                 compute_efficiency: float = 0.7, bandwidth_efficiency: float = 0.85,
                 interconnect_efficiency: float = 0.7, allreduce_latency_s: float = 10e-6,
                 overhead_s: float = 2e-3, overhead_per_seq_s: float = 5e-6, kv_cache_dtype: str = "auto",
                 data_parallel_size: int = 1):
        """`data_parallel_size` D > 1: one of D data-parallel ranks whose GPUs share the routed
        experts (expert parallelism over D x tp GPUs): each GPU reads 1/(D x tp) of them, touched by
        the tokens of every rank (D x its own, the ranks taken as equally loaded)."""
        tp = tensor_parallel_size
        flop_s = hardware.bf16_flops * compute_efficiency          # FLOP/s achieved
        byte_s = hardware.hbm_bandwidth * bandwidth_efficiency     # B/s achieved
        head_params = model.vocab_size * model.hidden_size
        layer_params = model.num_layers * model.layer_matmul_params  # MoE: the experts a token uses
        # fp8 weights run the layers' GEMMs at the fp8 peak where the GPU has one
        fp8 = model.linear_weight_bytes == 1 and hardware.fp8_flops > 0
        linear_flop_s = hardware.fp8_flops * compute_efficiency if fp8 else flop_s
        # Linear layers: 2 FLOPs per weight per token; lm_head only for one token per sequence.
        self._s_per_token = 2 * layer_params / tp / linear_flop_s
        self._s_per_seq_logits = 2 * head_params / tp / flop_s
        # Every weight is read once per iteration; the embedding only gathers rows (ignored).
        self._weight_read_s = (layer_params + head_params) / tp * model.dtype_bytes / byte_s
        self._moe = None
        self._moe_tokens = data_parallel_size  # tokens routed to a GPU's experts per token of its own
        if model.moe is not None or model.linear_weight_bytes is not None:
            # Non-expert weights every iteration; routed experts only those the batch touches:
            # with T tokens each routed to k of E experts, independently and uniformly (the
            # expectation used), a layer reads E x (1 - (1 - k/E)^T) distinct experts.
            wbytes, m, routed = model.linear_bytes_per_weight, model.moe, model.routed_expert_params
            fixed = (model.linear_params_total - routed) * wbytes + head_params * model.dtype_bytes
            self._weight_read_s = fixed / tp / byte_s
            if m is not None:
                self._moe = (routed * model.expert_bytes_per_weight / tp / data_parallel_size / byte_s,
                             1 - m.experts_per_token / m.num_experts)
        # Attention: QK^T and PV, 2 + 2 FLOPs per (query, key) pair per head per head_dim; MLA
        # (absorbed, as vLLM runs it) over the latent: QK on kv_lora_rank + rope dims, PV on kv_lora_rank.
        q_heads = model.num_attention_heads // tp
        per_head = 4 * model.head_dim if model.mla is None else (
            2 * (model.mla.kv_lora_rank + model.mla.qk_rope_head_dim) + 2 * model.mla.kv_lora_rank)
        # (softmax attention's layers only: a hybrid's linear-attention layers are LinearAttentionCost's)
        self._s_per_pair = (4 * model.attention_layers * q_heads * model.head_dim / flop_s if model.mla is None
                            else model.attention_layers * q_heads * per_head / flop_s)
        # KV reads at the cache's dtype (engine.kv_cache_dtype: fp8 halves them)
        self._s_per_kv_token = kv_bytes_per_token_per_rank(model, tp, kv_cache_dtype) / byte_s
        # Ring all-reduce of the hidden state, twice per layer (after attention and after MLP).
        self._allreduce_fixed_s = 0.0
        self._allreduce_s_per_token = 0.0
        if tp > 1:
            link = hardware.interconnect_bandwidth * interconnect_efficiency
            calls = 2 * model.num_layers
            self._allreduce_fixed_s = calls * allreduce_latency_s
            self._allreduce_s_per_token = (calls * 2 * (tp - 1) / tp * model.hidden_size
                                           * model.dtype_bytes / link)
        self._overhead_s = overhead_s
        self._overhead_per_seq_s = overhead_per_seq_s
        self._decode_fixed: dict[int, float] = {}  # num_decodes -> _fixed_time of a decode-only batch

    def _fixed_time(self, stats: BatchStats) -> float:
        """Everything that does not change as decode contexts grow."""
        if not len(stats.prefill_lens):  # decode-only: a function of the batch size alone
            n = stats.num_decodes
            fixed = self._decode_fixed.get(n)
            if fixed is None:
                fixed = self._decode_fixed[n] = self._linear_time(n, n)
            return fixed
        # Python ints, not numpy calls on a handful of chunks: every sum below is a whole number of
        # tokens far below 2**53, so float() of it equals numpy's float64 dot product exactly.
        lens: list[int] = stats.prefill_lens.tolist()
        contexts = stats.prefill_contexts.tolist()  # (ints; floats behind a sliding window)
        if len(lens) == 1:  # (most iterations: one chunk; the sums below of one term, unrolled)
            tokens = lens[0]
            context = contexts[0]
            cross, square = tokens * context, tokens * tokens
        else:
            tokens = sum(lens)
            context = sum(contexts)
            cross, square = sum(map(mul, lens, contexts)), sum(map(mul, lens, lens))
        t = self._linear_time(tokens + stats.num_decodes, len(lens) + stats.num_decodes)
        # causal: sum of c x context + c (c + 1) / 2, as sums of ints (map: no Python loop)
        pairs = float(cross) + 0.5 * float(square + tokens)
        # Read the cached context, write and read back the chunk's own K and V.
        kv_tokens = float(context) + 2.0 * float(tokens)
        return t + max(self._s_per_pair * pairs, self._s_per_kv_token * kv_tokens)

    def _linear_time(self, tokens: int, seqs: int) -> float:
        """Seconds of the linear layers, all-reduces and CPU overhead for this many tokens/seqs."""
        read = self._weight_read_s
        if self._moe is not None:
            experts_s, miss = self._moe
            read += experts_s * (1 - miss ** (tokens * self._moe_tokens))
        linear = max(self._s_per_token * tokens + self._s_per_seq_logits * seqs, read)
        return (self._overhead_s + self._overhead_per_seq_s * seqs + linear
                + self._allreduce_fixed_s + self._allreduce_s_per_token * tokens)

    def step_time(self, stats: BatchStats) -> float:
        """One iteration: step_times(stats, 1)[0]."""
        fixed = self._fixed_time(stats)
        n = stats.num_decodes
        if n == 0:
            return fixed
        # Decode attention reads each context token's K and V once and writes one new token each.
        ctx = float(_context_sum(stats))
        return fixed + max(self._s_per_pair * ctx, self._s_per_kv_token * (ctx + n))

    def step_times(self, stats: BatchStats, steps: int = 1) -> np.ndarray:
        if steps == 1:
            return np.array([self.step_time(stats)])
        fixed = self._fixed_time(stats)
        n = stats.num_decodes
        if n == 0:
            return np.full(steps, fixed)
        c0, g = _context_sum(stats), stats.decode_context_growth
        if g is None:  # iteration j's context sum is c0 + j*n: whole numbers, so arange is exact
            one = self._one_term(fixed, c0, n, steps)
            if one is not None:
                return one
            contexts = np.arange(c0, c0 + n * steps, n, dtype=np.float64)
        else:
            contexts = c0 + g * np.arange(steps, dtype=np.float64)
        return fixed + np.maximum(self._s_per_pair * contexts, self._s_per_kv_token * (contexts + n))

    def decode_line(self, stats: BatchStats) -> tuple[float, float, int, int, float] | None:
        """(fixed, s_per_kv_token, context + n, n, 1.0) when the KV reads are the larger attention term
        at any context (see _one_term): iteration j takes fixed + s_per_kv_token x (c + n + j n)."""
        n = stats.num_decodes
        if not n or len(stats.prefill_lens) or stats.decode_context_growth is not None \
                or self._s_per_kv_token < 2 * self._s_per_pair:
            return None
        return self._fixed_time(stats), self._s_per_kv_token, stats.decode_context_sum + n, n, 1.0

    def _one_term(self, fixed: float, ctx: int, n: int, steps: int) -> np.ndarray | None:
        """The run's durations when one attention term is the larger in every iteration (None
        otherwise): fixed + that term, the same floats as the max of both in three numpy calls
        instead of six (a run is priced every other event). Both terms are linear in the context,
        so their difference is too: if one is larger at both ends of the run by more than any
        rounding of either (|error| <= 2^-53 of a term, here 1e-12 of the two at the run's end,
        the larger), it is the larger in between as well, rounded or not."""
        sp, sk, last = self._s_per_pair, self._s_per_kv_token, ctx + n * (steps - 1)
        if sk >= 2 * sp:  # (decode on a GPU: ~60x) reads >= twice the pairs at any context, since
            # c + n > c: larger in every iteration, each rounded (2^-53) or not; no ends to check
            out = np.arange(ctx + n, last + 2 * n, n, dtype=np.float64)  # c + n, whole numbers
            out *= sk
            out += fixed
            return out
        pair0, pair1 = sp * float(ctx), sp * float(last)
        read0, read1 = sk * float(ctx + n), sk * float(last + n)
        margin = 1e-12 * (pair1 + read1)
        if read0 - pair0 > margin and read1 - pair1 > margin:  # memory-bound: KV reads (decode)
            out = np.arange(ctx + n, last + 2 * n, n, dtype=np.float64)  # c + n, whole numbers
            out *= sk
        elif pair0 - read0 > margin and pair1 - read1 > margin:  # compute-bound
            out = np.arange(ctx, last + n, n, dtype=np.float64)
            out *= sp
        else:
            return None
        out += fixed
        return out


@dataclass(frozen=True)
class StepProfile:
    """A fitted step-cost model read from a profile YAML (written by calibrate/fit.py)."""
    knots: np.ndarray               # total tokens per iteration, strictly increasing, >= 0
    seconds: np.ndarray             # piecewise-linear time at each knot, non-decreasing, >= 0
    intercept: float                # seconds per iteration
    decode_context_sum: float       # seconds per decode context token
    prefill_attention_work: float   # seconds per unit of prefill_attention_work()
    num_seqs: float                 # seconds per sequence in the batch
    metadata: dict
    source: Path
    sha256: str = ""                # of the file's bytes, for summary.json's provenance
    # the engine overheads on top (sim/cost/overheads.py's EngineOverheads, WHOLE_ITERATION_KEYS:
    # request handling, the scheduling lag, a server's per-iteration time; never the hidden host
    # floor, the timed iterations holding the host work), where the profile carries them
    # (calibrate --from-bench --profile); None: none
    overheads: Any = None

    def __reduce__(self) -> tuple:
        # Rebuilt through __init__ when pickled (the planner sends scenarios to worker processes):
        # compiled by mypyc, the default pickling sets each field with setattr, which a frozen
        # dataclass refuses (FrozenInstanceError: `servesim plan` on a fitted profile crashed).
        return (StepProfile, (self.knots, self.seconds, self.intercept, self.decode_context_sum,
                              self.prefill_attention_work, self.num_seqs, self.metadata, self.source,
                              self.sha256, self.overheads))

    def tokens_time(self, tokens: float) -> float:
        """Piecewise-linear in total tokens; past the last knot, the last segment continues."""
        k, s = self.knots, self.seconds
        if tokens <= k[-1]:
            return float(np.interp(tokens, k, s))
        slope = (s[-1] - s[-2]) / (k[-1] - k[-2])
        return float(s[-1] + slope * (tokens - k[-1]))


class ProfileCost(StepCost):
    """t = intercept + f(total_tokens) + a x decode_context_sum + b x prefill_attention_work
    + c x num_seqs (+ adder), with f monotone piecewise-linear and a, b, c >= 0. `adder` (s): what a
    server adds to every iteration that the profile's timed iterations did not hold (the profile's
    engine_overheads: per_iteration_s, and tp_sync_per_iteration_s at TP > 1)."""

    def __init__(self, profile: StepProfile, adder: float = 0.0):
        self.profile = profile
        self._adder = adder
        self._tokens_time: dict[int, float] = {}  # total tokens -> profile.tokens_time (np.interp)

    def step_time(self, stats: BatchStats) -> float:
        """One iteration: step_times(stats, 1)[0]."""
        p = self.profile
        tokens = stats.total_tokens
        tokens_time = self._tokens_time.get(tokens)
        if tokens_time is None:
            tokens_time = self._tokens_time[tokens] = p.tokens_time(tokens)
        t = (p.intercept + tokens_time + p.num_seqs * stats.num_seqs
             + p.decode_context_sum * _context_sum(stats))
        if len(stats.prefill_lens):
            t += p.prefill_attention_work * prefill_attention_work(stats)
        if self._adder:  # (only then: a profile without one prices to the same floats as before)
            t += self._adder
        return t

    def step_times(self, stats: BatchStats, steps: int = 1) -> np.ndarray:
        t = self.step_time(stats)
        if steps == 1:
            return np.array([t])
        g = stats.decode_context_growth
        growth = self.profile.decode_context_sum * (stats.num_decodes if g is None else g)  # s per step
        return t + growth * np.arange(steps, dtype=np.float64)

    def decode_line(self, stats: BatchStats) -> tuple[float, float, int, int, float] | None:
        """(t, growth, 0, 1, 1.0): iteration j of a decode run takes t + growth x j, as step_times."""
        if len(stats.prefill_lens) or not stats.num_decodes:
            return None
        t = self.step_time(stats)
        g = stats.decode_context_growth
        return t, self.profile.decode_context_sum * (stats.num_decodes if g is None else g), 0, 1, 1.0
