"""A run in other tools' formats: a Chrome / Perfetto trace, and a `vllm bench serve` result JSON.

    chrome_trace(run, max_requests=5000) -> dict   # json.dump it; open in ui.perfetto.dev
    vllm_bench(run, workload=None) -> dict          # the layout `vllm bench serve --save-result
                                                    # --save-detailed` writes; servesim reads it back

Both take a `sim.reporting.analysis.Run` (a run folder loaded with `load_run`, or
`Run.from_result` of a simulation).
"""
from __future__ import annotations

import math
from datetime import datetime, timezone

import numpy as np

from sim.reporting.analysis import Run

US = 1e6  # the trace format counts microseconds


def chrome_trace(run: Run, max_requests: int = 5000) -> dict:
    """Trace Event Format: one process per replica with its iterations as slices (a fast-forwarded
    run of identical decode iterations is one slice, `count` in its args) and counters of KV blocks
    in use and requests waiting; one process "requests" with a track per request (its first
    `max_requests` by id) holding queue, prefill and decode slices."""
    steps, rq = run.steps, run.requests
    events: list[dict] = []
    replicas = run.replicas
    for r in range(replicas):
        events.append({"ph": "M", "pid": r, "name": "process_name", "args": {"name": f"replica {r}"}})
        events.append({"ph": "M", "pid": r, "name": "process_sort_index", "args": {"sort_index": r}})
        events.append({"ph": "M", "pid": r, "tid": 0, "name": "thread_name", "args": {"name": "iterations"}})
    cols = ("replica", "start_s", "duration_s", "count", "num_seqs", "prefill_tokens", "decode_tokens",
            "kv_blocks_used", "waiting")
    for rep, start, dur, count, seqs, pre, dec, kv, wait in zip(*(steps[c].tolist() for c in cols)):
        rep, count = int(rep), int(count)
        name = f"{int(seqs)} seqs: {int(pre)} prefill + {int(dec)} decode tokens"
        if count > 1:
            name = f"{count} x ({name})"
        events.append({"ph": "X", "pid": rep, "tid": 0, "name": name, "ts": start * US, "dur": dur * US,
                       "args": {"iterations": count, "num_seqs": int(seqs), "prefill_tokens": int(pre),
                                "decode_tokens": int(dec)}})
        events.append({"ph": "C", "pid": rep, "name": "KV blocks used", "ts": start * US, "args": {"blocks": int(kv)}})
        events.append({"ph": "C", "pid": rep, "name": "waiting", "ts": start * US, "args": {"requests": int(wait)}})
    pid = replicas
    events.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": "requests"}})
    events.append({"ph": "M", "pid": pid, "name": "process_sort_index", "args": {"sort_index": pid}})
    shown = rq.iloc[:max_requests]
    request_cols = ("request_id", "arrival_s", "first_token_s", "finish_s", "queue_s", "prompt_tokens",
                    "output_tokens", "replica")
    for rid, arrival, first, finish, queue, prompt, output, replica in zip(*(shown[c].tolist() for c in request_cols)):
        rid = int(rid)
        events.append({"ph": "M", "pid": pid, "tid": rid, "name": "thread_name", "args": {"name": f"request {rid}"}})
        # tracks in request order (viewers sort by name otherwise: 0, 1, 10, 100, ...)
        events.append({"ph": "M", "pid": pid, "tid": rid, "name": "thread_sort_index", "args": {"sort_index": rid}})
        scheduled = arrival + queue if not math.isnan(queue) else math.nan
        args = {"prompt_tokens": int(prompt), "output_tokens": int(output), "replica": int(replica)}
        for name, a, b in (("queue", arrival, scheduled), ("prefill", scheduled, first), ("decode", first, finish)):
            if not (math.isnan(a) or math.isnan(b)) and b >= a:
                events.append({"ph": "X", "pid": pid, "tid": rid, "name": name, "ts": a * US, "dur": (b - a) * US,
                               "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"scenario": run.summary.get("scenario"), "requests_shown": len(shown),
                          "requests": len(rq), "source": "servesim"}}


def _dist(summary: dict, key: str, ms: np.ndarray) -> dict:
    """summary.json's mean, p50, p90, p95, p99 of `key` (ms) under vLLM's names (as `--percentile-metrics
    ... --metric-percentiles 90,95,99` writes them), and std_ from the values `ms` (numpy's std, as
    vLLM takes it; None without values)."""
    d = summary.get(key) or {}
    name = key[:-3]
    ms = ms[np.isfinite(ms)]
    return {f"mean_{name}_ms": d.get("mean"), f"median_{name}_ms": d.get("p50"),
            f"std_{name}_ms": float(np.std(ms)) if len(ms) else None,
            **{f"p{p}_{name}_ms": d.get(f"p{p}") for p in (90, 95, 99)}}


def request_itls(run: Run) -> list[list[float] | None]:
    """Each request's inter-token gaps (s), as vLLM's `itls` holds them: the output_tokens - 1
    iterations of its replica after the one of its first token, one token each. A fast-forwarded
    row of `count` iterations is split evenly (each gap: the row's mean iteration; decode
    iterations' costs within a row differ by a KV block's reads at a time). A request's times carry
    the engine's request handling (summary's engine_overheads: the frontend, and one iteration
    when it joined late), so its first token's iteration is found as the latest that ends at or
    before first_token_s less the frontend time and begins a run of iterations spanning exactly its
    decode time, finish_s - first_token_s. None for a request whose tokens did not come one per
    iteration (preempted mid-decode and recomputed; several per iteration under speculative
    decoding), or that did not finish."""
    steps, rq = run.steps, run.requests
    overheads = ((run.summary.get("run") or {}).get("cost_model") or {}).get("engine_overheads") or {}
    frontend_s = float(overheads.get("frontend_s") or 0.0)
    per_prompt_token_s = float(overheads.get("frontend_per_prompt_token_s") or 0.0)
    ends_by_replica = {}
    for rep, rows in steps.groupby("replica", sort=True):
        count = rows["count"].to_numpy(dtype=np.int64)
        start = np.repeat(rows["start_s"].to_numpy(), count)
        per = np.repeat(rows["duration_s"].to_numpy() / count, count)
        k = np.arange(len(start)) - np.repeat(np.cumsum(count) - count, count) + 1  # 1..count within a row
        ends_by_replica[int(rep)] = start + per * k
    out: list[list[float] | None] = []
    cols = ("replica", "first_token_s", "finish_s", "output_tokens", "prompt_tokens")
    # a run whose request times spread (frontend_cv, stalls: sim/cost/overheads.py) records each
    # request's frontend time and the engine pauses in its decode; a pause is spread over the
    # request's gaps (its summary's ITL, from the iterations, holds none either)
    own_front = rq["frontend_s"].tolist() if "frontend_s" in rq else None
    stalls = rq["stall_s"].tolist() if "stall_s" in rq else None
    for i, (rep, first, finish, n, prompt) in enumerate(zip(*(rq[c].tolist() for c in cols))):
        ends = ends_by_replica.get(int(rep))
        gaps = int(n) - 1
        if ends is None or not (math.isfinite(first) and math.isfinite(finish)):
            out.append(None)
        elif gaps == 0:
            out.append([])
        else:
            front = own_front[i] if own_front is not None else frontend_s + per_prompt_token_s * prompt
            stall = stalls[i] if stalls is not None and math.isfinite(stalls[i]) else 0.0
            found = _itls(ends, first - front, finish - first - stall, gaps)
            out.append(found if found is None or not stall else [g + stall / gaps for g in found])
    return out


def _itls(ends: np.ndarray, engine_first: float, decode_s: float, gaps: int) -> list[float] | None:
    """The gaps after the latest iteration j ending at or before `engine_first` (or up to 2 s
    before it: the late-join iteration) with ends[j + gaps] - ends[j] = decode_s; None when
    there is none."""
    hi = int(np.searchsorted(ends, engine_first + 1e-9, side="right")) - 1
    lo = max(int(np.searchsorted(ends, engine_first - 2.0, side="left")), 0)  # (no iteration lasts 2 s here)
    if hi < lo or hi + gaps >= len(ends):
        return None
    js = np.arange(hi, lo - 1, -1)
    js = js[js + gaps < len(ends)]
    spans = ends[js + gaps] - ends[js]
    # exact but for float rounding: a request's first and last tokens end rows of steps.csv (its
    # prefill's iteration, and the batch change its finish makes), so a span one iteration off, as
    # similar as decode iterations are, is told apart
    match = np.flatnonzero(np.abs(spans - decode_s) <= 1e-9 * max(1.0, abs(engine_first) + decode_s))
    if not len(match):
        return None
    j = int(js[match[0]])
    return np.diff(ends[j:j + gaps + 1]).tolist()


def vllm_bench(run: Run, workload: dict | None = None) -> dict:
    """The run as `vllm bench serve --save-result --save-detailed` writes a benchmark: per request
    input_lens, output_lens, start_times (arrival, s), ttfts and itls (s; request_itls); the
    aggregate metrics with vLLM's keys (mean_/median_/std_/p90_/p95_/p99_ of ttft, tpot, itl, e2el
    in ms), request_goodput when the run had an SLO. `workload` (the scenario's resolved workload
    section: a run folder's scenario.yaml) gives request_rate and burstiness (vLLM's gamma shape,
    1/cv^2) of a generated arrival process, and max_concurrency of a closed loop's users; without
    it, or for a trace replayed, they are null."""
    rq, s = run.requests, run.summary
    done = rq["finish_s"].notna()
    rec = s.get("run") or {}
    rate, burstiness, concurrency = _arrivals(workload)
    goodput = s.get("goodput")
    out = {"date": datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S"), "backend": "servesim",
           "model_id": rec.get("model"), "num_prompts": len(rq), "request_rate": rate, "burstiness": burstiness,
           "max_concurrency": concurrency,
           "duration": s.get("duration_s"), "completed": int(done.sum()), "failed": int((~done).sum()),
           "total_input_tokens": int(rq["prompt_tokens"].sum()),
           "total_output_tokens": int(rq.loc[done, "output_tokens"].sum()),
           "request_throughput": s.get("request_throughput"),
           "request_goodput": goodput.get("requests_per_s") if isinstance(goodput, dict) else None,
           "output_throughput": s.get("output_throughput"),
           "total_token_throughput": s.get("total_token_throughput")}
    itls = request_itls(run)
    gaps = [g for one in itls if one for g in one]
    values = {"ttft_ms": rq["ttft_s"].to_numpy() * 1e3, "tpot_ms": rq["tpot_s"].to_numpy() * 1e3,
              "itl_ms": np.array(gaps if all(one is not None for one in itls) else [], dtype=float) * 1e3,
              "e2el_ms": rq["e2el_s"].to_numpy() * 1e3}
    for key, ms in values.items():
        out.update(_dist(s, key, ms))
    out.update(input_lens=rq["prompt_tokens"].astype(int).tolist(),
               output_lens=rq["output_tokens"].astype(int).tolist(),
               start_times=rq["arrival_s"].astype(float).tolist(),
               ttfts=[None if not np.isfinite(x) else float(x) for x in rq["ttft_s"].to_numpy()],
               itls=itls,
               errors=["" if ok else "shed by the gateway" if shed else "not finished"
                       for ok, shed in zip(done.tolist(), rq["shed"].astype(bool).tolist() if "shed" in rq
                                            else [False] * len(rq))])
    return out


def _arrivals(workload: dict | None) -> tuple[float | None, float | None, int | None]:
    """(request_rate req/s, burstiness, max_concurrency) of a resolved workload section."""
    arrival = (workload or {}).get("arrival") or {}
    if workload is None or workload.get("trace") or not isinstance(arrival, dict):
        return None, None, None
    process = arrival.get("process")
    if process == "closed_loop":
        return None, None, arrival.get("users")
    rate = arrival.get("rate")
    if rate is not None:  # arrival offsets are divided by time_scale: the rate is multiplied
        rate = float(rate) * float(workload.get("time_scale") or 1.0)
    if process == "poisson":
        return rate, 1.0, None
    if process == "gamma" and arrival.get("cv"):
        return rate, 1.0 / float(arrival["cv"]) ** 2, None
    return rate, None, None  # constant or burst: not a gamma process, no shape to give
