"""Step-cost models: how long one engine iteration (one forward pass) of a batch takes.

CONTRACT (owned by the cost-model engineer):
    CostModel Protocol: step_times(stats, steps=1) -> np.ndarray of seconds, shape [steps].
    COST_MODELS = {name: CostModelKind(option checker, builder, ..., measured?, summary)}
    parse_cost_model(spec, model, hardware, tensor_parallel_size, where="") -> CostModelSpec
        spec: "unit" | "roofline" | {"roofline": {constant: value}} | {"profile": Path}
    CostModelSpec.build(model, hardware, tensor_parallel_size) -> CostModel (no file I/O)
    load_profile(path, where="") -> StepProfile   (format: docs/cost_models.md)

Every model is called ~1e5-1e6 times per run, so per-call work is a handful of float operations
on constants precomputed in __init__; `steps > 1` (decode fast-forward) is one numpy expression.
"""
from __future__ import annotations

import hashlib
import math
from operator import mul
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .batch import BatchStats, WindowedBatchStats
from .checks import MAX_STEP_SECONDS, _num, _section, check_input_file, load_yaml
from . import measured
from .errors import ScenarioError
from .hardware import HardwareSpec
from .memory import kv_bytes_per_token_per_rank
from .models import ModelSpec

PROFILE_FORMAT = "servesim-step-profile/v1"


class CostModel(Protocol):
    def step_times(self, stats: BatchStats, steps: int = 1) -> np.ndarray:
        """Durations in seconds of `steps` consecutive iterations of this batch; iteration j
        (0-based) has every decode's context grown by j tokens (decode_context_sum + j*num_decodes).
        steps > 1 is only asked for batches without prefill chunks."""
        ...

    # Optional: decode_line(stats) -> (a, b, c, n) | None, for a batch without prefill chunks:
    # iteration j of its run takes a + b * (c + n*j) seconds (c, n whole numbers), the very floats
    # step_times gives (a test); None where that is not so. The engine then walks a run's first
    # iterations in Python, up to the next arrival, instead of pricing 32 with numpy
    # (sim/fast_forward.Runner).


def _fail(where: str, msg: str) -> ScenarioError:
    return ScenarioError(f"{where}: {msg}" if where else msg)


def prefill_attention_work(stats: BatchStats) -> float:
    """Sum over prefill chunks of chunk x context + chunk^2 / 2: (query, key) pairs of causal
    attention, the unit of the profile's `prefill_attention_work` coefficient."""
    # Python ints: whole token counts far below 2**53, so this equals numpy's float64 dot exactly.
    lens, contexts = stats.prefill_lens.tolist(), stats.prefill_contexts.tolist()
    return float(sum(c * x for c, x in zip(lens, contexts))) + 0.5 * float(sum(c * c for c in lens))


class WindowedCost:
    """A sliding-window model's attention: `fraction` of the layers attend at most `window` tokens
    (their query at position p: min(p + 1, window) keys), the rest everything. Attention work is
    linear in the keys attended in each layer, so the wrapped model (built for full attention)
    sees the layer-averaged context: decode sums (1 - f) x full + f x windowed, growing by
    n - f x capped per iteration; each prefill chunk's context lowered so its causal pairs equal
    the average (floored at 0, which over-prices chunks much longer than the window)."""

    def __init__(self, inner: CostModel, fraction: float, window: int):
        self.inner, self.fraction, self.window = inner, fraction, window

    def step_times(self, stats: BatchStats, steps: int = 1) -> np.ndarray:
        return self.inner.step_times(self.attended(stats), steps)

    def attended(self, stats: BatchStats) -> BatchStats:
        f, w = self.fraction, self.window
        contexts, context_sum, growth = stats.prefill_contexts, stats.decode_context_sum, None
        if stats.num_decodes and isinstance(stats, WindowedBatchStats):  # (static batching: full KV)
            context_sum = (1 - f) * stats.decode_context_sum + f * stats.decode_window_sum
            growth = stats.num_decodes - f * stats.decode_capped
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


class ScaledCost:
    """Another model's step times x `factor`: what the planner simulates to carry a profile's
    measured error (held-out MAPE) into its answer."""

    def __init__(self, inner: CostModel, factor: float):
        self.inner, self.factor = inner, factor

    def step_times(self, stats: BatchStats, steps: int = 1) -> np.ndarray:
        return self.inner.step_times(stats, steps) * self.factor


class UnitCost:
    """Every iteration costs 1.0, so simulated time counts iterations."""

    def step_times(self, stats: BatchStats, steps: int = 1) -> np.ndarray:
        return np.ones(steps)


class RooflineCost:
    """Per layer group, time = max(FLOPs / (peak x eff), bytes / (bandwidth x eff)), summed over
    groups (no overlap between groups), plus TP all-reduces and a CPU overhead per iteration.
    Groups: linear layers + lm_head; prefill attention; decode attention. All per TP rank."""

    def __init__(self, model: ModelSpec, hardware: HardwareSpec, tensor_parallel_size: int = 1, *,
                 compute_efficiency: float = 0.7, bandwidth_efficiency: float = 0.85,
                 interconnect_efficiency: float = 0.7, allreduce_latency_s: float = 10e-6,
                 overhead_s: float = 2e-3, overhead_per_seq_s: float = 5e-6, kv_cache_dtype: str = "auto"):
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
        if model.moe is not None or model.linear_weight_bytes is not None:
            # Non-expert weights every iteration; routed experts only those the batch touches:
            # with T tokens each routed to k of E experts, independently and uniformly (the
            # expectation used), a layer reads E x (1 - (1 - k/E)^T) distinct experts.
            wbytes, m, routed = model.linear_bytes_per_weight, model.moe, model.routed_expert_params
            fixed = (model.linear_params_total - routed) * wbytes + head_params * model.dtype_bytes
            self._weight_read_s = fixed / tp / byte_s
            if m is not None:
                self._moe = (routed * model.expert_bytes_per_weight / tp / byte_s,
                             1 - m.experts_per_token / m.num_experts)
        # Attention: QK^T and PV, 2 + 2 FLOPs per (query, key) pair per head per head_dim; MLA
        # (absorbed, as vLLM runs it) over the latent: QK on kv_lora_rank + rope dims, PV on kv_lora_rank.
        q_heads = model.num_attention_heads // tp
        per_head = 4 * model.head_dim if model.mla is None else (
            2 * (model.mla.kv_lora_rank + model.mla.qk_rope_head_dim) + 2 * model.mla.kv_lora_rank)
        self._s_per_pair = (4 * model.num_layers * q_heads * model.head_dim / flop_s if model.mla is None
                            else model.num_layers * q_heads * per_head / flop_s)
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
        lens, contexts = stats.prefill_lens.tolist(), stats.prefill_contexts.tolist()
        tokens = sum(lens)
        t = self._linear_time(tokens + stats.num_decodes, len(lens) + stats.num_decodes)
        # causal: sum of c x context + c (c + 1) / 2, as sums of ints (map: no Python loop)
        pairs = float(sum(map(mul, lens, contexts))) + 0.5 * float(sum(map(mul, lens, lens)) + tokens)
        # Read the cached context, write and read back the chunk's own K and V.
        kv_tokens = float(sum(contexts)) + 2.0 * float(tokens)
        return t + max(self._s_per_pair * pairs, self._s_per_kv_token * kv_tokens)

    def _linear_time(self, tokens: int, seqs: int) -> float:
        """Seconds of the linear layers, all-reduces and CPU overhead for this many tokens/seqs."""
        read = self._weight_read_s
        if self._moe is not None:
            experts_s, miss = self._moe
            read += experts_s * (1 - miss ** tokens)
        linear = max(self._s_per_token * tokens + self._s_per_seq_logits * seqs, read)
        return (self._overhead_s + self._overhead_per_seq_s * seqs + linear
                + self._allreduce_fixed_s + self._allreduce_s_per_token * tokens)

    def step_times(self, stats: BatchStats, steps: int = 1) -> np.ndarray:
        fixed = self._fixed_time(stats)
        n = stats.num_decodes
        if n == 0:
            return np.full(steps, fixed)
        # Decode attention reads each context token's K and V once and writes one new token each.
        if steps == 1:
            ctx = float(stats.decode_context_sum)
            return np.array([fixed + max(self._s_per_pair * ctx,
                                         self._s_per_kv_token * (ctx + n))])
        ctx, g = stats.decode_context_sum, stats.decode_context_growth
        if g is None:  # iteration j's context sum is ctx + j*n: whole numbers, so arange is exact
            one = self._one_term(fixed, ctx, n, steps)
            if one is not None:
                return one
            contexts = np.arange(ctx, ctx + n * steps, n, dtype=np.float64)
        else:
            contexts = ctx + g * np.arange(steps, dtype=np.float64)
        return fixed + np.maximum(self._s_per_pair * contexts, self._s_per_kv_token * (contexts + n))

    def decode_line(self, stats: BatchStats) -> tuple[float, float, int, int] | None:
        """(fixed, s_per_kv_token, context + n, n) when the KV reads are the larger attention term
        at any context (see _one_term): iteration j takes fixed + s_per_kv_token x (c + n + j n)."""
        n = stats.num_decodes
        if not n or len(stats.prefill_lens) or stats.decode_context_growth is not None \
                or self._s_per_kv_token < 2 * self._s_per_pair:
            return None
        return self._fixed_time(stats), self._s_per_kv_token, stats.decode_context_sum + n, n

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

    def tokens_time(self, tokens: float) -> float:
        """Piecewise-linear in total tokens; past the last knot, the last segment continues."""
        k, s = self.knots, self.seconds
        if tokens <= k[-1]:
            return float(np.interp(tokens, k, s))
        slope = (s[-1] - s[-2]) / (k[-1] - k[-2])
        return float(s[-1] + slope * (tokens - k[-1]))


class ProfileCost:
    """t = intercept + f(total_tokens) + a x decode_context_sum + b x prefill_attention_work
    + c x num_seqs, with f monotone piecewise-linear and a, b, c >= 0."""

    def __init__(self, profile: StepProfile):
        self.profile = profile
        self._tokens_time: dict[int, float] = {}  # total tokens -> profile.tokens_time (np.interp)

    @classmethod
    def from_file(cls, path: Path, where: str = "") -> "ProfileCost":
        return cls(load_profile(path, where))

    def step_times(self, stats: BatchStats, steps: int = 1) -> np.ndarray:
        p = self.profile
        tokens = stats.total_tokens
        tokens_time = self._tokens_time.get(tokens)
        if tokens_time is None:
            tokens_time = self._tokens_time[tokens] = p.tokens_time(tokens)
        t = (p.intercept + tokens_time + p.num_seqs * stats.num_seqs
             + p.decode_context_sum * stats.decode_context_sum)
        if len(stats.prefill_lens):
            t += p.prefill_attention_work * prefill_attention_work(stats)
        if steps == 1:
            return np.array([t])
        g = stats.decode_context_growth
        growth = p.decode_context_sum * (stats.num_decodes if g is None else g)  # seconds added per step
        return t + growth * np.arange(steps, dtype=np.float64)

    def decode_line(self, stats: BatchStats) -> tuple[float, float, int, int] | None:
        """(t, growth, 0, 1): iteration j of a decode run takes t + growth x j, as step_times."""
        if len(stats.prefill_lens) or not stats.num_decodes:
            return None
        t = float(self.step_times(stats, 1)[0])
        g = stats.decode_context_growth
        return t, self.profile.decode_context_sum * (stats.num_decodes if g is None else g), 0, 1


# ---- profile YAML parsing (format documented in docs/cost_models.md) ----

_META_REQUIRED = ("device", "model", "dtype", "tensor_parallel_size", "measured")
_META_OPTIONAL = ("torch", "triton", "date", "grid", "heldout_mape", "heldout_max_error", "notes")
_TERMS = ("intercept", "total_tokens", "decode_context_sum", "prefill_attention_work", "num_seqs")


def _keys(value: Any, where: str, required: tuple, optional: tuple = ()) -> dict:
    allowed = required + optional
    if not isinstance(value, dict):
        raise _fail(where, f"must be a mapping with keys {', '.join(allowed)}")
    unknown = sorted(set(value) - set(allowed), key=str)
    if unknown:
        raise _fail(where, f"unknown key {unknown[0]!r}; allowed: {', '.join(allowed)}")
    missing = [k for k in required if k not in value]
    if missing:
        raise _fail(where, f"missing key {missing[0]!r}; required: {', '.join(required)}")
    return value


def _nonneg(value: Any, where: str) -> float:
    if isinstance(value, str):  # PyYAML reads 6e-11 (no dot) as a string
        try:
            value = float(value)
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _fail(where, f"must be a finite number, got {value!r}")
    if value < 0:
        raise _fail(where, f"must be >= 0, got {value!r}")
    return float(value)


def _check_metadata(meta: Any, where: str) -> dict:
    # attention (backend name) and time_split_ms (free-form, like grid): optional, added after v1
    # shipped; older files kept them under grid and still load.
    meta = _keys(meta, where, _META_REQUIRED, (*_META_OPTIONAL, "attention", "time_split_ms"))
    for key in ("device", "model", "dtype"):
        if not isinstance(meta[key], str) or not meta[key]:
            raise _fail(f"{where}.{key}", f"must be a non-empty string, got {meta[key]!r}")
    tp = meta["tensor_parallel_size"]
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise _fail(f"{where}.tensor_parallel_size", f"must be a positive integer, got {tp!r}")
    if not isinstance(meta["measured"], bool):
        raise _fail(f"{where}.measured", f"must be true or false, got {meta['measured']!r}")
    for key in ("heldout_mape", "heldout_max_error"):
        if meta.get(key) is not None:
            _nonneg(meta[key], f"{where}.{key}")
    if meta.get("attention") is not None and not isinstance(meta["attention"], str):
        raise _fail(f"{where}.attention", f"must be a string, got {meta['attention']!r}")
    if meta.get("time_split_ms") is not None and not isinstance(meta["time_split_ms"], dict):
        raise _fail(f"{where}.time_split_ms", f"must be a mapping, got {meta['time_split_ms']!r}")
    return meta


def _check_curve(curve: Any, where: str) -> tuple[np.ndarray, np.ndarray]:
    curve = _keys(curve, where, ("knots", "seconds"))
    knots, secs = curve["knots"], curve["seconds"]
    for key, seq in (("knots", knots), ("seconds", secs)):
        if not isinstance(seq, list) or len(seq) < 2:
            raise _fail(f"{where}.{key}", "must be a list of at least 2 numbers")
    if len(knots) != len(secs):
        raise _fail(where, f"knots and seconds must have the same length, got {len(knots)} "
                           f"and {len(secs)}")
    k = np.array([_nonneg(v, f"{where}.knots[{i}]") for i, v in enumerate(knots)])
    s = np.array([_nonneg(v, f"{where}.seconds[{i}]") for i, v in enumerate(secs)])
    if np.any(np.diff(k) <= 0):
        raise _fail(f"{where}.knots", f"must be strictly increasing, got {knots}")
    if np.any(np.diff(s) < 0):
        raise _fail(f"{where}.seconds", f"must be non-decreasing (more tokens never cheaper), "
                                        f"got {secs}")
    return k, s


def load_profile(path: Path, where: str = ""):
    """A StepProfile (v1, fitted by calibrate/fit.py) or a TableProfile (v2, sim/measured.py)."""
    return _load_profile(path, where)


def _load_profile(path: Path, where: str = ""):
    """Read and strictly validate a step-cost profile YAML. Errors name the file and key path."""
    path = Path(path)
    if not path.exists():
        raise _fail(where, f"profile file {path} not found")
    check_input_file(path, "profile")
    try:
        data = path.read_bytes()
        doc = load_yaml(data.decode("utf-8"), str(path))
    except (OSError, UnicodeDecodeError, ScenarioError) as exc:
        problem = str(exc).splitlines()[0].removeprefix(f"{path}:").strip()
        raise ScenarioError(f"{path}: not a readable YAML file ({problem})") from None
    if isinstance(doc, dict) and doc.get("format") == measured.FORMAT:
        return measured.load_table_profile(path, doc, data)
    doc = _keys(doc, str(path), ("format", "metadata", "model"))
    if doc["format"] != PROFILE_FORMAT:
        raise ScenarioError(f"{path}: format: got {doc['format']!r}; allowed: {PROFILE_FORMAT}, "
                            f"{measured.FORMAT}")
    meta = _check_metadata(doc["metadata"], f"{path}: metadata")
    terms = _keys(doc["model"], f"{path}: model", _TERMS)
    knots, seconds = _check_curve(terms["total_tokens"], f"{path}: model.total_tokens")
    coef = {k: _nonneg(terms[k], f"{path}: model.{k}") for k in _TERMS if k != "total_tokens"}
    return StepProfile(knots=knots, seconds=seconds, metadata=meta, source=path,
                       sha256=hashlib.sha256(data).hexdigest(), **coef)


# ---- the registry: name -> how to build that model from a scenario's `cost_model` value ----

_ROOFLINE_KWARGS = ("compute_efficiency", "bandwidth_efficiency", "interconnect_efficiency",
                    "allreduce_latency_s", "overhead_s", "overhead_per_seq_s")


def _unit_options(options: Any, where: str, hardware: HardwareSpec, tp: int, model=None) -> dict:
    return {}


def _roofline_options(options: Any, where: str, hardware: HardwareSpec, tp: int, model=None) -> dict:
    at = f"{where}.roofline"
    options = _section(options, at, lambda path: path, _ROOFLINE_KWARGS)
    kwargs = {k: _num(v, f"{at}.{k}", 0, 1, open_lo=True) if k.endswith("_efficiency")
              else _num(v, f"{at}.{k}", 0, cap=MAX_STEP_SECONDS) for k, v in options.items()}
    if tp > 1 and hardware.interconnect_bandwidth <= 0:
        raise _fail(where, f"roofline needs {hardware.name}.interconnect_bandwidth > 0 for "
                           f"tensor_parallel_size={tp}")
    return kwargs


def _profile_options(options: Any, where: str, hardware: HardwareSpec, tp: int, model=None) -> dict:
    """Reads the profile now: a malformed one is a config error, not a crash mid-run."""
    profile = load_profile(Path(options), f"{where}.profile" if where else "profile")
    fitted_tp = profile.metadata["tensor_parallel_size"]
    if fitted_tp != tp:
        raise ScenarioError(f"{profile.source}: metadata.tensor_parallel_size is {fitted_tp} "
                            f"but the scenario runs tensor_parallel_size={tp}; "
                            f"use a profile fitted at that size")
    return {"profile": profile}


_MEASURED_KWARGS = ("cpu_overhead_s", "cpu_overhead_per_seq_s")


def _measured_options(options: Any, where: str, hardware: HardwareSpec, tp: int, model=None) -> dict:
    """The shipped profile of the scenario's model x GPU x TP (sim/profiles/), read now, and the
    scenario's CPU-overhead tuning."""
    options = _section(options, f"{where}.measured", lambda path: path, _MEASURED_KWARGS)
    kwargs = {k: _num(v, f"{where}.measured.{k}", 0, cap=MAX_STEP_SECONDS) for k, v in options.items()}
    from .hardware import HARDWARE_PRESETS
    from .models import MODEL_PRESETS

    # a model read from a config.json is its preset's when every field but the name agrees
    # (tests/fixtures/hf_configs/ Mixtral-8x7B is mixtral-8x7b)
    name = next((n for n, m in MODEL_PRESETS.items() if m == replace(model, name=n)), model.name)
    for spec, key, presets, what in ((model, name, MODEL_PRESETS, "model"),
                                     (hardware, hardware.name, HARDWARE_PRESETS, "GPU")):
        if presets.get(key) != replace(spec, name=key):
            raise _fail(where, f"measured: profiles are shipped for preset {what}s only, and "
                               f"{spec.name!r} is not one (or differs from it); use roofline, or "
                               f"build a profile with servesim calibrate --from-tables")
    path = measured.shipped_profile(name, hardware.name, tp)
    if path is None:
        raise _fail(where, f"measured: no shipped profile for {model.name} on {hardware.name} at "
                           f"tensor_parallel_size={tp} ({shipped_summary()}); use roofline, or "
                           f"build one with servesim calibrate --from-tables")
    return {"profile": load_profile(path, f"{where}.measured"), **kwargs}


def shipped_summary() -> str:
    index = measured.shipped_index()
    return "; ".join(f"{hw}: " + ", ".join(f"{m} tp{'/'.join(map(str, tps))}" for m, tps in models.items())
                     for hw, models in index.items()) or "none shipped"


def _build_profile(kw, m, hw, tp):
    profile = kw["profile"]
    if isinstance(profile, measured.TableProfile):
        return measured.TableProfileCost(profile, kw.get("cpu_overhead_s"),
                                         kw.get("cpu_overhead_per_seq_s"), kw.get("kv_cache_dtype", "auto"))
    return ProfileCost(profile)


@dataclass(frozen=True)
class CostModelKind:
    """One entry of COST_MODELS."""
    options: Any        # (options as written, where, hardware, tp, model) -> kwargs; raises ScenarioError
    build: Any          # (kwargs, model, hardware, tp) -> CostModel
    takes: type | None  # type of the options as written: None (a bare name), dict or a path
    measured: bool      # are its step times measured (True) or estimated (False)?
    summary: str        # one line for --help and docs


COST_MODELS: dict[str, CostModelKind] = {
    "unit": CostModelKind(_unit_options, lambda kw, m, hw, tp: UnitCost(), None, False,
                          "every iteration lasts 1.0 (time counts iterations)"),
    "roofline": CostModelKind(_roofline_options, lambda kw, m, hw, tp: RooflineCost(m, hw, tp, **kw),
                              dict, False, "datasheet peaks x efficiencies + overheads (an estimate)"),
    "profile": CostModelKind(_profile_options, _build_profile, str, True,
                             "a step profile YAML: fitted (v1) or tabulated from kernel tables (v2)"),
    "measured": CostModelKind(_measured_options, _build_profile, dict, True,
                              "the shipped profile from published kernel timings of the "
                              "scenario's model, GPU and TP (the default where one exists)"),
}
_ALLOWED = ("measured, {measured: {cpu_overhead_s: S}}, roofline, {roofline: {constant: value}}, "
            "{profile: PATH}, unit")


@dataclass(frozen=True)
class CostModelSpec:
    """A scenario's `cost_model`, validated and resolved once (a profile is read when the scenario
    loads); `build` makes the model for one simulation without touching any file."""
    name: str        # a key of COST_MODELS
    options: dict    # validated options: roofline constants, {"profile": StepProfile}, or {}
    notice: str | None = None  # set when the default fell back to an estimate: say so once
    scale: float = 1.0  # every step this many times as long (the planner's cost-error band)

    @property
    def profile(self) -> StepProfile | None:
        return self.options.get("profile")

    def build(self, model: ModelSpec, hardware: HardwareSpec, tensor_parallel_size: int,
              kv_cache_dtype: str = "auto") -> CostModel:
        """The model for one simulation; `kv_cache_dtype` (the engine's) prices KV reads where the
        model estimates them (roofline) and picks a measured profile's attention grids."""
        options = self.options if kv_cache_dtype == "auto" else {**self.options, "kv_cache_dtype": kv_cache_dtype}
        built = COST_MODELS[self.name].build(options, model, hardware, tensor_parallel_size)
        if model.sliding_layers:
            built = WindowedCost(built, model.sliding_layers / model.num_layers, model.sliding_window)
        return built if self.scale == 1.0 else ScaledCost(built, self.scale)

    def as_yaml(self) -> Any:
        """The spec as a scenario writes it (profile paths absolute)."""
        tuning = {k: v for k, v in self.options.items() if k != "profile"}
        if self.name == "measured":
            return {"measured": tuning} if tuning else "measured"
        if self.profile is not None:
            return {"profile": str(self.profile.source)}
        return {self.name: tuning} if tuning else self.name

    def provenance(self) -> dict:
        """What summary.json says about where the step times came from."""
        out = {"name": self.name, "measured": COST_MODELS[self.name].measured}
        if self.profile is not None:
            meta = self.profile.metadata
            out.update(profile=str(self.profile.source), sha256=self.profile.sha256,
                       device=meta["device"], model=meta["model"],
                       measured=bool(meta.get("measured", False)),
                       heldout_mape=meta.get("heldout_mape"))
            if "source" in meta:
                out["source"] = meta["source"]
        tuning = {k: v for k, v in self.options.items() if k != "profile"}
        if tuning:
            out["options"] = tuning
        if self.scale != 1.0:
            out["scale"] = self.scale
        return out


def describe(provenance: dict | None) -> str:
    """One line on where step costs came from, from CostModelSpec.provenance() as summary.json
    and plan.json record it: measured, or estimated, and from what."""
    c = provenance
    if not c:
        return "not recorded"
    if c.get("profile") and c.get("measured"):
        if c.get("source"):  # composed from published kernel tables (sim/measured.py)
            return (f"measured: {c.get('device')} kernel timings ({c['source']}), "
                    f"profile {Path(c['profile']).name}")
        return f"measured: steps timed on {c.get('device')}, profile {Path(c['profile']).name}"
    if c.get("profile"):
        return f"profile {c['profile']} (fitted on {c.get('device')}, not measured on a GPU)"
    return {"roofline": "estimated with the roofline (datasheet peaks x efficiencies), not measured",
            "unit": "unit (every iteration lasts 1.0; times count iterations)"}.get(c["name"], c["name"])


def parse_cost_model(spec: Any, model: ModelSpec, hardware: HardwareSpec,
                     tensor_parallel_size: int, where: str = "") -> CostModelSpec:
    """Validate a scenario's `cost_model` value ("unit" | "roofline" | {"roofline": {...}} |
    {"profile": PATH}); `where` is e.g. "chat.yaml: cost_model". Raises ScenarioError listing the
    valid specs."""
    if isinstance(spec, CostModelSpec):
        return spec
    name, options = spec, None
    if isinstance(spec, dict) and len(spec) == 1:
        name, options = next(iter(spec.items()))
    kind = COST_MODELS.get(name) if isinstance(name, str) else None
    takes = type(None) if kind is None or kind.takes is None else kind.takes
    if kind is None or not (isinstance(options, takes) or (takes is dict and options is None)
                            or (takes is str and isinstance(options, Path))):
        raise _fail(where, f"unknown cost model {spec!r}; allowed: {_ALLOWED}")
    return CostModelSpec(name, kind.options(options, where, hardware, tensor_parallel_size, model))


def default_cost_model(model: ModelSpec, hardware: HardwareSpec, tensor_parallel_size: int,
                       where: str = "", kv_cache_dtype: str = "auto") -> CostModelSpec:
    """What a scenario without `cost_model` gets: the measured profile of its model x GPU x TP
    (with attention timed at its KV-cache dtype) where one is shipped, else the roofline estimate
    with a notice saying so."""
    try:
        return check_kv_cache_dtype(parse_cost_model("measured", model, hardware, tensor_parallel_size, where),
                                    kv_cache_dtype, where)
    except ScenarioError:
        spec = parse_cost_model("roofline", model, hardware, tensor_parallel_size, where)
        fp8 = " with an FP8 KV cache" if kv_cache_dtype != "auto" else ""
        return CostModelSpec("roofline", spec.options, notice=(
            f"step costs are estimated (roofline), not measured: no measured profile for "
            f"{model.name} on {hardware.name} at tensor_parallel_size={tensor_parallel_size}{fp8}"))


def check_kv_cache_dtype(spec: CostModelSpec, kv_cache_dtype: str, where: str = "") -> CostModelSpec:
    """`spec`, if it can price the engine's KV-cache dtype: a measured (v2) profile needs attention
    timed with that cache (ScenarioError naming the profile otherwise); the other models can."""
    if isinstance(spec.profile, measured.TableProfile):
        try:
            spec.profile.attention(kv_cache_dtype)
        except ScenarioError as e:
            raise _fail(where, str(e)) from None
    return spec


def make_cost_model(spec: Any, model: ModelSpec, hardware: HardwareSpec,
                    tensor_parallel_size: int, where: str = "") -> CostModel:
    """Build a cost model from a scenario's `cost_model` value (or a parsed CostModelSpec)."""
    return parse_cost_model(spec, model, hardware, tensor_parallel_size, where).build(
        model, hardware, tensor_parallel_size)
