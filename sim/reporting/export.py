"""A run in other tools' formats: a Chrome / Perfetto trace, and a `vllm bench serve` result JSON.

    chrome_trace(run, max_requests=5000) -> dict   # json.dump it; open in ui.perfetto.dev
    vllm_bench(run) -> dict                         # the layout `vllm bench serve --save-result
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


def _dist(summary: dict, key: str) -> dict:
    """summary.json's {mean, p50, p99} of `key` (ms) under vLLM's names."""
    d = summary.get(key) or {}
    name = key[:-3]
    return {f"mean_{name}_ms": d.get("mean"), f"median_{name}_ms": d.get("p50"), f"p99_{name}_ms": d.get("p99")}


def vllm_bench(run: Run) -> dict:
    """The run as `vllm bench serve --save-result --save-detailed` writes a benchmark: per request
    input_lens, output_lens, start_times (arrival, s) and ttfts (s); the aggregate metrics with
    vLLM's keys (mean_/median_/p99_ ttft, tpot, itl, e2el in ms). Per-token itls are not written
    (the run keeps iterations, not each request's gaps)."""
    rq, s = run.requests, run.summary
    done = rq["finish_s"].notna()
    rec = s.get("run") or {}
    out = {"date": datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S"), "backend": "servesim",
           "model_id": rec.get("model"), "num_prompts": len(rq), "request_rate": None, "burstiness": None,
           "duration": s.get("duration_s"), "completed": int(done.sum()), "failed": int((~done).sum()),
           "total_input_tokens": int(rq["prompt_tokens"].sum()),
           "total_output_tokens": int(rq.loc[done, "output_tokens"].sum()),
           "request_throughput": s.get("request_throughput"), "output_throughput": s.get("output_throughput"),
           "total_token_throughput": s.get("total_token_throughput")}
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        out.update(_dist(s, key))
    out.update(input_lens=rq["prompt_tokens"].astype(int).tolist(),
               output_lens=rq["output_tokens"].astype(int).tolist(),
               start_times=rq["arrival_s"].astype(float).tolist(),
               ttfts=[None if not np.isfinite(x) else float(x) for x in rq["ttft_s"].to_numpy()],
               errors=["" if ok else "not finished" for ok in done.tolist()])
    return out
