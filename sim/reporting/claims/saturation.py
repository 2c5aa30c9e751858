"""The saturation sweep: Llama-2-7B on an H100 with every request at t = 0, four output mixes,
continuous batching against static batches of several sizes. Shared by the batching and KV claims."""
from __future__ import annotations

from functools import cache

from sim.reporting.claims.record import ESTIMATE, Claim
from sim.reporting.claims.scenarios import run
from sim.simulate import SimResult

SATURATION_WORKLOADS = {  # name -> overrides of saturation-llama2-7b.yaml (prompts 512 unless set)
    "fixed 128": ("workload.output_tokens={dist: fixed, value: 128}",),
    "uniform 1..256": ("workload.output_tokens={dist: uniform, low: 1, high: 256}",),
    "lognormal 128 +- 256": ("workload.output_tokens={dist: lognormal, mean: 128, std: 256, max: 2048}",),
    "decode-heavy chat": ("workload.prompt_tokens={dist: lognormal, mean: 160, std: 200, max: 2048}",
                          "workload.output_tokens={dist: lognormal, mean: 340, std: 400, max: 2048}"),
}
SATURATION_SETTING = ("llama-2-7b (MHA, 512 KiB of KV per token), h100-sxm, roofline cost model; {n} "
                      "requests at t = 0 (saturation) of four workloads "
                      "(`scenarios/claims/saturation-llama2-7b.yaml` + overrides): 512-token prompts with "
                      "outputs fixed 128 / uniform 1..256 / lognormal mean 128 std 256 max 2048, and a "
                      "decode-heavy chat mix (prompts lognormal 160 +- 200, outputs lognormal 340 +- 400, "
                      "both max 2048); continuous: 256 seqs, paged KV (~108k tokens); static: batch size "
                      "B, KV reserved contiguously for the padded prompt + the longest output")


def saturation_n(short: bool) -> int:
    return 1000 if short else 4000


def saturation_run(name: str, short: bool, *overrides: str) -> SimResult:
    """One workload of the sweep (continuous unless the overrides say otherwise)."""
    return run("saturation-llama2-7b", f"workload.num_requests={saturation_n(short)}",
               *SATURATION_WORKLOADS[name], *overrides)


@cache
def saturation(short: bool = False) -> dict:
    """{workload: {"continuous": result, B: static result}} for the saturation sweep."""
    sizes = (1, 32) if short else (1, 8, 32, 256)
    out = {}
    for name in SATURATION_WORKLOADS:
        row: dict[str | int, SimResult] = {"continuous": saturation_run(name, short)}
        for b in sizes:
            row[b] = saturation_run(name, short, "engine.scheduler=static", f"engine.max_num_seqs={b}")
        out[name] = row
    return out


def ratios(short: bool) -> dict:
    """(output dist, B) -> continuous / static output throughput."""
    return {(name, b): row["continuous"].summary["output_throughput"] / r.summary["output_throughput"]
            for name, row in saturation(short).items() for b, r in row.items() if b != "continuous"}


def saturation_claim(short: bool, setting_more: str = "", **fields) -> Claim:
    """A claim checked on the saturation sweep: its setting (plus `setting_more`), roofline basis."""
    return Claim(setting=SATURATION_SETTING.format(n=saturation_n(short)) + setting_more,
                 basis=ESTIMATE, **fields)
