"""`engine.enforce_eager`: no CUDA graphs, so every kernel of an iteration is launched from Python;
and, with graphs, the iterations too large for them (`engine.max_cudagraph_capture_size`).

With CUDA graphs (vLLM's default) an iteration's kernels are replayed by one launch; eager, each
kernel costs the host a PyTorch dispatch and a launch, and the GPU cannot finish an iteration before
the host has launched all of it. An eager iteration therefore lasts at least

    launches x LAUNCH_S,   launches = layers x (KERNELS_PER_LAYER + TP_KERNELS [TP > 1]
                                                + MOE_KERNELS [an MoE layer]) + OUTSIDE_LAYERS

Stated assumptions (not fitted: the training runs all used CUDA graphs): LAUNCH_S 8 us per kernel
(PyTorch eager dispatch plus cudaLaunchKernel on a server CPU: 4-10 us is the usual range);
a Llama-style layer launches 10 kernels (fused add + RMSNorm, qkv GEMM, rotary, KV-cache write,
attention, o GEMM, fused add + RMSNorm, gate/up GEMM, SiLU x mul, down GEMM), 2 more with tensor
parallelism (the two all-reduces), 4 more in an MoE layer (router GEMM, top-k, permute, fused MoE
instead of the three MLP kernels: +4 net); 4 outside the layers (embedding, final norm, LM head,
sampling). The GPU's own time is the wrapped model's, as measured with graphs.

With CUDA graphs on, vLLM (0.32: vllm/config/vllm.py, `_set_cudagraph_sizes`) captures them for
iterations of up to `max_cudagraph_capture_size` tokens; a larger iteration runs without one, so
it too lasts at least the launch floor (`GraphLimitCost`). Unset, the limit is
min(2 x max_num_seqs x the decode query length (1 + speculative tokens), 512, or 1024 on
data-centre Blackwell), and never above max_num_batched_tokens (`capture_limit`). Stated, not
fitted: an iteration at or under the limit is priced as measured (its padding up to the next
captured size is not); one over it takes the same floor as an eager one (vLLM's compiled code
launches fewer, fused kernels than PyTorch eager: this floor is an upper bound there).
"""
from __future__ import annotations

import numpy as np

from sim.cost.batch import BatchStats
from sim.cost.step_cost import CostModel, StepCost, as_cost_model
from sim.presets.models import ModelSpec

LAUNCH_S = 8e-6          # s per kernel launched eagerly
KERNELS_PER_LAYER = 10
TP_KERNELS = 2
MOE_KERNELS = 4
OUTSIDE_LAYERS = 4


DEFAULT_CAPTURE = 512              # tokens: vLLM's default ceiling on the largest CUDA graph
BLACKWELL_CAPTURE = 1024           # ... on data-centre Blackwell (compute capability 10.x)
BLACKWELL_DATACENTER = ("b200", "b300", "gb200", "gb300")  # (the RTX PRO 6000 is 12.0: 512)


def capture_limit(given: int | None, max_num_seqs: int, max_num_batched_tokens: int, decode_query_len: int,
                  gpu: str) -> int:
    """The largest iteration, in tokens, vLLM runs from a CUDA graph: `given`
    (--max-cudagraph-capture-size) or vLLM's default, never above max_num_batched_tokens."""
    if given is None:
        ceiling = BLACKWELL_CAPTURE if gpu in BLACKWELL_DATACENTER else DEFAULT_CAPTURE
        given = min(2 * max_num_seqs * decode_query_len, ceiling)
    return min(given, max_num_batched_tokens)


def launch_floor_s(model: ModelSpec, tensor_parallel_size: int) -> float:
    """The host's time to launch one eager iteration, s."""
    moe_layers = 0 if model.moe is None else model.num_layers - model.moe.dense_layers
    per_layer = KERNELS_PER_LAYER + (TP_KERNELS if tensor_parallel_size > 1 else 0)
    launches = model.num_layers * per_layer + moe_layers * MOE_KERNELS + OUTSIDE_LAYERS
    return launches * LAUNCH_S


class EagerCost(StepCost):
    """The wrapped model's iterations, none shorter than the eager launch floor."""

    def __init__(self, inner: CostModel, floor_s: float):
        self.inner, self.floor_s = as_cost_model(inner), floor_s

    def step_times(self, stats: BatchStats, steps: int = 1) -> np.ndarray:
        return np.maximum(self.inner.step_times(stats, steps), self.floor_s)

    def step_time(self, stats: BatchStats) -> float:
        return max(self.inner.step_time(stats), self.floor_s)

    def decode_line(self, stats: BatchStats) -> tuple[float, float, int, int, float] | None:
        return None  # (a floor is not a line: decode_times below walks it)

    def decode_times(self, stats: BatchStats, steps: int) -> list[float] | None:
        times = self.inner.decode_times(stats, steps)
        if times is None:
            return [float(t) for t in self.step_times(stats, steps)]
        f = self.floor_s
        return [t if t > f else f for t in times]


class GraphLimitCost(StepCost):
    """The wrapped model's iterations, those over `limit` tokens (no CUDA graph for them) none
    shorter than the eager launch floor; those at or under it exactly the wrapped model's."""

    def __init__(self, inner: CostModel, floor_s: float, limit: int):
        self.inner, self.floor_s, self.limit = as_cost_model(inner), floor_s, limit

    def step_times(self, stats: BatchStats, steps: int = 1) -> np.ndarray:
        times = self.inner.step_times(stats, steps)
        return np.maximum(times, self.floor_s) if stats.total_tokens > self.limit else times

    def step_time(self, stats: BatchStats) -> float:
        t = self.inner.step_time(stats)
        return max(t, self.floor_s) if stats.total_tokens > self.limit else t

    def decode_line(self, stats: BatchStats) -> tuple[float, float, int, int, float] | None:
        return self.inner.decode_line(stats) if stats.total_tokens <= self.limit else None

    def decode_times(self, stats: BatchStats, steps: int) -> list[float] | None:
        if stats.total_tokens <= self.limit:
            return self.inner.decode_times(stats, steps)
        times = self.inner.decode_times(stats, steps)
        if times is None:
            return [float(t) for t in self.step_times(stats, steps)]
        f = self.floor_s
        return [t if t > f else f for t in times]


def graph_limited(inner: CostModel, floor_s: float, limit: int) -> CostModel:
    """`inner`, with the launch floor on the iterations over `limit` tokens where it can bind: the
    cheapest such iteration (limit + 1 decodes of one token of context, or one prefill chunk of
    limit + 1 tokens) already lasting the floor, step times growing with tokens, it never does,
    and `inner` is returned as it is (every step time unchanged, no call added)."""
    inner = as_cost_model(inner)
    n = limit + 1
    cheapest = min(inner.step_time(BatchStats(num_decodes=n, decode_context_sum=n)),
                   inner.step_time(BatchStats(prefill_lens=np.array([n], dtype=np.int64),
                                              prefill_contexts=np.zeros(1, dtype=np.int64))))
    return inner if cheapest >= floor_s else GraphLimitCost(inner, floor_s, limit)
