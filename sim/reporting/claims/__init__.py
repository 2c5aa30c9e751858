"""The claims audit (issue 5): statements about LLM serving that circulate in articles and talks,
re-derived with the simulator and given a verdict.

Each claim is a function returning a `Claim` record (`record.py`): the statement, the setting it was
checked in (model, GPU, cost model, workload), the claimed and simulated numbers, a verdict from
`VERDICTS` and the conditions that make it true or false. The claims live by topic in `toys.py`,
`batching.py`, `kv.py` and `latency.py`; the scenarios in `scenarios/claims/`; `render` turns the
records into `docs/claims.md`:

    python -m sim.reporting.claims --out docs/claims.md [--short]

`short=True` runs fewer requests and sweep points (for notebooks and CI); the committed
`docs/claims.md` is the full run. Roofline numbers are estimates from datasheet peaks, not
measurements on hardware.
"""
from __future__ import annotations

from sim.reporting.claims.batching import (
    anyscale_23x,
    continuous_speedup,
    gpu_utilization,
    occupancy,
    orca_36x,
    static_idle_share,
)
from sim.reporting.claims.kv import (
    kv_16kb_per_token,
    kv_70b_40gb,
    kv_bytes_per_token,
    kv_contiguous_waste,
    kv_paged_waste,
    paged_tail_waste,
    vllm_paged_speedup,
)
from sim.reporting.claims.latency import chunked_prefill_ttft, tpot_under_load
from sim.reporting.claims.record import ARITHMETIC, CONDITIONAL, ESTIMATE, FAILS, HOLDS, UNIT, VERDICTS, Claim, Figure
from sim.reporting.claims.render import claims_frame, fmt, render, render_claim
from sim.reporting.claims.saturation import SATURATION_SETTING, SATURATION_WORKLOADS, saturation
from sim.reporting.claims.scenarios import SCENARIOS, run, trace_lengths
from sim.reporting.claims.toys import (
    TOY_SETTING,
    expected_static_utilization,
    lower_bound_steps,
    toy_default_rng,
    toy_fixed_lengths,
    toy_random_seed0,
    uniform_static_utilization,
)

CLAIMS = (toy_random_seed0, toy_default_rng, toy_fixed_lengths, uniform_static_utilization,
          static_idle_share, continuous_speedup, anyscale_23x, orca_36x, gpu_utilization,
          kv_contiguous_waste, kv_paged_waste, vllm_paged_speedup, chunked_prefill_ttft,
          kv_16kb_per_token, kv_70b_40gb, tpot_under_load)


def run_all(short: bool = False) -> list[Claim]:
    return [f(short) for f in CLAIMS]


__all__ = [
    "ARITHMETIC", "CLAIMS", "CONDITIONAL", "ESTIMATE", "FAILS", "HOLDS", "SATURATION_SETTING",
    "SATURATION_WORKLOADS", "SCENARIOS", "TOY_SETTING", "UNIT", "VERDICTS", "Claim", "Figure",
    "anyscale_23x", "chunked_prefill_ttft", "claims_frame", "continuous_speedup",
    "expected_static_utilization", "fmt", "gpu_utilization", "kv_16kb_per_token", "kv_70b_40gb",
    "kv_bytes_per_token", "kv_contiguous_waste", "kv_paged_waste", "lower_bound_steps", "occupancy",
    "orca_36x", "paged_tail_waste", "render", "render_claim", "run", "run_all", "saturation",
    "static_idle_share", "tpot_under_load", "toy_default_rng", "toy_fixed_lengths", "toy_random_seed0",
    "trace_lengths", "uniform_static_utilization", "vllm_paged_speedup",
]
