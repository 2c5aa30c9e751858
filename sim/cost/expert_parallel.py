"""Expert parallelism's all-to-all, for data-parallel ranks of a MoE model (engine.data_parallel_size
with enable_expert_parallel, vLLM's DP attention + EP serving of DeepSeek-style models).

Each of the D ranks runs attention on its own requests (tensor_parallel_size GPUs, its own KV cache);
the routed experts are spread over the D x tp GPUs of the expert-parallel group. In every MoE layer a
rank sends each token's hidden state to the GPUs holding its k experts (dispatch) and gets the
results back (combine): with experts spread evenly, (G - 1) / G of those copies leave the GPU, so a
token moves

    2 x k x hidden_size x dtype_bytes x (G - 1) / G   bytes per MoE layer (dispatch + combine)

over the rank's link: NVLink (interconnect_bandwidth, 2 us a transfer) while the group fits one node
of 8 GPUs, the GPU's network past it (hardware.network_bandwidth, 5 us: sim/cost/pipeline.hop_link);
two transfers per layer, each paying the latency. What a rank's step then costs: its roofline step
with the experts' weight reads spread over the group and touched by every rank's tokens
(sim/cost/step_cost.RooflineCost's data_parallel_size), plus that time. A stated model, not measured:
vLLM runs the ranks' MoE layers in lockstep (an idle rank runs a dummy batch, the step waits for the
slowest), which this leaves out (the ranks are taken as equally loaded); the dispatch in bf16
(DeepEP can send fp8: about half).
"""
from __future__ import annotations

import numpy as np

from sim.cost.batch import BatchStats
from sim.cost.pipeline import hop_link
from sim.cost.step_cost import CostModel, StepCost, as_cost_model


def all_to_all_bytes_per_token(model, group: int) -> float:
    """Bytes one token sends and receives per MoE layer over an expert-parallel group of `group`
    GPUs (dispatch + combine)."""
    m = model.moe
    return 2 * m.experts_per_token * model.hidden_size * model.dtype_bytes * (group - 1) / group


def moe_layers(model) -> int:
    return model.num_layers - model.moe.dense_layers


class ExpertParallelCost(StepCost):
    """`inner`'s step plus the MoE layers' all-to-all for the step's tokens (module docstring)."""

    def __init__(self, inner: CostModel, model, hardware, tensor_parallel_size: int, data_parallel_size: int):
        self.inner = as_cost_model(inner)
        group = tensor_parallel_size * data_parallel_size
        bandwidth, latency = hop_link(hardware, group)
        layers = moe_layers(model)
        self.fixed_s = layers * 2 * latency                                      # s per step
        self.s_per_token = layers * all_to_all_bytes_per_token(model, group) / bandwidth  # s per token

    def _extra(self, stats: BatchStats) -> float:
        return self.fixed_s + self.s_per_token * stats.total_tokens

    def step_times(self, stats: BatchStats, steps: int = 1) -> np.ndarray:
        return self.inner.step_times(stats, steps) + self._extra(stats)

    def step_time(self, stats: BatchStats) -> float:
        return self.inner.step_time(stats) + self._extra(stats)
