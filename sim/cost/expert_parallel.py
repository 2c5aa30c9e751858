"""Expert parallelism's all-to-all, for data-parallel ranks of a MoE model (engine.data_parallel_size
with enable_expert_parallel, vLLM's DP attention + EP serving of DeepSeek-style models).

Each of the D ranks runs attention on its own requests (tensor_parallel_size GPUs, its own KV cache);
the routed experts are spread over the G = D x tp GPUs of the expert-parallel group. In every MoE
layer a rank's tokens reach the GPUs holding their experts and come back, as vLLM's
`--all2all-backend` (engine.all2all_backend) does it:

- `allgather_reducescatter` (vLLM's default): every rank all-gathers the hidden states of all D
  ranks' tokens and reduce-scatters the results: with the ranks equally loaded a token of its own
  costs a rank 2 x (D - 1) x hidden_size x dtype_bytes bytes a MoE layer (DeepSeek-V3 at DP8:
  2 x 7 x 7,168 x 2 = 200,704 B);
- `deepep_high_throughput`, `deepep_low_latency` (DeepEP's kernels): each token is sent to the GPUs
  of its k experts only (dispatch) and its results come back (combine): 2 x k x hidden_size x
  dtype_bytes x (G - 1) / G bytes a MoE layer when estimated. **Measured** where NVIDIA
  AIConfigurator timed DeepEP on the GPU at this group size and expert shape
  (sim/tables/<gpu>/moe_a2a.csv: dispatch + combine at the rank's tokens, vLLM 0.24; on one node):
  DeepSeek-V3 at EP8 on H100, H200, B200, B300, GB300 (GB200: EP4). DeepEP's fixed costs dwarf the
  bytes: one low-latency dispatch and combine of DeepSeek-V3 at EP8 on H200 take ~100 us at 1 to 32
  tokens, where the bytes alone would cross NVLink in under a microsecond.

An estimated transfer crosses the rank's link: NVLink (interconnect_bandwidth, 2 us) while the group
fits one NVLink domain (hardware.nvlink_domain), the GPU's network past it (network_bandwidth, 5 us:
sim/cost/pipeline.hop_link); two transfers a layer, each paying the latency. What a rank's step then
costs: its roofline step with the experts' weight reads spread over the group and touched by every
rank's tokens (sim/cost/step_cost.RooflineCost's data_parallel_size), plus that time. vLLM runs the
ranks' MoE layers in lockstep (an idle rank runs a dummy batch, the step waits for the slowest),
which this leaves out (the ranks are taken as equally loaded); the dispatch in bf16.
"""
from __future__ import annotations

from collections import Counter
from functools import lru_cache

import numpy as np
import pandas as pd

from sim.cost.batch import BatchStats
from sim.cost.pipeline import hop_link
from sim.cost.step_cost import CostModel, StepCost, as_cost_model

# engine.all2all_backend -> moe_a2a.csv's comm_backend (DeepEP's high-throughput and low-latency kernels)
MEASURED_BACKENDS = {"deepep_high_throughput": "deepep_ht", "deepep_low_latency": "deepep_ll"}


def all_to_all_bytes_per_token(model, group: int) -> float:
    """Bytes one token sends and receives per MoE layer over an expert-parallel group of `group`
    GPUs (DeepEP: dispatch to its k experts' GPUs + combine)."""
    m = model.moe
    return 2 * m.experts_per_token * model.hidden_size * model.dtype_bytes * (group - 1) / group


def allgather_bytes_per_token(model, ranks: int) -> float:
    """Bytes per token of a rank's own per MoE layer with allgather_reducescatter over `ranks`
    data-parallel ranks: it receives the other ranks' hidden states (all-gather) and as many back
    (reduce-scatter), the ranks equally loaded."""
    return 2 * (ranks - 1) * model.hidden_size * model.dtype_bytes


def moe_layers(model) -> int:
    return model.num_layers - model.moe.dense_layers


class MeasuredAllToAll:
    """DeepEP's dispatch + combine of one MoE layer at a rank's tokens, ms as timed (moe_a2a.csv
    rows of one backend, group size and expert shape). ValueError where there are none."""

    def __init__(self, frame: pd.DataFrame, model, backend: str, group: int):
        from sim.cost.composer import _Curve  # (the composer's monotone piecewise-linear lookup)

        m = model.moe
        rows = frame[(frame["comm_backend"] == MEASURED_BACKENDS[backend]) & (frame["ep_size"] == group)
                     & (frame["node_num"] == 1) & (frame["hidden_size"] == model.hidden_size)
                     & (frame["topk"] == m.experts_per_token) & (frame["num_experts"] == m.num_experts)]
        phases = {ph: g for ph, g in rows.groupby("phase")}
        if set(phases) != {"dispatch", "combine"}:
            raise ValueError(f"no {backend} rows at EP{group} for hidden {model.hidden_size}, top-"
                             f"{m.experts_per_token} of {m.num_experts} experts")
        self._curves = [_Curve(g["num_tokens"].to_numpy(), g["latency_ms"].to_numpy()) for g in phases.values()]
        self.extrapolated: Counter = Counter()

    def layer_s(self, tokens: int) -> float:
        """One MoE layer's dispatch and combine for `tokens` tokens of the rank, seconds."""
        return sum(c(tokens, self.extrapolated, "all-to-all tokens") for c in self._curves) / 1e3


@lru_cache(maxsize=32)
def measured_all_to_all(model, hardware, backend: str, group: int):
    """The measured DeepEP timings of `backend` for this model and group on a preset GPU with tables,
    and None with why where there are none. Kept for the process (asked when a scenario loads and for
    each run built)."""
    from pathlib import Path

    from sim.cost.composer import SYSTEMS, TABLES  # (the one place preset and tables meet)
    from sim.presets.hardware import is_preset

    if backend not in MEASURED_BACKENDS:
        return None, f"{backend} is not measured (DeepEP's backends are)"
    if not is_preset(hardware) or hardware.name not in SYSTEMS:
        return None, f"no kernel tables for {hardware.name}"
    path = Path(TABLES) / SYSTEMS[hardware.name] / "moe_a2a.csv"
    if not path.is_file():
        return None, f"no all-to-all table for {hardware.name}"
    try:
        return MeasuredAllToAll(pd.read_csv(path), model, backend, group), None
    except ValueError as e:
        return None, str(e)


class ExpertParallelCost(StepCost):
    """`inner`'s step plus the MoE layers' all-to-all for the step's tokens (module docstring)."""

    def __init__(self, inner: CostModel, model, hardware, tensor_parallel_size: int, data_parallel_size: int,
                 backend: str = "allgather_reducescatter"):
        self.inner = as_cost_model(inner)
        group = tensor_parallel_size * data_parallel_size
        self.layers = moe_layers(model)
        self.measured, _ = measured_all_to_all(model, hardware, backend, group)
        bandwidth, latency = hop_link(hardware, group)
        per_token = (allgather_bytes_per_token(model, data_parallel_size) if backend == "allgather_reducescatter"
                     else all_to_all_bytes_per_token(model, group))
        self.fixed_s = self.layers * 2 * latency                      # s per step (estimated)
        self.s_per_token = self.layers * per_token / bandwidth         # s per token (estimated)

    def _extra(self, stats: BatchStats) -> float:
        if self.measured is not None:
            return self.layers * self.measured.layer_s(stats.total_tokens)
        return self.fixed_s + self.s_per_token * stats.total_tokens

    def step_times(self, stats: BatchStats, steps: int = 1) -> np.ndarray:
        return self.inner.step_times(stats, steps) + self._extra(stats)

    def step_time(self, stats: BatchStats) -> float:
        return self.inner.step_time(stats) + self._extra(stats)
