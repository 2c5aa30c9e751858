"""`engine.enforce_eager`: no CUDA graphs, so every kernel of an iteration is launched from Python.

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
