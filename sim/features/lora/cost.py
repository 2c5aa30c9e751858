"""What multi-LoRA serving adds to an iteration (engine.lora; the scheduler's part: sim/features/lora/slots.py).

An adapter of rank r on every linear layer of a dense model holds r x (in + out) weights per
projection (q, k, v, o, gate, up, down), per layer: `adapter_bytes` below (Llama-3-8B at r = 16:
83,886,080 bytes; sim/presets/memory.py, which also sets aside max_loras of them on every GPU).
With tensor parallelism each GPU keeps 1/TP of it. Per iteration:
- **loads**: an adapter new to the GPU's slots is copied from host memory first, over the host link:
  its bytes per GPU / hardware.host_bandwidth each, before the forward pass (vLLM activates a batch's
  adapters synchronously);
- **kernels** (vLLM's punica shrink/expand): every distinct adapter in the batch read once from HBM
  (its bytes per GPU / hbm_bandwidth) and 2 x r x sum(in + out) x layers / TP FLOPs a token at the
  bf16 peak, the two added (separate kernels, each at its peak: a floor, not a fit).
A stated model, not measured: the kernels' efficiency on real GPUs is not known here.
"""
from __future__ import annotations

import numpy as np

from sim.cost.batch import BatchStats
from sim.cost.step_cost import CostModel, StepCost, as_cost_model
from sim.presets.memory import lora_adapter_bytes as adapter_bytes
from sim.presets.memory import lora_dims


class LoRACost(StepCost):
    """`inner`'s step plus the adapters' loads and kernels (module docstring)."""

    def __init__(self, inner: CostModel, model, hardware, tensor_parallel_size: int, rank: int):
        self.inner = as_cost_model(inner)
        per_gpu = adapter_bytes(model, rank) / tensor_parallel_size
        self.load_s = per_gpu / hardware.host_bandwidth if hardware.host_bandwidth > 0 else 0.0
        self.read_s = per_gpu / hardware.hbm_bandwidth
        self.s_per_token = 2 * rank * lora_dims(model) * model.num_layers / tensor_parallel_size / hardware.bf16_flops

    def _extra(self, stats: BatchStats) -> float:
        return stats.lora_adapters * self.read_s + stats.total_tokens * self.s_per_token

    def step_times(self, stats: BatchStats, steps: int = 1) -> np.ndarray:
        out = self.inner.step_times(stats, steps)
        if not stats.lora_adapters:
            return out
        out = out + self._extra(stats)
        if stats.lora_loads:  # (the first iteration only: the slots hold them after)
            out[0] += stats.lora_loads * self.load_s
        return out

    def step_time(self, stats: BatchStats) -> float:
        return float(self.step_times(stats, 1)[0])

    def decode_line(self, stats: BatchStats) -> tuple[float, float, int, int, float] | None:
        return None if stats.lora_adapters else self.inner.decode_line(stats)

    def decode_times(self, stats: BatchStats, steps: int) -> list[float] | None:
        return None if stats.lora_adapters else self.inner.decode_times(stats, steps)
