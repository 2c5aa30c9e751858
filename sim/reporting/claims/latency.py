"""Latency claims on a chat workload under Poisson arrivals: chunked prefill and TTFT, continuous
batching and TPOT under heavy load."""
from __future__ import annotations

from sim.reporting.claims.record import CONDITIONAL, ESTIMATE, FAILS, Claim, Figure
from sim.reporting.claims.scenarios import run


def _chat_n(short: bool) -> int:
    return 400 if short else 1000


def _at_rate(name: str, rate: int, n: int, *overrides: str) -> dict:
    """Summary of scenarios/claims/<name>.yaml with `n` requests arriving at `rate` req/s."""
    return run(name, f"workload.arrival.rate={rate}", f"workload.num_requests={n}", *overrides).summary


def _chat_claim(name: str, n: int, rates, prompts: str, compared: str, **fields) -> Claim:
    """A claim checked on a chat workload: its setting (`prompts` lognormal, `compared` schedulers),
    roofline basis."""
    return Claim(setting=(f"llama-3-8b, h100-sxm, roofline cost model; {n} chat requests (prompts lognormal "
                          f"{prompts}, outputs lognormal 250 +- 150), Poisson at {', '.join(map(str, rates))} "
                          f"req/s (`scenarios/claims/{name}.yaml`); {compared}"),
                 basis=ESTIMATE, **fields)


def chunked_prefill_ttft(short: bool = False) -> Claim:
    rates = (10, 22) if short else (10, 18, 22, 26)
    n = _chat_n(short)
    figs, ttft, itl = [], [], []
    for rate in rates:
        whole = _at_rate("chunked-mixed", rate, n)
        for budget in (2048, 512):
            ch = _at_rate("chunked-mixed", rate, n, "engine.scheduler=chunked",
                          f"engine.max_num_batched_tokens={budget}")
            ttft.append(ch["ttft_ms"]["p95"] / whole["ttft_ms"]["p95"] - 1)
            itl.append(ch["itl_ms"]["p95"] / whole["itl_ms"]["p95"] - 1)
            figs.append(Figure(f"{rate} req/s, budget {budget}: TTFT p95 change",
                               ttft[-1], "+%", "-50% to -70%", -60))
            figs.append(Figure(f"{rate} req/s, budget {budget}: ITL p95 change",
                               itl[-1], "+%"))
    return _chat_claim(
        "chunked-mixed", n, rates, "1000 +- 600 max 8192",
        "continuous with whole-prompt prefills (budget 10240) vs chunked (vLLM v1: decodes first, "
        "prompt chunks fill the budget)",
        key="chunked-prefill-ttft",
        claim="Chunked prefill cuts TTFT p95 by 50-70% on mixed workloads.",
        figures=tuple(figs),
        headline=f"TTFT p95 {min(ttft):+.0%} to {max(ttft):+.0%}; ITL p95 down to {min(itl):+.0%}",
        verdict=FAILS,
        conditions=("Chunking splits a prompt over several iterations, so its first token comes later: "
                    "TTFT p95 stays the same or rises (a lot with a 512-token budget near saturation). What "
                    "chunked prefill cuts is the decode stall behind long prefills: ITL p95 falls by up "
                    "to ~75% with a small budget. A TTFT cut could only come from a baseline that "
                    "admits prompts worse than whole-prompt FCFS, which this audit does not model."))


def tpot_under_load(short: bool = False) -> Claim:
    rates = (4, 20) if short else (4, 12, 20)
    n = _chat_n(short)
    figs = []
    for rate in rates:
        st = _at_rate("heavy-load", rate, n)
        co = _at_rate("heavy-load", rate, n, "engine.scheduler=continuous", "engine.max_num_seqs=256")
        figs += [Figure(f"{rate} req/s: TPOT p50, static", st["tpot_ms"]["p50"], "ms"),
                 Figure(f"{rate} req/s: TPOT p50, continuous", co["tpot_ms"]["p50"], "ms",
                        "worse than static" if rate == rates[-1] else ""),
                 Figure(f"{rate} req/s: TTFT p50, static", st["ttft_ms"]["p50"], "ms"),
                 Figure(f"{rate} req/s: TTFT p50, continuous", co["ttft_ms"]["p50"], "ms",
                        "better than static" if rate == rates[-1] else "")]
    return _chat_claim(
        "heavy-load", n, rates, "1000 +- 600", "static batches of 32 vs continuous, 256 seqs",
        key="tpot-under-load",
        claim="Continuous batching can make TPOT worse under heavy load while TTFT improves.",
        figures=tuple(figs),
        headline=f"{rates[-1]} req/s: TPOT p50 {co['tpot_ms']['p50']:.1f} ms continuous vs "
                 f"{st['tpot_ms']['p50']:.1f} ms static; TTFT p50 {co['ttft_ms']['p50']:.0f} ms vs "
                 f"{st['ttft_ms']['p50'] / 1e3:.0f} s",
        verdict=CONDITIONAL,
        conditions=("TTFT improves at every load (static requests wait for a whole batch to finish). "
                    "TPOT is better with continuous batching at light load, and worse under heavy load: "
                    "its batches grow far beyond 32 and every admission puts a prefill into the decode "
                    "iterations, while a static batch decodes alone after one prefill. 'Can' holds when "
                    "the arrival rate is well above what static batching sustains."))
