"""One engine iteration's GPU time composed from measured kernel tables (sim/tables/<gpu>/), and
that composition tabulated as a `servesim-step-profile/v2` profile (sim/cost/measured.py).

    tables = KernelTables.load("sim/tables/h100_sxm")
    step = StepComposer(tables, model, tensor_parallel_size=1)
    step.seconds(BatchStats(...))          # one iteration
    step.terms(BatchStats(...))            # the same, term by term (ms)

An iteration of a Llama-style decoder at T scheduled tokens and S sequences (vLLM V1: one forward
pass over every scheduled token):

    layers x [ GEMM(T, qkv) + GEMM(T, o) + GEMM(T, gate_up) + GEMM(T, down)     measured (gemm)
               (an MoE layer: GEMM(T, router) + fused experts(T)                measured (gemm, moe)
                + the shared experts' gate_up and down GEMMs (DeepSeek))
             + prefill attention of the chunks                                  measured (context)
             + decode attention of the decodes                                  measured (generation)
               (MLA: vLLM's whole attention module, projections and o_proj     measured (mla_*)
                included, in place of qkv, o and attention)
             + 2 all-reduces of T x hidden (TP > 1)                             measured (all-reduce)
             + norms, activation, residuals, rope                               modelled: bytes / HBM ]
    + GEMM(S, lm_head)                                                          measured (gemm)
    (kernel time only: the engine's overheads on top are sim/cost/overheads.py's)

Each GEMM and the fused experts come from the table of the weights' format: bf16 (gemm.csv), FP8
(gemm_fp8.csv), and the fused-MoE table of the experts' format (moe.csv bf16, moe_fp8_block.csv for
DeepSeek-V3's 128 x 128-block FP8, moe_w4a16_mxfp4.csv for gpt-oss). The router and the LM head
stay bf16, as vLLM and the checkpoints keep them. Block-scaled FP8 layer GEMMs are read from the
per-tensor FP8 rows: AIConfigurator's block-scaled GEMM rows (DeepGEMM, FlashInfer) sit on a
58-90 us floor at every m up to 1,024 (H200: n 4096, k 7168 takes 0.091 ms at m = 32 and 0.092 ms at
m = 1,024) where the per-tensor kernel takes 0.018 and 0.061 ms: a launch and quantisation overhead
outside the CUDA graphs vLLM runs decode in, not GPU work. Where the GPU bounds them (m >= 4,096) the
two agree within 10% (0.252 vs 0.230 ms at m = 4,096; 0.460 vs 0.464 at m = 8,192).

Interpolation is piecewise-linear between measured points (in m, n and k for GEMMs; in batch and
length for attention, in message size for all-reduces). More work never costs less: where a larger shape was
measured faster than a smaller one (kernel selection, noise),
the points are replaced by their least-squares monotone fit along each axis (tokens, batch, length,
message size: isotonic regression, `isotonic`), which pools the out-of-order points into their mean;
so at a point measured in order the composer returns the measured value. How many measured points
the fit moved is counted in `notes`. (The upper envelope used before, each
time at least every time before it, carried one slow outlier to every larger shape: on H100 the
8192 x 8192 GEMM measured 0.046-0.048 ms from m = 8 to 96, and an outlier of 0.054 ms at m = 4 set
all of them to 0.054, 15% more, which over-priced every decode iteration.) Nothing is
extrapolated silently: past the largest measured value of an axis the last measured point is scaled
in proportion to the work (a GEMM with n beyond the table is split into equal in-table GEMMs; longer
contexts and larger batches scale the last point by the ratio of work) and every such use is counted
in `extrapolated`, which `build_profile` writes into the profile's metadata.

Which measured rows stand in for a shape the tables do not list (attention heads per GPU, GEMM n and
k) is decided by `attention_sources` and `bracket`.
"""
from __future__ import annotations

import math
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from sim.config.errors import ScenarioError
from sim.cost.batch import BatchStats
from sim.cost.measured import FORMAT, load_table_profile
from sim.cost.table_cost import TableProfileCost
from sim.presets.hardware import HardwareSpec
from sim.presets.memory import kv_heads_per_rank
from sim.presets.models import EXPERT_QUANT_BYTES, ModelSpec

TABLES = Path(__file__).resolve().parents[1] / "tables"  # sim/tables
# servesim hardware preset -> its kernel tables: their folder under TABLES (AIConfigurator's system
# name) and the attention kernels vLLM runs there by default, (prefill, decode): FlashAttention 3 on
# Hopper, 2 on Ampere and Ada, FlashInfer's TRT-LLM kernels on Blackwell. The one place the two
# names meet (calibrate/aic_import.py imports the tables by it): a GPU with tables is one line here.
_FA3, _FA2, _TRTLLM = (("vllm_flash_attn_fa3",) * 2, ("vllm_flash_attn_fa2",) * 2,
                       ("vllm_flashinfer_trtllmprefill", "vllm_flashinfer_trtllmdecode"))
TABLE_SYSTEMS: dict[str, tuple[str, tuple[str, str]]] = {
    "h100-sxm": ("h100_sxm", _FA3), "h200": ("h200_sxm", _FA3),
    "a100-80gb": ("a100_sxm", ("vllm_flash_attn", "vllm_flash_attn")), "l40s": ("l40s", _FA2),
    "b200": ("b200_sxm", _TRTLLM), "b300": ("b300_sxm", _TRTLLM), "gb200": ("gb200", _TRTLLM),
    "gb300": ("gb300", _TRTLLM), "rtx-pro-6000": ("rtx_pro_6000_server", _FA2)}
SYSTEMS = {gpu: folder for gpu, (folder, _) in TABLE_SYSTEMS.items()}  # preset -> its tables' folder
HELDOUT_SHAPES = 300  # iteration shapes a tabulated profile is checked on against the composer

# Elementwise work per token per layer, in elements of the activation dtype read + written: two
# RMSNorms (read + write hidden each), SiLU x mul (read 2 x intermediate/tp, write intermediate/tp),
# two residual adds (read 2, write 1 hidden each), rope on q and k (read + write). Bandwidth-bound:
# time = bytes / (HBM bandwidth x ELEMENTWISE_BANDWIDTH_EFFICIENCY).
ELEMENTWISE_BANDWIDTH_EFFICIENCY = 0.7
# All-reduces run inside CUDA graphs for batches vLLM captures (up to 512 tokens by default) and
# eagerly above: the measured table has both.
CUDA_GRAPH_MAX_TOKENS = 512
# CPU/framework time per iteration inside the profile: none. A profile holds kernel time only; the
# engine's overheads (host time the GPU hides or not, request handling, the scheduling lag) are
# sim/cost/overheads.py's, fitted to real vLLM serving (docs/validation.md). Until this was fitted the
# profiles carried 4 ms here, cited from vLLM issue #6854 (the V0 engine's synchronous loop), which
# over-priced every V1 iteration (real Llama-2-70B TP4 E2E +24%).
DEFAULT_CPU_OVERHEAD_S = 0.0
DEFAULT_CPU_OVERHEAD_PER_SEQ_S = 0.0


# ---------------------------------------------------------------- the tables

@dataclass
class KernelTables:
    """The compact CSVs of one GPU (latencies in ms, as measured)."""
    gemm: pd.DataFrame                  # m, n, k, latency_ms
    # kv_cache_dtype (bfloat16 | fp8), head_dim, num_heads, num_kv_heads, batch_size, isl | kv_len,
    # latency_ms
    context_attention: pd.DataFrame
    generation_attention: pd.DataFrame
    allreduce: pd.DataFrame             # num_gpus, message_size, backend, latency_ms
    hbm_bandwidth: float                # bytes/s, for the modelled elementwise term
    folder: Path | None = None
    # fused MoE layers (routing, both expert GEMMs and the activation), experts split by TP, bf16:
    # hidden_size, inter_size, topk, num_experts, tp, num_tokens, latency_ms; None: not measured
    moe: pd.DataFrame | None = None
    # the same for experts in FP8 128 x 128 blocks (DeepSeek-V3) and in MXFP4 (gpt-oss)
    moe_fp8_block: pd.DataFrame | None = None
    moe_w4a16_mxfp4: pd.DataFrame | None = None
    # FP8 GEMMs (per-tensor scaled, vLLM's CUTLASS kernel): m, n, k, latency_ms; None: not measured
    gemm_fp8: pd.DataFrame | None = None
    # vLLM's MLA attention module (DeepseekV2MLAAttention forward: q/kv down and up projections,
    # latent attention, o_proj): kv_cache_dtype, gemm_type, num_heads, batch_size, isl | kv_len,
    # latency_ms; None: not measured
    mla_context: pd.DataFrame | None = None
    mla_generation: pd.DataFrame | None = None

    OPTIONAL = ("moe", "moe_fp8_block", "moe_w4a16_mxfp4", "gemm_fp8", "mla_context", "mla_generation")

    @classmethod
    def load(cls, folder: str | Path, hbm_bandwidth: float) -> KernelTables:
        folder = Path(folder)
        read = lambda name: pd.read_csv(folder / f"{name}.csv")  # noqa: E731
        optional = {name: read(name) if (folder / f"{name}.csv").is_file() else None
                    for name in cls.OPTIONAL}
        return cls(read("gemm"), read("context_attention"), read("generation_attention"),
                   read("allreduce"), hbm_bandwidth, folder, **optional)

    def gemm_table(self, dtype: str) -> pd.DataFrame:
        table = {"bfloat16": self.gemm, "fp8": self.gemm_fp8}[dtype]
        if table is None:
            raise ValueError(f"{self.folder}: no {GEMM_WHAT[dtype]} GEMM measurements for this GPU")
        return table

    def moe_table(self, dtype: str) -> pd.DataFrame:
        table = getattr(self, MOE_TABLES[dtype])
        if table is None:
            raise ValueError(f"{self.folder}: no {MOE_WHAT[dtype]} fused-MoE measurements for this GPU")
        return table


def bracket(values: list[int], x: float) -> tuple[int, int]:
    """The measured values around x (equal when x is measured); past the ends, the end itself."""
    i = bisect_left(values, x)
    if i < len(values) and values[i] == x:
        return values[i], values[i]
    lo = values[max(i - 1, 0)]
    hi = values[min(i, len(values) - 1)]
    return lo, hi


def attention_sources(q: int, kv: int, combos: set[tuple[int, int]]) -> list[tuple[int, int, float, float]]:
    """Measured (heads, kv heads) combos, weights and batch multipliers whose weighted sum stands in
    for (q, kv) heads per GPU: the time is sum of weight x the combo's time at batch x multiplier.
    Exact when measured. Else, at the same kv heads, linear in query heads between the nearest
    measured ones. Else (more kv heads than any measured row with this query:kv ratio, e.g. MHA's
    32:32 in a decode table that stops at 8 kv heads), the largest measured kv at the same ratio at
    kv / that kv times the batch: the kernels' grid is (sequences x kv heads), each block reading
    one head's K and V, so b sequences of 32 kv heads are the same blocks and bytes as 4b sequences
    of 8. (Scaling the time by 4 instead would count the launch and the small-batch floor 4 times:
    at batch 1 and 1,024 tokens on H100, 57 us per layer where the equivalent batch of 4 measured
    16 us.)"""
    if (q, kv) in combos:
        return [(q, kv, 1.0, 1.0)]
    same_kv = sorted(h for h, k in combos if k == kv)
    if same_kv and same_kv[0] <= q <= same_kv[-1]:
        lo, hi = bracket(same_kv, q)
        w = (q - lo) / (hi - lo)
        return [(lo, kv, 1 - w, 1.0), (hi, kv, w, 1.0)]
    ratio = q / kv
    same_ratio = sorted(k for h, k in combos if h == k * ratio)
    if same_ratio:
        ref = max(k for k in same_ratio if k <= kv) if min(same_ratio) <= kv else same_ratio[0]
        return [(int(ref * ratio), ref, 1.0, kv / ref)]
    raise ValueError(f"no measured attention rows can stand in for {q} heads / {kv} kv heads")


# ---------------------------------------------------------------- piecewise-linear lookups

def isotonic(y: np.ndarray) -> np.ndarray:
    """The non-decreasing sequence closest to `y` in least squares (pool adjacent violators: each
    run of out-of-order values becomes its mean). Written here because sim/ does not depend on
    scipy (scipy.optimize.isotonic_regression gives the same; tests/cost/test_measured.py checks)."""
    means: list[float] = []
    sizes: list[int] = []
    for v in np.asarray(y, dtype=np.float64).tolist():
        means.append(v)
        sizes.append(1)
        while len(means) > 1 and means[-2] > means[-1]:  # merge the violating pair of blocks
            n = sizes[-2] + sizes[-1]
            means[-2] = (means[-2] * sizes[-2] + means[-1] * sizes[-1]) / n
            sizes[-2] = n
            means.pop()
            sizes.pop()
    return np.repeat(means, sizes)


class _Curve:
    """y(x) piecewise-linear through measured points (x strictly increasing), made non-decreasing
    by their least-squares monotone fit (`isotonic`); past the last point, y scales in proportion
    to x (work grows linearly), counted as an extrapolation. `raised`: measured points the monotone
    fit moved (up or down)."""

    def __init__(self, x, y):
        order = np.argsort(x)
        self.x = np.asarray(x, dtype=np.float64)[order]
        measured = np.asarray(y, dtype=np.float64)[order]
        self.y = isotonic(measured)
        self.raised = int((np.abs(self.y - measured) > 1e-12).sum())

    def __call__(self, x: float, seen: Counter, what: str) -> float:
        if x > self.x[-1]:
            seen[what] += 1
            return float(self.y[-1] * x / self.x[-1])
        return float(np.interp(x, self.x, self.y))


class _Grid:
    """z(a, b) bilinear over a measured (a, b) grid (each axis piecewise-linear, as _Curve). Rows
    measured over fewer b values are completed on the union of b (their own interpolation and
    proportional extension; each row already monotone in b), then made non-decreasing across a
    (the monotone fit down each column, then, where that broke a row's order, the running maximum
    along b and a)."""

    def __init__(self, frame: pd.DataFrame, a: str, b: str, z: str = "latency_ms"):
        self.a = sorted(frame[a].unique().tolist())
        rows = {va: _Curve(g[b].to_numpy(), g[z].to_numpy()) for va, g in frame.groupby(a)}
        xs = np.array(sorted(frame[b].unique().tolist()), dtype=np.float64)
        dense = np.array([[rows[va](x, Counter(), "") for x in xs] for va in self.a])
        dense = np.column_stack([isotonic(col) for col in dense.T])
        dense = np.maximum.accumulate(np.maximum.accumulate(dense, axis=1), axis=0)
        self.curves = {va: _Curve(xs, dense[i]) for i, va in enumerate(self.a)}
        # measured points the monotone fits moved
        self.raised = int(sum((np.abs(np.interp(g[b].to_numpy(), xs, dense[self.a.index(va)])
                                      - g[z].to_numpy()) > 1e-12).sum() for va, g in frame.groupby(a)))
        self.points = len(frame)

    def __call__(self, va: float, vb: float, seen: Counter, what: str) -> float:
        lo, hi = bracket(self.a, va)
        if va > self.a[-1]:
            seen[what] += 1
            return self.curves[hi](vb, seen, what) * va / hi
        if va < self.a[0]:
            seen[what] += 1
            return self.curves[lo](vb, seen, what) * va / lo
        zl = self.curves[lo](vb, seen, what)
        if hi == lo:
            return zl
        w = (va - lo) / (hi - lo)
        return zl + w * (self.curves[hi](vb, seen, what) - zl)


# ---------------------------------------------------------------- the composer

# a weight format (linear_dtype) -> how messages name it
GEMM_WHAT = {"bfloat16": "bf16", "fp8": "FP8", "fp8_block": "block-scaled FP8"}
# a weight format -> the GEMM table its layers are read from (block-scaled FP8: the per-tensor rows,
# see the module docstring)
GEMM_TABLE = {"bfloat16": "bfloat16", "fp8": "fp8", "fp8_block": "fp8"}
# experts' dtype (AIConfigurator's moe_dtype) -> the KernelTables field / CSV, and its name
MOE_TABLES = {"bfloat16": "moe", "fp8_block": "moe_fp8_block", "w4a16_mxfp4": "moe_w4a16_mxfp4"}
MOE_WHAT = {"bfloat16": "bf16", "fp8_block": "block-scaled FP8", "w4a16_mxfp4": "MXFP4"}
# engine.kv_cache_dtype -> the attention tables' kv_cache_dtype, and how messages name it (auto: the
# model's bf16)
TABLE_KV_DTYPE = {"auto": "bfloat16", "fp8": "fp8"}
KV_WHAT = {"auto": "bf16", "fp8": "FP8"}


@dataclass(frozen=True)
class GemmShape:
    name: str
    n: int                    # output features per GPU
    k: int                    # input features per GPU
    layers: int = 1           # decoder layers running it (the LM head: 1)
    dtype: str = "bfloat16"   # the GEMM table it is read from: bfloat16 | fp8


def linear_dtype(model: ModelSpec) -> str:
    """The format of the model's linear-layer weights: bf16, FP8 per tensor, FP8 in blocks
    (GEMM_TABLE: the GEMM rows that price it; also the MLA tables' gemm_type). Other formats
    (int4/int8 weight-only) have no measured rows here: ValueError."""
    if model.linear_weight_bytes in (None, model.dtype_bytes) and model.dtype_bytes == 2:
        return "bfloat16"
    if model.linear_weight_bytes == 1:
        return "fp8_block" if model.weight_block_size else "fp8"
    raise ValueError(f"{model.name}: {model.linear_bytes_per_weight:g}-byte linear weights have no "
                     f"measured GEMM rows; the roofline prices them")


def moe_dtype(model: ModelSpec) -> str:
    """The format of the model's routed experts: which fused-MoE table (MOE_TABLES) prices them."""
    dtype = ("w4a16_mxfp4" if model.expert_weight_bytes == EXPERT_QUANT_BYTES["mxfp4"] else
             linear_dtype(model) if model.expert_weight_bytes is None else None)
    if dtype not in MOE_TABLES:
        raise ValueError(f"{model.name}: its experts' format has no measured fused-MoE rows; the "
                         f"roofline prices them")
    return dtype


def gemm_shapes(model: ModelSpec, tp: int) -> list[GemmShape]:
    """The linear layers per GPU (vLLM merges q/k/v and gate/up) and the LM head (vocab split
    across GPUs). An MoE layer has the router (experts x hidden, the same on every GPU, bf16)
    instead of gate/up and down: its routed experts are one fused MoE kernel (moe.csv), its shared
    experts (DeepSeek) one more gated MLP. MLA layers have no qkv / o here: the measured attention
    module holds their projections."""
    layers, h, m = model.num_layers, model.hidden_size, model.moe
    lin = GEMM_TABLE[linear_dtype(model)]
    out = []
    if model.mla is None:
        kv, q, hd = kv_heads_per_rank(model, tp), model.num_attention_heads // tp, model.head_dim
        gate = q if model.attention_output_gate else 0  # (Qwen3-Next's q_proj also makes the output gate)
        full = model.attention_layers
        out += [GemmShape("qkv", (q + gate + 2 * kv) * hd, h, full, lin), GemmShape("o", h, q * hd, full, lin)]
    lin_attn = model.linear_attention
    if lin_attn is not None:  # Gated DeltaNet: in_proj_qkvz, in_proj_ba, out_proj (its kernels: linear_attention.py)
        n = lin_attn.layers
        out += [GemmShape("gdn_qkvz", (2 * lin_attn.key_dim + 2 * lin_attn.value_dim) // tp, h, n, lin),
                GemmShape("gdn_ba", 2 * lin_attn.num_value_heads // tp, h, n, lin),
                GemmShape("gdn_out", h, lin_attn.value_dim // tp, n, lin)]
    dense = layers if m is None else m.dense_layers
    if dense:
        inter = model.intermediate_size // tp
        out += [GemmShape("gate_up", 2 * inter, h, dense, lin), GemmShape("down", h, inter, dense, lin)]
    if m is not None:
        out.append(GemmShape("router", m.num_experts, h, layers - dense))
        if m.shared_experts:
            w = m.shared_experts * m.expert_intermediate_size // tp
            out += [GemmShape("shared_gate_up", 2 * w, h, layers - dense, lin),
                    GemmShape("shared_down", h, w, layers - dense, lin)]
    return [*out, GemmShape("lm_head", -(-model.vocab_size // tp), h)]


# moe*.csv's shape columns, in moe_key's order
MOE_COLUMNS = ["hidden_size", "inter_size", "topk", "num_experts", "tp"]


def moe_key(model: ModelSpec, tp: int) -> tuple[int, int, int, int, int]:
    """(hidden_size, inter_size, topk, num_experts, tp): the rows of this model's MoE layers split
    over `tp` GPUs (vLLM without --enable-expert-parallel splits each expert), in the table of its
    experts' format (moe_dtype)."""
    m = model.moe
    assert m is not None  # (asked of MoE models only)
    return model.hidden_size, m.expert_intermediate_size, m.experts_per_token, m.num_experts, tp


def mla_gemm_type(model: ModelSpec) -> str:
    """The MLA tables' gemm_type: the precision of the module's projections."""
    return linear_dtype(model)


class StepComposer:
    """`kv_cache_dtype` is the engine's (vLLM's --kv-cache-dtype): "auto" reads the attention rows
    timed with a bf16 KV cache, "fp8" those timed with an FP8 one (ValueError where none were)."""

    def __init__(self, tables: KernelTables, model: ModelSpec, tensor_parallel_size: int = 1, *,
                 cpu_overhead_s: float = DEFAULT_CPU_OVERHEAD_S,
                 cpu_overhead_per_seq_s: float = DEFAULT_CPU_OVERHEAD_PER_SEQ_S,
                 kv_cache_dtype: str = "auto"):
        tp = tensor_parallel_size
        m = model.moe
        self.model, self.tp, self.tables = model, tp, tables
        if kv_cache_dtype not in TABLE_KV_DTYPE:
            raise ValueError(f"kv_cache_dtype {kv_cache_dtype!r}; allowed: {', '.join(TABLE_KV_DTYPE)}")
        self.kv_cache_dtype = kv_cache_dtype
        self.cpu_overhead_s, self.cpu_overhead_per_seq_s = cpu_overhead_s, cpu_overhead_per_seq_s
        self.extrapolated: Counter = Counter()  # lookups past a table's last point, by term
        self.notes: list[str] = []              # modelling choices this composition needed
        self.shapes = gemm_shapes(model, tp)
        self._axes: dict[str, tuple[list[float], list[float]]] = {}  # attention_axes
        self._gemm = {}
        for dtype in sorted({s.dtype for s in self.shapes}):
            self._gemm.update(self._gemm_curves(tables.gemm_table(dtype),
                                                [s for s in self.shapes if s.dtype == dtype]))
        if linear_dtype(model) != "bfloat16":
            self.notes.append(f"{GEMM_WHAT[linear_dtype(model)]} weights: the layer GEMMs from the FP8 "
                              f"rows (activation quantisation not priced), the router and LM head from "
                              f"the bf16 rows")
        self.moe_layers = 0 if m is None else model.num_layers - m.dense_layers
        self._moe = None if m is None else self._moe_curve(tables, moe_dtype(model), moe_key(model, tp))
        # the layers' linear work: their GEMMs, and the fused experts of the MoE layers
        self.layer_gemms = [s for s in self.shapes if s.name != "lm_head"]
        if model.mla is not None:
            self._ctx, self._gen = self._mla(tables, model.num_attention_heads // tp, mla_gemm_type(model))
        else:
            q, kv = model.num_attention_heads // tp, kv_heads_per_rank(model, tp)
            self._ctx = self._attention(tables.context_attention, q, kv, "isl")
            self._gen = self._attention(tables.generation_attention, q, kv, "kv_len")
        ar = tables.allreduce[tables.allreduce["num_gpus"] == tp] if tp > 1 else None
        self._allreduce = None if ar is None else {
            backend: _Curve(g["message_size"].to_numpy(), g["latency_ms"].to_numpy())
            for backend, g in ar.groupby("backend")}
        if tp > 1 and not self._allreduce:
            raise ValueError(f"{tables.folder}: no all-reduce rows for {tp} GPUs")
        # gated-MLP widths per GPU outside the fused experts, averaged over the layers: the dense
        # layers' and the shared experts' (the fused MoE kernel holds its own activation)
        dense = model.num_layers - self.moe_layers
        shared = m.shared_experts * m.expert_intermediate_size if m is not None else 0
        inter = (dense * model.intermediate_size + self.moe_layers * shared) / model.num_layers / tp
        # rope on q and k (MLA: inside the measured module)
        heads = model.num_attention_heads // tp + kv_heads_per_rank(model, tp)
        dims: float = 0 if model.mla is not None else heads * model.head_dim
        if model.linear_attention is not None:  # rope in the attention layers only, averaged over all
            dims = dims * model.attention_layers / model.num_layers
        elements = 2 * 2 * model.hidden_size + 3 * inter + 2 * 3 * model.hidden_size + 2 * dims
        self._elementwise_s_per_token = (model.num_layers * elements * model.dtype_bytes
                                         / (tables.hbm_bandwidth * ELEMENTWISE_BANDWIDTH_EFFICIENCY))

    # -- construction -------------------------------------------------------------------------
    def _gemm_curves(self, gemm: pd.DataFrame, shapes: list[GemmShape]) -> dict:
        """For each GEMM: the measured (n, k) bracket points and their m-curves."""
        ns = sorted(gemm["n"].unique().tolist())
        ks = sorted(gemm["k"].unique().tolist())
        out = {}
        for s in shapes:
            parts = max(1, math.ceil(s.n / ns[-1]))  # n past the table: equal in-table GEMMs
            if parts > 1:
                self.notes.append(f"GEMM {s.name}: n = {s.n} is past the measured {ns[-1]}; "
                                  f"priced as {parts} GEMMs of n = {s.n / parts:g}")
            n = s.n / parts
            if s.k > ks[-1]:
                raise ValueError(f"GEMM {s.name}: k {s.k} is beyond the measured {ks[-1]}")
            corners = {}
            for vn in set(bracket(ns, n)):
                for vk in set(bracket(ks, s.k)):
                    rows = gemm[(gemm["n"] == vn) & (gemm["k"] == vk)]
                    if rows.empty:
                        raise ValueError(f"GEMM {s.name}: no measured rows at n={vn}, k={vk}")
                    corner = corners[(vn, vk)] = _Curve(rows["m"].to_numpy(),
                                                        rows["latency_ms"].to_numpy())
                    if corner.raised:
                        self.notes.append(f"GEMM n={vn} k={vk}: {corner.raised} of {len(rows)} "
                                          f"measured points moved by the monotone fit in tokens")
            out[s.name] = (n, s.k, parts, bracket(ns, n), bracket(ks, s.k), corners)
        return out

    def _moe_curve(self, tables: KernelTables, dtype: str, key: tuple) -> _Curve:
        table = tables.moe_table(dtype)
        rows = table[(table[MOE_COLUMNS] == pd.Series(key, index=MOE_COLUMNS)).all(axis=1)]
        if rows.empty:
            raise ValueError(f"{tables.folder}/{MOE_TABLES[dtype]}.csv: no rows for hidden {key[0]}, "
                             f"expert width {key[1]}, top-{key[2]} of {key[3]} experts over {key[4]} GPU(s)")
        curve = _Curve(rows["num_tokens"].to_numpy(), rows["latency_ms"].to_numpy())
        if curve.raised:
            self.notes.append(f"fused MoE: {curve.raised} of {len(rows)} measured points moved by the "
                              f"monotone fit in tokens")
        return curve

    def experts_ms(self, tokens: float) -> float:
        """One MoE layer's fused experts at `tokens` tokens (measured with balanced routing)."""
        assert self._moe is not None  # (asked of MoE models only)
        return self._moe(tokens, self.extrapolated, "fused MoE tokens") if tokens else 0.0

    def linear_ms(self, tokens: float) -> float:
        """Every decoder layer's linear work at `tokens` tokens (GEMMs and fused experts)."""
        ms = sum(s.layers * self.gemm_ms(s.name, tokens) for s in self.layer_gemms)
        return ms + self.moe_layers * self.experts_ms(tokens) if self._moe is not None else ms

    def _mla(self, tables: KernelTables, heads: int, gemm_type: str):
        """The measured MLA module at `heads` heads per GPU, as (prefill, decode) grids."""
        out = []
        for frame, length, what in ((tables.mla_context, "isl", "prefill"),
                                    (tables.mla_generation, "kv_len", "decode")):
            if frame is None:
                raise ValueError(f"{tables.folder}: no MLA module measurements for this GPU")
            rows = frame[(frame["gemm_type"] == gemm_type) & (frame["num_heads"] == heads)
                         & (frame["kv_cache_dtype"] == TABLE_KV_DTYPE[self.kv_cache_dtype])]
            if rows.empty:
                raise ValueError(f"{tables.folder}: no {what} MLA module rows at {heads} heads per GPU "
                                 f"with {GEMM_WHAT[gemm_type]} projections and a "
                                 f"{KV_WHAT[self.kv_cache_dtype]} KV cache")
            self._axes[what] = (sorted({float(v) for v in rows["batch_size"]}),
                                sorted({float(v) for v in rows[length]}))
            grid = _Grid(rows, "batch_size", length)
            if grid.raised:
                self.notes.append(f"{what} MLA module {heads} heads: {grid.raised} of {grid.points} "
                                  f"measured points moved by the monotone fit")
            out.append([(grid, 1.0, 1.0)])
        self.notes.append("MLA: the attention terms are vLLM's whole attention module as measured "
                          f"(q/kv projections, latent attention, o_proj; {KV_WHAT[self.kv_cache_dtype]} "
                          "KV cache); a prefill "
                          "chunk after cached context is priced as the fresh prompt with as many "
                          "(query, key) pairs, which also counts its projections for more tokens")
        return out

    def _attention(self, frame: pd.DataFrame, q: int, kv: int, length: str):
        frame = frame[frame["kv_cache_dtype"] == TABLE_KV_DTYPE[self.kv_cache_dtype]]
        what = "prefill" if length == "isl" else "decode"
        out, batches, lengths = [], set(), set()
        for head_dim, share, heads in self._head_dims(frame, what, q, kv):
            rows_d = frame[frame["head_dim"] == head_dim]
            measured = {float(v) for v in rows_d["batch_size"]}
            sources = attention_sources(*heads, set(zip(rows_d["num_heads"], rows_d["num_kv_heads"])))
            # a source read at x times the batch has its measured batches at b / x: knots too, so
            # that a profile tabulated on this axis keeps the composition's kinks
            batches |= measured | {v / x for _, _, _, x in sources if x != 1.0 for v in measured if v / x >= 1}
            lengths |= {float(v) for v in rows_d[length]}
            for h, k, weight, batch in sources:
                grid = _Grid(rows_d[(rows_d["num_heads"] == h) & (rows_d["num_kv_heads"] == k)], "batch_size", length)
                if batch != 1.0:
                    self.notes.append(f"{what} attention for {q}/{kv} heads per GPU: measured {h}/{k} "
                                      f"at {batch:.4g}x the batch")
                elif weight != 1.0 or (h, k) != (q, kv):
                    self.notes.append(f"{what} attention for {q}/{kv} heads per GPU: measured {h}/{k} "
                                      f"x {weight:.4g}")
                if grid.raised:
                    self.notes.append(f"{what} attention {h}/{k} heads: {grid.raised} of "
                                      f"{grid.points} measured points moved by the monotone fit")
                out.append((grid, weight * share, batch))
        self._axes[what] = (sorted(batches), sorted(lengths))
        return out

    def _head_dims(self, frame: pd.DataFrame, what: str, q: int, kv: int) -> list[tuple[int, float, tuple[int, int]]]:
        """The measured head_dims standing in for the model's: (head_dim, share of the time, (heads,
        kv heads) per GPU to read there). Attention reads K and V and does its FLOPs in proportion
        to heads x head_dim, so: the model's own head_dim; else linear between the nearest measured
        below and above (Phi-3-mini's 96 between 64 and 128); else, past the measured ones (the
        A100 tables time 128 only), the nearest measured D with the heads scaled by head_dim / D
        (32 heads of 64 as 16 of 128: the same bytes and FLOPs), or, where that is no whole number
        of heads, the time at D scaled by head_dim / D. Every stand-in is said in the notes."""
        d = self.model.head_dim
        dims = sorted({int(v) for v in frame["head_dim"]})
        if not dims:
            raise ValueError(f"{self.tables.folder}: no attention rows with a {KV_WHAT[self.kv_cache_dtype]} KV cache")
        if d in dims:
            return [(d, 1.0, (q, kv))]
        below, above = [x for x in dims if x < d], [x for x in dims if x > d]
        if below and above:
            lo, hi = below[-1], above[0]
            w = (d - lo) / (hi - lo)
            self.notes.append(f"{what} attention at head_dim {d}: linear between the measured {lo} "
                              f"(x {1 - w:.4g}) and {hi} (x {w:.4g})")
            return [(lo, 1 - w, (q, kv)), (hi, w, (q, kv))]
        near = below[-1] if below else above[0]
        if (q * d) % near == 0 and (kv * d) % near == 0:
            heads = (q * d // near, kv * d // near)
            self.notes.append(f"{what} attention at head_dim {d} (measured: {', '.join(map(str, dims))}): "
                              f"{q}/{kv} heads read as {heads[0]}/{heads[1]} heads of {near}")
            return [(near, 1.0, heads)]
        self.notes.append(f"{what} attention at head_dim {d} (measured: {', '.join(map(str, dims))}): "
                          f"the time at {near} x {d / near:.4g}")
        return [(near, d / near, (q, kv))]

    def attention_axes(self, phase: str) -> tuple[list[float], list[float]]:
        """The measured batch sizes and lengths (prompt length or KV length) of the attention table
        this composition reads (at the model's head_dim; MLA: its rows), phase "prefill" or
        "decode": the grid a profile tabulates on."""
        return self._axes[phase]

    # -- terms (ms) ---------------------------------------------------------------------------
    def gemm_ms(self, name: str, m: float) -> float:
        n, k, parts, (n0, n1), (k0, k1), corners = self._gemm[name]
        seen, what = self.extrapolated, f"GEMM {name} tokens"

        def at(vn):  # linear in k at this n
            lo = corners[(vn, k0)](m, seen, what)
            return lo if k1 == k0 else lo + (k - k0) / (k1 - k0) * (corners[(vn, k1)](m, seen, what) - lo)
        lo = at(n0)
        return parts * (lo if n1 == n0 else lo + (n - n0) / (n1 - n0) * (at(n1) - lo))

    def prefill_attention_ms(self, lens, contexts) -> float:
        """The chunks as one varlen call: `len(lens)` sequences at the length whose causal pairs,
        summed, equal the chunks' (a chunk of c tokens after p cached ones has c x p + c^2 / 2
        (query, key) pairs; a fresh prompt of s tokens has s^2 / 2). Exact for equal fresh
        prompts at a measured batch and length."""
        if not len(lens):
            return 0.0
        pairs = sum(c * p + c * c / 2 for c, p in zip(lens, contexts))
        b = len(lens)
        return self.prefill_attention_at(b, math.sqrt(2 * pairs / b))

    def prefill_attention_at(self, chunks: float, length: float) -> float:
        """`chunks` fresh prompts of `length` tokens (chunks may be fractional: a tabulation knot)."""
        return sum(w * g(chunks * x, length, self.extrapolated, "prefill attention") for g, w, x in self._ctx)

    def decode_attention_ms(self, num_decodes: float, context_sum: float) -> float:
        """`num_decodes` sequences at their mean KV length (the table's kv_len = isl + step)."""
        if not num_decodes:
            return 0.0
        mean = context_sum / num_decodes
        return sum(w * g(num_decodes * x, mean, self.extrapolated, "decode attention")
                   for g, w, x in self._gen)

    def allreduce_ms(self, tokens: int) -> float:
        if self.tp == 1 or not tokens:
            return 0.0
        assert self._allreduce is not None  # (tp > 1 composes only with an all-reduce table)
        backend = "vllm_graph" if tokens <= CUDA_GRAPH_MAX_TOKENS else "vllm_eager"
        curve = self._allreduce.get(backend) or next(iter(self._allreduce.values()))
        return curve(tokens * self.model.hidden_size * self.model.dtype_bytes, self.extrapolated,
                     "all-reduce message")

    def terms(self, stats: BatchStats) -> dict[str, float]:
        """Milliseconds of each part of one iteration of `stats`."""
        lens, contexts = stats.prefill_lens.tolist(), stats.prefill_contexts.tolist()
        tokens = sum(lens) + stats.num_decodes
        seqs = len(lens) + stats.num_decodes
        layers = self.model.attention_layers  # (a hybrid's linear-attention kernels: linear_attention.py)
        out = {s.name: s.layers * self.gemm_ms(s.name, tokens) for s in self.layer_gemms}
        if self._moe is not None:
            out["experts"] = self.moe_layers * self.experts_ms(tokens)
        out["lm_head"] = self.gemm_ms("lm_head", seqs) if seqs else 0.0
        out["prefill_attention"] = layers * self.prefill_attention_ms(lens, contexts)
        out["decode_attention"] = layers * self.decode_attention_ms(stats.num_decodes,
                                                                    stats.decode_context_sum)
        out["allreduce"] = 2 * self.model.num_layers * self.allreduce_ms(tokens)
        out["elementwise"] = 1e3 * self._elementwise_s_per_token * tokens
        out["cpu_overhead"] = 1e3 * (self.cpu_overhead_s + self.cpu_overhead_per_seq_s * seqs)
        return out

    def seconds(self, stats: BatchStats) -> float:
        return sum(self.terms(stats).values()) / 1e3


# ---------------------------------------------------------------- tabulated as a v2 profile

def _axis(values) -> list[float]:
    return sorted({float(v) for v in values})


def tabulate(composer: StepComposer, max_tokens: int = 32768) -> dict:
    """The profile's `model` section: every term evaluated on its grid (seconds)."""
    t = composer.tables
    # the measured m of every GEMM table this model reads (bf16 for the LM head and router, and
    # the layers' FP8 table when quantised)
    m_knots = [m for m in _axis(np.concatenate([t.gemm_table(d)["m"].to_numpy()
                                                for d in {s.dtype for s in composer.shapes}]))
               if m <= max_tokens]
    model, tp = composer.model, composer.tp
    found = set(m_knots)
    if tp > 1:
        sizes = t.allreduce[t.allreduce["num_gpus"] == tp]["message_size"]
        per_token = model.hidden_size * model.dtype_bytes
        found |= {s / per_token for s in sizes if 1 <= s / per_token <= max_tokens}
        found |= {CUDA_GRAPH_MAX_TOKENS, CUDA_GRAPH_MAX_TOKENS + 1}  # graph -> eager all-reduce
    knots = sorted(found)
    layers = model.num_layers

    if model.moe is not None:  # the fused-MoE table's own token counts
        experts = t.moe_table(moe_dtype(model))["num_tokens"]
        knots = sorted(set(knots) | {float(x) for x in experts if x <= max_tokens})

    def tokens_s(T: float) -> float:
        ms = composer.linear_ms(T)
        ms += 2 * layers * composer.allreduce_ms(int(T)) + 1e3 * composer._elementwise_s_per_token * T
        return ms / 1e3

    return {
        "tokens": {"knots": knots, "seconds": [tokens_s(T) for T in knots]},
        "sequences": {"knots": m_knots, "seconds": [composer.gemm_ms("lm_head", S) / 1e3 for S in m_knots]},
        **attention_grids(composer),
        "cpu_overhead": {"per_iteration": composer.cpu_overhead_s,
                         "per_sequence": composer.cpu_overhead_per_seq_s},
    }


def attention_grids(composer: StepComposer) -> dict:
    """The decode and prefill attention terms (seconds, every attention layer) on the attention
    table's grid, for the composer's KV-cache dtype."""
    layers = composer.model.attention_layers
    batch, kv = composer.attention_axes("decode")
    chunks, length = composer.attention_axes("prefill")
    dec = [[layers * composer.decode_attention_ms(b, b * c) / 1e3 for c in kv] for b in batch]
    pre = [[layers * composer.prefill_attention_at(b, s) / 1e3 for s in length] for b in chunks]
    return {"decode_attention": {"batch": batch, "context": kv, "seconds": dec},
            "prefill_attention": {"chunks": chunks, "length": length, "seconds": pre}}


def heldout_shapes(rng: np.random.Generator, max_tokens: int, max_seqs: int, n: int = HELDOUT_SHAPES):
    """Iteration shapes as the schedulers make them, off the grids: decode-only batches, prefill-only
    (one to a few chunks, fresh or after earlier chunks), and mixed chunked batches."""
    shapes = []
    for i in range(n):
        kind = i % 3
        decodes = int(rng.integers(1, max_seqs)) if kind != 1 else 0
        ctx = int(decodes * rng.uniform(40, 6000)) if decodes else 0
        lens, contexts = [], []
        if kind != 0:
            budget = max(1, max_tokens - decodes)
            for _ in range(int(rng.integers(1, 4))):
                c = int(rng.integers(17, max(18, min(budget, 6000))))
                lens.append(c)
                contexts.append(int(rng.integers(0, 4000)) if rng.random() < 0.5 else 0)
        shapes.append(BatchStats(prefill_lens=np.array(lens, dtype=np.int64),
                                 prefill_contexts=np.array(contexts, dtype=np.int64),
                                 num_decodes=decodes, decode_context_sum=ctx + decodes))
    return shapes


def build_profile(tables: KernelTables, model: ModelSpec, hardware: HardwareSpec, tp: int, *,
                  max_tokens: int = 16384, max_seqs: int = 512, seed: int = 0,
                  cpu_overhead_s: float = DEFAULT_CPU_OVERHEAD_S,
                  cpu_overhead_per_seq_s: float = DEFAULT_CPU_OVERHEAD_PER_SEQ_S,
                  provenance: dict | None = None) -> dict:
    composers = {"auto": StepComposer(tables, model, tp, cpu_overhead_s=cpu_overhead_s,
                                      cpu_overhead_per_seq_s=cpu_overhead_per_seq_s)}
    body = tabulate(composers["auto"])
    try:  # FP8 KV cache (engine.kv_cache_dtype fp8): its own attention grids, where measured
        composers["fp8"] = StepComposer(tables, model, tp, cpu_overhead_s=cpu_overhead_s,
                                        cpu_overhead_per_seq_s=cpu_overhead_per_seq_s, kv_cache_dtype="fp8")
        body["fp8_kv_cache"] = attention_grids(composers["fp8"])
    except ValueError:
        pass
    body = _round(body)  # what is written is what is checked
    doc = {"format": FORMAT, "metadata": {}, "model": body}
    loaded = load_table_profile(Path("<memory>"), {**doc, "metadata": {
        "device": "-", "model": model.name, "tensor_parallel_size": tp}}, b"")
    errors = []
    shapes = heldout_shapes(np.random.default_rng(seed), max_tokens, max_seqs)
    for kv, composer in composers.items():
        profile = TableProfileCost(loaded, kv_cache_dtype=kv)
        for stats in shapes:
            want = composer.seconds(stats)
            errors.append(abs(profile.step_times(stats)[0] - want) / want)
    composer = composers["auto"]
    prov: dict = provenance or {}
    first_table: dict = next(iter(prov.get("tables", {}).values()), {})
    doc["metadata"] = {
        "device": first_table.get("device", "unknown"),
        "hardware": hardware.name, "model": model.name, "dtype": "bfloat16",
        "tensor_parallel_size": tp, "measured": True,
        "source": (f"{prov.get('package', 'kernel tables')} {prov.get('package_version', '')}, "
                   f"tables {_relative(tables.folder)} composed by sim/cost/composer.py").strip(),
        "tables": {k: {"csv_sha256": v["csv_sha256"], "framework_version": v["framework_version"]}
                   for k, v in prov.get("tables", {}).items()},
        "heldout_shapes": len(shapes),
        "kv_cache_dtypes": list(composers),
        "heldout_mape": round(float(np.mean(errors)), 6),
        "heldout_max_error": round(float(np.max(errors)), 6),
        "notes": composer.notes + [
            "elementwise (norms, activation, residual adds, rope) modelled as bytes / "
            "(HBM bandwidth x 0.7); kernel time only: the engine's overheads are sim/cost/overheads.py's"],
        "extrapolated": {k: int(v) for k, v in composer.extrapolated.items()},
    }
    return doc


def _relative(folder: Path | None) -> str:
    root = Path(__file__).resolve().parents[2]
    if folder is None:
        return str(folder)
    try:
        return str(Path(folder).resolve().relative_to(root))
    except (TypeError, ValueError):
        return str(folder)


def _round(v):
    """Seconds to 6 significant digits (a microsecond of a 100 ms step): smaller files."""
    if isinstance(v, float):
        return float(f"{v:.6g}")
    if isinstance(v, dict):
        return {k: _round(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_round(x) for x in v]
    return v


def compose_document(model: ModelSpec, hardware: HardwareSpec, tp: int) -> dict:
    """The v2 profile document of `model` on a preset GPU with tables (SYSTEMS), from its shipped
    tables and their provenance. ValueError where the tables cannot price the model."""
    tables = KernelTables.load(TABLES / SYSTEMS[hardware.name], hardware.hbm_bandwidth)
    assert tables.folder is not None  # (loaded from one)
    provenance = yaml.safe_load((tables.folder / "provenance.yaml").read_text())
    return build_profile(tables, model, hardware, tp, provenance=provenance)


@lru_cache(maxsize=32)
def _composed(model: ModelSpec, hardware: HardwareSpec, tp: int):
    doc = compose_document(model, hardware, tp)
    doc["metadata"]["notes"].insert(0, "composed when the scenario was loaded: the model is not a "
                                       "preset with a shipped profile")
    data = yaml.safe_dump(doc, sort_keys=False).encode()
    return load_table_profile(Path(f"<composed: {model.name} on {hardware.name}, TP {tp}>"), doc, data)


def composed_profile(model: ModelSpec, hardware: HardwareSpec, tp: int, where: str = ""):
    """The v2 profile of any model the composer covers on a preset GPU with kernel tables, composed
    now from the tables (~0.1 s; kept for the process). ScenarioError when the tables cannot price
    it (no rows for its kernels on that GPU), naming why."""
    prefix = f"{where}: " if where else ""
    if hardware.name not in SYSTEMS:
        raise ScenarioError(f"{prefix}measured: no kernel tables for {hardware.name} "
                            f"(tables: {', '.join(sorted(SYSTEMS))})")
    try:
        return _composed(model, hardware, tp)
    except ValueError as e:
        raise ScenarioError(f"{prefix}measured: {model.name} on {hardware.name} at "
                            f"tensor_parallel_size={tp} cannot be composed from the kernel tables: {e}") from None
