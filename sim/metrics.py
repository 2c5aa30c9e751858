"""From the run's arrays to requests.csv, steps.csv and summary.json, vectorised."""
from __future__ import annotations

import numpy as np
import pandas as pd

from .recorder import STEP_COLUMNS, Recorder
from .request import RequestTable

REQUEST_COLUMNS = ("request_id", "arrival_s", "prompt_tokens", "output_tokens", "first_token_s",
                   "finish_s", "ttft_s", "tpot_s", "e2e_s", "queue_s", "preemptions", "replica")
PERCENTILES = (50, 90, 95, 99)
_INT_STEP_COLUMNS = [c for c in (*STEP_COLUMNS, "kv_blocks_cached") if c not in ("start_s", "duration_s")]


def requests_frame(req: RequestTable) -> pd.DataFrame:
    e2e = req.finish - req.arrival
    ttft = req.first_token - req.arrival
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(req.output > 1, (e2e - ttft) / (req.output - 1), np.nan)
    return pd.DataFrame({
        "request_id": np.arange(len(req)), "arrival_s": req.arrival, "prompt_tokens": req.prompt,
        "output_tokens": req.output, "first_token_s": req.first_token, "finish_s": req.finish,
        "ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e, "queue_s": req.first_scheduled - req.arrival,
        "preemptions": req.preemptions, "replica": req.replica,
    }, columns=list(REQUEST_COLUMNS))


def steps_frame(recorder: Recorder, cached: bool = False) -> pd.DataFrame:
    """steps.csv; `cached`: with the kv_blocks_cached column (runs with prefix caching)."""
    columns = recorder.step_columns()
    names = [*STEP_COLUMNS, "kv_blocks_cached"] if cached else list(STEP_COLUMNS)
    for c in _INT_STEP_COLUMNS:
        columns[c] = columns[c].astype(np.int64)
    return pd.DataFrame(columns, columns=names, copy=False)


def weighted_percentiles(values: np.ndarray, weights: np.ndarray, qs) -> np.ndarray:
    """np.percentile (linear) of the array in which values[i] appears weights[i] times, without
    building it (a long run has tens of millions of inter-token gaps)."""
    keep = weights > 0
    if not keep.all():
        values, weights = values[keep], weights[keep]
    if len(values) == 0:
        return np.full(len(qs), np.nan)
    order = np.argsort(values, kind="stable")
    sorted_weights = weights[order]
    values = values[order]
    del order  # (a million-request run sorts ~18M gaps: one array of them less at the peak)
    ends = np.cumsum(sorted_weights)  # ends[i]: expanded index after value i
    del sorted_weights
    pos = np.asarray(qs, dtype=np.float64) / 100.0 * (ends[-1] - 1)
    lo, hi = np.floor(pos), np.ceil(pos)
    at = lambda p: values[np.searchsorted(ends, p, side="right")]  # noqa: E731
    return at(lo) + (at(hi) - at(lo)) * (pos - lo)


def distribution(values: np.ndarray, weights: np.ndarray | None = None, scale: float = 1e3) -> dict:
    """mean and percentiles of `values` (s), reported in ms."""
    if weights is None:
        values = values[~np.isnan(values)]
        weights = np.ones(len(values))
    total = weights.sum()
    if total == 0:
        return {k: None for k in ("mean", *(f"p{q}" for q in PERCENTILES))}
    out = {"mean": float(values @ weights / total * scale)}
    for q, v in zip(PERCENTILES, weighted_percentiles(values, weights, PERCENTILES)):
        out[f"p{q}"] = float(v * scale)
    return out


def inter_token_latencies(steps: pd.DataFrame, recorder: Recorder, req: RequestTable):
    """Every gap between two tokens of a request: one iteration for each decode it ran in, plus the
    longer gaps across recompute preemptions. Returns (gap s, how many gaps, when they end s): an
    iteration's gaps end with it (its tokens are sampled then)."""
    durations = recorder.iteration_durations()
    count = steps["count"].to_numpy()
    decode_tokens = steps["decode_tokens"].to_numpy(np.int32)
    rows = decode_tokens > 0  # prefill-only iterations hold no inter-token gap
    decoding = np.repeat(rows, count)
    # an iteration's end: its run's start + the durations of the run's iterations up to it
    ends = np.cumsum(durations)
    first = np.cumsum(count) - count  # each run's first iteration
    ends += np.repeat(steps["start_s"].to_numpy() - (ends[first] - durations[first]) if len(first) else
                      np.zeros(0), count)
    ends = ends[decoding]
    # (built from the decoding rows only: no iteration-long temporaries beyond `ends` above)
    weights = np.repeat(decode_tokens[rows], count[rows])
    resumed = np.asarray(req.resume_gaps, dtype=np.float64).reshape(-1, 2)
    if not len(resumed):  # no preemption with output: no second copy of each array
        return durations[decoding], weights, ends
    return (np.concatenate((durations[decoding], resumed[:, 0])),
            np.concatenate((weights, np.ones(len(resumed), dtype=np.int32))),
            np.concatenate((ends, resumed[:, 1])))


def summarize(req: RequestTable, rq: pd.DataFrame, steps: pd.DataFrame, recorder: Recorder, *,
              itl: tuple[np.ndarray, ...], max_num_seqs: int,
              replicas: int, gpus: int, flops_per_token: float, weight_bytes: float,
              kv_bytes_per_token: float, peak_flops: float, hbm_bandwidth: float,
              slo=None) -> dict:
    done = rq[~rq["finish_s"].isna()]
    duration = float(done["finish_s"].max() - rq["arrival_s"].min()) if len(done) else 0.0
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)  # noqa: E731
    count = steps["count"].to_numpy()
    iterations = int(count.sum())
    useful = float((steps["prefill_tokens"] + steps["decode_tokens"] * steps["count"]).sum())
    padded = float((steps["padded_tokens"] * steps["count"]).sum())
    busy_gpu_s = duration * gpus
    itl, itl_w = itl[:2]  # inter_token_latencies(): gaps and their counts
    out = {
        "completed": int(len(done)),
        "duration_s": duration,
        "iterations": iterations,
        "request_throughput": per_s(len(done)),
        "output_throughput": per_s(float(done["output_tokens"].sum())),
        "total_token_throughput": per_s(float((done["prompt_tokens"] + done["output_tokens"]).sum())),
        "preemptions": int(req.preemptions.sum()),
        "ttft_ms": distribution(done["ttft_s"].to_numpy()),
        "tpot_ms": distribution(done["tpot_s"].to_numpy()),
        "itl_ms": distribution(itl, itl_w),
        "e2el_ms": distribution(done["e2e_s"].to_numpy()),
        "slot_utilization": float((steps["num_seqs"] * count).sum() / (max_num_seqs * iterations))
        if iterations else 0.0,
        "kv_utilization": recorder.kv_block_seconds / (steps["kv_blocks_total"].iloc[0] * duration * replicas)
        if iterations and duration > 0 else 0.0,
        "kv_waste": 1.0 - recorder.kv_token_seconds / recorder.kv_slot_seconds
        if recorder.kv_slot_seconds > 0 else 0.0,
        "padding_waste": padded / (useful + padded) if useful + padded > 0 else 0.0,
        # estimates: matmul FLOPs of useful tokens; weights read once per iteration plus decode KV reads
        "mfu": useful * flops_per_token / (busy_gpu_s * peak_flops) if busy_gpu_s > 0 else 0.0,
        "mbu": (iterations * weight_bytes + recorder.decode_context_tokens * kv_bytes_per_token)
        / (busy_gpu_s * hbm_bandwidth) if busy_gpu_s > 0 else 0.0,
    }
    if slo is not None:
        out["goodput"] = goodput(done, slo, duration, (itl, itl_w))
    return out


PER_REQUEST = {"ttft_ms": "ttft_s", "tpot_ms": "tpot_s", "e2el_ms": "e2e_s"}  # SLO key -> column


def goodput(done: pd.DataFrame, slo, duration: float, itl: tuple[np.ndarray, np.ndarray] | None = None) -> dict:
    """Requests meeting every per-request target (TTFT, TPOT, E2EL) per second: vLLM's and
    DistServe's goodput; and whether each target's percentile holds. An ITL target is judged over
    every inter-token gap (`itl`: gaps in s and their counts), as vLLM reports ITL; it is a
    property of the token stream, not of one request, so it does not enter the per-request count."""
    ok = np.ones(len(done), dtype=bool)
    result: dict = {"percentile": slo.percentile}
    for key, (target, pct) in slo.targets().items():
        if key in PER_REQUEST:
            values = done[PER_REQUEST[key]].to_numpy() * 1e3
            ok &= ~(values > target)  # a one-token request has no TPOT and cannot miss it
            observed = np.nanpercentile(values, pct) if np.isfinite(values).any() else np.nan
        else:
            gaps, counts = itl if itl is not None else (np.zeros(0), np.zeros(0))
            observed = weighted_percentiles(np.asarray(gaps) * 1e3, np.asarray(counts), [pct])[0]
        result[key] = {"target": target, "percentile": pct, "observed": float(observed),
                       "met": bool(not observed > target)}
    result["requests_per_s"] = float(ok.sum() / duration) if duration > 0 else 0.0
    result["fraction"] = float(ok.mean()) if len(ok) else 0.0
    result["met"] = all(v["met"] for v in result.values() if isinstance(v, dict))
    return result
