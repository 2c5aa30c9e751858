"""Static against continuous batching at saturation: idle rows, throughput ratios (3-5x, 23x,
36.9x) and utilisation."""
from __future__ import annotations

from sim.reporting.claims.record import CONDITIONAL, Claim, Figure, pct
from sim.reporting.claims.saturation import ratios, saturation, saturation_claim
from sim.reporting.claims.scenarios import run
from sim.simulate import SimResult

CHAT_AT_8 = "; {what} the chat workload of `scenarios/claims/heavy-load.yaml` ({how}) at 8 req/s"


def occupancy(result: SimResult) -> float:
    """Share of the formed batch's rows computing a useful token, over decode iterations. Unlike
    `slot_utilization` (over max_num_seqs) it does not count seats that memory never let fill."""
    s = result.steps
    d = s[s["prefill_tokens"] == 0]
    rows = ((d["num_seqs"] + d["padded_tokens"]) * d["count"]).sum()
    return float((d["num_seqs"] * d["count"]).sum() / rows) if rows else 0.0


def _chat_at_8() -> SimResult:
    """The chat workload of heavy-load.yaml (static, B = 32) at 8 req/s."""
    return run("heavy-load", "workload.arrival.rate=8")


def _span(values) -> str:
    values = list(values)
    return f"{min(values):.1f}-{max(values):.1f}x" if len(values) > 1 else f"{values[0]:.1f}x"


def _by_baseline(short: bool) -> tuple[dict, dict, dict]:
    """The sweep's continuous / static ratios: all, against B = 1, against B > 1."""
    r = ratios(short)
    return r, {k: x for k, x in r.items() if k[1] == 1}, {k: x for k, x in r.items() if k[1] > 1}


def _largest(short: bool, claimed: str, value: float) -> tuple[tuple[Figure, Figure], str]:
    """The largest ratio of the sweep and the largest against B > 1, as figures and a headline."""
    r, _, batched = _by_baseline(short)
    best, top = max(r, key=lambda k: r[k]), max(batched, key=lambda k: batched[k])
    figs = (Figure(f"largest ratio in the sweep ({best[0]}, B = {best[1]})", r[best], "x", claimed, value),
            Figure(f"largest against B > 1 ({top[0]}, B = {top[1]})", batched[top], "x", claimed, value))
    return figs, f"up to {r[best]:.1f}x against B = 1; at most {batched[top]:.1f}x against B > 1"


def static_idle_share(short: bool = False) -> Claim:
    sat = saturation(short)
    b = 32
    figs = []
    for name, row in sat.items():
        figs.append(Figure(f"{name}, B = {b}: idle rows (1 - occupancy)", 1 - occupancy(row[b]), "%",
                           "60-80%", 70))
        figs.append(Figure(f"{name}, B = {b}: padding_waste (padded / computed tokens)",
                           row[b].summary["padding_waste"], "%"))
    chat = _chat_at_8()
    figs.append(Figure("chat workload (heavy-load.yaml, 8 req/s), B = 32: idle rows", 1 - occupancy(chat), "%",
                       "60-80%", 70))
    return saturation_claim(
        short, CHAT_AT_8.format(what="plus", how="llama-3-8b, lognormal prompts 1000 +- 600, outputs 250 +- 150"),
        key="static-idle-share",
        claim="Static batching leaves 60-80% of compute on padding / idle slots.",
        figures=tuple(figs),
        headline="idle rows at B = 32: " + ", ".join(f"{name} {pct(1 - occupancy(row[b]))}"
                                                     for name, row in sat.items())
                 + f"; chat at 8 req/s {pct(1 - occupancy(chat))}",
        verdict=CONDITIONAL,
        conditions=("The idle share is 1 - E[mean]/E[max] of a batch's output lengths: 0% with equal "
                    "lengths, ~50% with uniform lengths, 60-90% only with heavy-tailed lengths (a few "
                    "long outputs hold every batch open). Counted in computed tokens (padding_waste) it is "
                    "smaller when prompts have equal lengths (a prompt is computed once, all of it real) "
                    "and similar when prompts vary too (each is padded to the batch's longest)."))


def continuous_speedup(short: bool = False) -> Claim:
    r, unbatched, batched = _by_baseline(short)
    return saturation_claim(
        short,
        key="continuous-speedup",
        claim="Continuous batching gives 3-5x the throughput of static batching on an H100.",
        figures=tuple(Figure(f"{name}, static B = {b}", x, "x", "3-5x", 4) for (name, b), x in r.items()),
        headline=f"{_span(batched.values())} against static B > 1; {_span(unbatched.values())} against B = 1",
        verdict=CONDITIONAL,
        conditions=("The ratio is set by the workload and the static baseline, not by the GPU. Against "
                    f"batched static serving (B > 1) it spans {_span(batched.values())} here. With equal "
                    "output lengths and a static batch as large as memory allows there is no gain (~1x; "
                    "continuous even loses a little to preemption recomputes). 3-5x needs varied lengths "
                    "and a moderate static batch (uniform lengths, B = 8-32). Heavy-tailed or decode-heavy "
                    "workloads go past 10x: the static batch reserves KV for the longest output, so few "
                    "rows fit, and a few long outputs keep each batch open while most rows idle. Against "
                    f"unbatched serving (B = 1) it is {_span(unbatched.values())}."))


def anyscale_23x(short: bool = False) -> Claim:
    r, unbatched, batched = _by_baseline(short)
    top = max(batched, key=lambda k: batched[k])
    largest, headline = _largest(short, "up to 23x", 23)
    return saturation_claim(
        short,
        key="anyscale-23x",
        claim="Anyscale measured up to 23x throughput with continuous batching (vLLM) over static batching.",
        figures=(*largest, *(Figure(f"{name}, static B = {b}", x, "x")
                             for (name, b), x in r.items() if b in (1, 8, 32))),
        headline=headline,
        verdict=CONDITIONAL,
        conditions=("23x and more appears against unbatched serving (B = 1: "
                    f"{_span(unbatched.values())}); against a batched static server "
                    f"the largest ratio here is {batched[top]:.1f}x ({top[0]}, B = {top[1]}), reached "
                    "because its contiguous reservation of the longest output lets few rows fit. 'Up to' "
                    "is the best case of a sweep that includes a weak baseline, not what a tuned static "
                    "server loses. Llama-2-7B on an H100 with a roofline cost model is not Anyscale's "
                    "model or hardware."))


def orca_36x(short: bool = False) -> Claim:
    _, _, batched = _by_baseline(short)
    largest, headline = _largest(short, "36.9x", 36.9)
    return saturation_claim(
        short,
        key="orca-36x",
        claim="Orca reported up to 36.9x throughput over prior systems.",
        figures=largest,
        headline=headline,
        verdict=CONDITIONAL,
        conditions=(f"Ratios of 36.9x or more appear here only against unbatched serving (B = 1) on a "
                    f"decode-heavy workload; against any batched static baseline the largest is "
                    f"{max(batched.values()):.1f}x. Orca's figure compares GPT-3 175B with FasterTransformer at "
                    f"equal latency, where the static system must shrink its batch to meet the latency "
                    f"target: a setting this audit does not simulate. As a throughput ratio at "
                    f"saturation against a batched server it does not hold here."))


def _occupancy_figures(name: str, static: SimResult, continuous: SimResult) -> list[Figure]:
    """Row occupancy, MFU and MBU of one saturation workload, static B = 32 and continuous."""
    figs = [Figure(f"{name}, static B = 32: row occupancy", occupancy(static), "%", "30-40%", 35),
            Figure(f"{name}, continuous: slot occupancy of 256", continuous.summary["slot_utilization"], "%",
                   "75-85%", 80)]
    for metric in ("mfu", "mbu"):
        figs += [Figure(f"{name}, static B = 32: {metric.upper()}", static.summary[metric], "%"),
                 Figure(f"{name}, continuous: {metric.upper()}", continuous.summary[metric], "%")]
    return figs


def gpu_utilization(short: bool = False) -> Claim:
    sat = saturation(short)
    names = ("uniform 1..256", "decode-heavy chat")
    figs = [f for name in names for f in _occupancy_figures(name, sat[name][32], sat[name]["continuous"])]
    chat = _chat_at_8().summary
    figs.append(Figure("chat workload, static B = 32, 8 req/s: slot_utilization", chat["slot_utilization"], "%",
                       "30-40%", 35))
    static = " / ".join(pct(occupancy(sat[n][32])) for n in names)
    continuous = " / ".join(pct(sat[n]["continuous"].summary["slot_utilization"]) for n in names)
    mfu = " / ".join(pct(sat[n]["continuous"].summary["mfu"]) for n in names)
    return saturation_claim(
        short, CHAT_AT_8.format(what="and", how="llama-3-8b, h100-sxm, roofline"),
        key="gpu-utilization",
        claim="GPU utilization rises from 30-40% (static batching) to 75-85% (continuous batching).",
        figures=tuple(figs),
        headline=(f"slot occupancy (uniform 1..256 / decode-heavy chat): static B = 32 {static} "
                  f"(chat {pct(chat['slot_utilization'])}), continuous {continuous}; continuous MFU {mfu}"),
        verdict=CONDITIONAL,
        conditions=("Only if 'utilization' means batch-slot occupancy, and only roughly. Static batches "
                    "keep 20-50% of their rows busy (30-40% for the chat workload at 8 req/s), and "
                    "continuous batching at saturation fills 65-70% of its 256 seats here: KV memory "
                    "(~108k tokens for Llama-2-7B) and the drain at the end of the burst keep it from "
                    "filling all of them. Compute (MFU) stays far below 75% in decode-heavy serving, "
                    "because each decode iteration reads every weight for one token per sequence; "
                    "bandwidth (MBU) is high for both, static included, since padded rows read KV too."))
