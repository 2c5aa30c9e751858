"""What an iteration costs with pipeline parallelism (vLLM's --pipeline-parallel-size S).

vLLM splits the layers into S stages on S GPU groups and keeps up to S batches in flight (V1's
batch queue), each running request in one of them at a time. servesim keeps its iteration as
"every running request advances once" and prices it as those requests spread over S microbatches
flowing through S stages:

    t_i    = stage(microbatch i) + hop(microbatch i)      one stage's work on microbatch i, s
    period = max(sum_i t_i, S x max_i t_i)

Every stage runs the S microbatches one after another, so the pipeline turns over once per
sum_i t_i when they are even; a request cannot come round again before its own microbatch has
crossed all S stages (S x t_i): with fewer requests than stages, or uneven microbatches, that
bound governs and the difference is the pipeline's bubble (one request alone: S x its stage time,
the whole model's time, while the other stages idle).

- `stage` is the scenario's cost model built for the busiest stage (sim/presets/models.pipeline_stage:
  ceil(L / S) layers, the LM head and per-iteration host overheads included), so every stage is
  priced as that one.
- Microbatches: decodes split evenly (their contexts in proportion); prefill chunks cut at
  max_num_batched_tokens (what one of vLLM's batches holds: the scheduler gives an iteration S times
  that) and spread longest first onto the microbatch with the fewest tokens so far.
- A hop sends a microbatch's hidden states (tokens x hidden_size x dtype bytes, every TP rank its own
  copy over its own link) to the next stage: over NVLink (the hardware's interconnect_bandwidth,
  2 us) while the replica fits one NVLink domain (hardware.nvlink_domain: 8 GPUs, 72 on NVL72
  racks), over the GPU's network when it spans nodes (hardware.network_bandwidth: 50 GB/s a GPU on
  H100, H200 and B200; InfiniBand's 5 us).
  Every stage is charged one (the last returns sampled tokens instead: a little over).
"""
from __future__ import annotations

import numpy as np

from sim.config.disaggregation import LINKS
from sim.config.errors import ScenarioError
from sim.cost.batch import BatchStats
from sim.cost.step_cost import CostModel, StepCost, as_cost_model

GPUS_PER_NODE = 8  # HGX/DGX boards (and MI300X platforms): 8 GPUs on one NVLink/Infinity Fabric
# (hardware.nvlink_domain says it per GPU: 72 on GB200/GB300 NVL72 racks)


def hop_link(hardware, gpus_per_replica: int) -> tuple[float, float]:
    """(bytes/s, latency s) of a stage-to-stage hop for a replica of `gpus_per_replica` GPUs: the
    GPU's NVLink within one node, its network (hardware.network_bandwidth, InfiniBand's latency)
    past it. ScenarioError where the hardware has no network figure."""
    if gpus_per_replica <= hardware.nvlink_domain:
        return hardware.interconnect_bandwidth, LINKS["nvlink"][1]
    if hardware.network_bandwidth <= 0:
        raise ScenarioError(f"{gpus_per_replica} GPUs a replica span nodes of {hardware.nvlink_domain}, and "
                            f"{hardware.name} has no network figure (hardware.network_bandwidth, bytes/s per GPU "
                            "per direction)")
    return hardware.network_bandwidth, LINKS["infiniband"][1]


class PipelineCost(StepCost):
    """An iteration of S pipeline stages over `stage`'s cost model (the module's docstring)."""

    def __init__(self, stage: CostModel, stages: int, microbatch_tokens: int, hop_s_per_token: float,
                 hop_latency_s: float):
        self.stage, self.stages = as_cost_model(stage), stages
        self.microbatch_tokens = microbatch_tokens  # max_num_batched_tokens: one vLLM batch's budget
        self.hop_s_per_token, self.hop_latency_s = hop_s_per_token, hop_latency_s

    def microbatches(self, stats: BatchStats) -> list[BatchStats]:
        """The iteration's work as at most S microbatches (empty ones left out)."""
        s, budget = self.stages, self.microbatch_tokens
        pieces: list[tuple[int, int]] = []  # (tokens, context) of each prefill piece
        for x, c in zip(stats.prefill_lens.tolist(), stats.prefill_contexts.tolist()):
            while x > budget:
                pieces.append((budget, c))
                x, c = x - budget, c + budget
            pieces.append((x, c))
        n, ctx = stats.num_decodes, stats.decode_context_sum
        decodes = [n // s + (i < n % s) for i in range(s)]
        contexts = [ctx * d // n if n else 0 for d in decodes]
        contexts[0] += ctx - sum(contexts)  # (whole tokens: the remainder to the first)
        tokens = list(decodes)
        chunks: list[list[tuple[int, int]]] = [[] for _ in range(s)]
        for x, c in sorted(pieces, key=lambda p: -p[0]):
            i = tokens.index(min(tokens))
            chunks[i].append((x, c))
            tokens[i] += x
        out = []
        for i in range(s):
            if not decodes[i] and not chunks[i]:
                continue
            lens = np.array([x for x, _ in chunks[i]], dtype=np.int64)
            ctxs = np.array([c for _, c in chunks[i]], dtype=np.int64)
            out.append(BatchStats(prefill_lens=lens, prefill_contexts=ctxs, num_decodes=decodes[i],
                                  decode_context_sum=contexts[i]))
        return out

    def step_times(self, stats: BatchStats, steps: int = 1) -> np.ndarray:
        parts = self.microbatches(stats)
        if not parts:
            return np.zeros(steps)
        # each microbatch's stage time in each of the run's iterations, its hop added: [parts, steps]
        times = np.array([self.stage.step_times(mb, steps) + (self.hop_latency_s + self.hop_s_per_token
                                                              * mb.total_tokens) for mb in parts])
        return np.maximum(times.sum(axis=0), self.stages * times.max(axis=0))

    def step_time(self, stats: BatchStats) -> float:
        return float(self.step_times(stats, 1)[0])
