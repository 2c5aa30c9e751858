"""From the run's arrays to requests.csv, steps.csv and summary.json, vectorised."""
from __future__ import annotations

from math import fsum

import numpy as np
import pandas as pd

from sim.runtime.recorder import STEP_COLUMNS, Recorder
from sim.workload.request import RequestTable

# e2e_s: the same as e2el_s under last release's name, kept in the file for one release so that
# the scripts reading requests.csv by it (a validation harness, a notebook) keep working
REQUEST_COLUMNS = ("request_id", "arrival_s", "prompt_tokens", "output_tokens", "first_token_s",
                   "finish_s", "ttft_s", "tpot_s", "e2el_s", "e2e_s", "queue_s", "preemptions", "replica")
PERCENTILES = (50, 90, 95, 99)

# One vocabulary (vLLM's metric names: ttft, tpot, itl, e2el; the unit last): last release's
# column names, still answered for one release with a FutureWarning.
RENAMED = {"e2e_s": "e2el_s",  # requests.csv (still written beside e2el_s for one release)
           **{f"{short}_{p}_ms": f"{metric}.{p}"  # servesim.summary_frame
              for metric, short in (("ttft_ms", "ttft"), ("tpot_ms", "tpot"), ("itl_ms", "itl"), ("e2el_ms", "e2e"))
              for p in ("mean", "p50", "p90", "p99")}}


def _renamed(frame: pd.DataFrame, key):
    """`key` as this frame names it now, warning when it was last release's name."""
    if isinstance(key, str) and key not in frame.columns and RENAMED.get(key) in frame.columns:
        import warnings
        warnings.warn(f"column {key!r} is now {RENAMED[key]!r} (vLLM's name); the old name goes in the next "
                      "release", FutureWarning, stacklevel=3)
        return RENAMED[key]
    return key


class Frame(pd.DataFrame):
    """A DataFrame that still answers to last release's column names (RENAMED), with a warning."""

    @property
    def _constructor(self):
        return Frame

    def __getitem__(self, key):
        if isinstance(key, list):
            key = [_renamed(self, k) for k in key]
        return super().__getitem__(_renamed(self, key))

    def __getattr__(self, name: str):
        if name in RENAMED and RENAMED[name] in self.columns:
            return self[name]
        return super().__getattr__(name)


def requests_frame(req: RequestTable) -> pd.DataFrame:
    e2el = req.finish - req.arrival
    ttft = req.first_token - req.arrival
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(req.output > 1, (e2el - ttft) / (req.output - 1), np.nan)
    return Frame({
        "request_id": np.arange(len(req)), "arrival_s": req.arrival, "prompt_tokens": req.prompt,
        "output_tokens": req.output, "first_token_s": req.first_token, "finish_s": req.finish,
        "ttft_s": ttft, "tpot_s": tpot, "e2el_s": e2el, "e2e_s": e2el, "queue_s": req.first_scheduled - req.arrival,
        "preemptions": req.preemptions, "replica": req.replica,
    }, columns=list(REQUEST_COLUMNS))


def steps_frame(recorder: Recorder, cached: bool = False) -> pd.DataFrame:
    """steps.csv; `cached`: with the kv_blocks_cached column (runs with prefix caching)."""
    columns = recorder.step_columns()  # (counts already int64: no copy here)
    names = [*STEP_COLUMNS, "kv_blocks_cached"] if cached else list(STEP_COLUMNS)
    return pd.DataFrame(columns, columns=names, copy=False)


def weighted_percentiles(values: np.ndarray, weights: np.ndarray, qs, *,
                         select_above: int = 1 << 17) -> np.ndarray:
    """np.percentile (linear) of the array in which values[i] appears weights[i] times, without
    building it (a long run has tens of millions of inter-token gaps). Past `select_above` values
    (all finite and >= 0) the ranks are found by radix selection (`_values_at_ranks`), which gives
    the same values as the sort below without its n-long copies, and sooner (measured: equal at
    100k values, 7x sooner at 1M, 21x at 18M)."""
    big = len(values) > select_above
    if big and (not np.isfinite(values).all() or np.signbit(values).any()):
        big = False  # (radix order is value order for finite non-negative floats only)
    if big:
        total = weights.sum()
        if not total > 0:
            return np.full(len(qs), np.nan)
        pos = np.asarray(qs, dtype=np.float64) / 100.0 * (total - 1)
        lo, hi = np.floor(pos), np.ceil(pos)
        found = _values_at_ranks(values, weights, np.concatenate((lo, hi)))
        at_lo, at_hi = found[: len(pos)], found[len(pos):]
        return at_lo + (at_hi - at_lo) * (pos - lo)
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


_CHUNK_VALUES = 1 << 20  # values per pass of _values_at_ranks (8 MB of them, a few MB of temporaries)
_FEW = 1 << 18           # a bucket this small is copied out and sorted


def _values_at_ranks(values: np.ndarray, weights: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """The value at each 0-based rank of the weighted multiset (values finite and >= 0; weights
    whole numbers >= 0, summing below 2**53): as weighted_percentiles' sort finds it, but in a few
    chunked passes. A non-negative float's bits, read as an unsigned int, sort as the float does,
    so the rank's value is found bits first: a weighted histogram of the top 20 bits names the
    bucket holding each rank (and its rank inside); a bucket still large is split by its next 16
    bits, and so on; a small one is copied out and sorted. Memory: histograms, chunks and, for a
    small bucket, one n-long bool mask; never a copy of the n values."""
    bits = values.view(np.uint64)
    out = np.empty(len(ranks))
    # work: (prefix, shift, [(slot in out, rank inside the bucket)]): the bucket holds the values
    # whose bits >> shift == prefix (shift 64: all of them)
    work = [(0, 64, list(enumerate(ranks.tolist())))]
    while work:
        prefix, shift, wanted = work.pop()
        if shift < 64 and _bucket_size(bits, prefix, shift) <= _FEW:
            pick = np.concatenate([c >> np.uint64(shift) == np.uint64(prefix) for c in _chunks(bits)])
            v, w = values[pick], weights[pick]
            order = np.argsort(v, kind="stable")
            v, ends = v[order], np.cumsum(w[order])
            for slot, rank in wanted:
                out[slot] = v[np.searchsorted(ends, rank, side="right")]
            continue
        step = 20 if shift == 64 else min(16, shift)
        below = shift - step
        hist = np.zeros(1 << step)
        for c, w in zip(_chunks(bits), _chunks(weights)):
            if shift < 64:
                inside = c >> np.uint64(shift) == np.uint64(prefix)
                c, w = c[inside], w[inside]
            digit = (c >> np.uint64(below)) & np.uint64((1 << step) - 1)
            hist += np.bincount(digit.astype(np.intp), weights=w, minlength=1 << step)
        ends = np.cumsum(hist)
        split: dict[int, list] = {}
        for slot, rank in wanted:
            d = int(np.searchsorted(ends, rank, side="right"))
            split.setdefault(d, []).append((slot, rank - (ends[d - 1] if d else 0.0)))
        for d, inside in split.items():
            if below == 0:  # every bit known: the value itself
                value = np.array([(prefix << step) | d], dtype=np.uint64).view(np.float64)[0]
                for slot, _ in inside:
                    out[slot] = value
            else:
                work.append(((prefix << step) | d, below, inside))
    return out


def _chunks(a: np.ndarray):
    return (a[i:i + _CHUNK_VALUES] for i in range(0, len(a), _CHUNK_VALUES))


def _bucket_size(bits: np.ndarray, prefix: int, shift: int) -> int:
    return sum(int(np.count_nonzero(c >> np.uint64(shift) == np.uint64(prefix))) for c in _chunks(bits))


def weighted_sum(values: np.ndarray, weights: np.ndarray) -> float:
    """sum(values x weights), the same to the last bit on every machine. BLAS's dot (numpy's `@`)
    is not: its kernel (by CPU) and its thread count (by cores, for more than 10,000 values) set
    the order of its additions, so summary.json's means differed in their last digits from machine
    to machine (OpenBLAS's default kernel, OPENBLAS_CORETYPE=Haswell and Prescott gave three), and
    its threads spun on the other core for ~0.25 s after it (tests/runtime/test_sim_metrics.py). numpy's
    pairwise sum per chunk has one order, and fsum adds the chunks' sums exactly."""
    return fsum(float(np.add.reduce(v * w)) for v, w in zip(_chunks(values), _chunks(weights)))


def distribution(values: np.ndarray, weights: np.ndarray | None = None, scale: float = 1e3) -> dict:
    """mean and percentiles of `values` (s), reported in ms."""
    if weights is None:
        values = values[~np.isnan(values)]
        weights = np.ones(len(values))
    total = weights.sum()
    if total == 0:
        return {k: None for k in ("mean", *(f"p{q}" for q in PERCENTILES))}
    out = {"mean": float(weighted_sum(values, weights) / total * scale)}
    for q, v in zip(PERCENTILES, weighted_percentiles(values, weights, PERCENTILES)):
        out[f"p{q}"] = float(v * scale)
    return out


class InterTokenGaps:
    """Every gap between two tokens of a request (metrics.inter_token_latencies): `gaps` (s) and
    `counts` (how many requests had that gap: the iteration's decode tokens; 1 for a gap across a
    preemption), float64 both, and, computed only when asked (the planner judges gaps after its
    warm-up by them), `ends` (s, when each gap ends). Unpacks as (gaps, counts, ends)."""

    def __init__(self, gaps, counts, count, start_s, decoding_rows, other, resumed_ends):
        self.gaps, self.counts = gaps, counts
        self._count, self._start = count, start_s     # steps.csv's count and start_s columns
        self._rows, self._other = decoding_rows, other  # rows with decodes; the others' durations
        self._resumed_ends = resumed_ends

    @property
    def ends(self) -> np.ndarray:
        """An iteration's gaps end with it (its tokens are sampled then): its run's start + the
        durations of the run's iterations up to it (the durations rebuilt in row order first)."""
        count = self._count
        decoding = np.repeat(self._rows, count)
        durations = np.empty(len(decoding))
        durations[decoding] = self.gaps[: len(self.gaps) - len(self._resumed_ends)]
        durations[~decoding] = self._other
        ends = np.cumsum(durations)
        first = np.cumsum(count) - count  # each run's first iteration
        ends += np.repeat(self._start - (ends[first] - durations[first]) if len(first) else np.zeros(0), count)
        return np.concatenate((ends[decoding], self._resumed_ends))

    def __iter__(self):
        return iter((self.gaps, self.counts, self.ends))

    def __getitem__(self, i: int) -> np.ndarray:
        return self.ends if i in (2, -1) else (self.gaps, self.counts, None)[i]


def inter_token_latencies(steps: pd.DataFrame, recorder: Recorder, req: RequestTable) -> InterTokenGaps:
    """Every gap between two tokens of a request: one iteration for each decode it ran in, plus the
    longer gaps across recompute preemptions (InterTokenGaps). Takes the recorder's durations and
    reuses their memory for the gaps: compacted in place, chunk by chunk (a million-request run
    has ~18M iterations)."""
    count = np.asarray(steps["count"].to_numpy(), dtype=np.int64)
    decode_tokens = steps["decode_tokens"].to_numpy()
    rows = decode_tokens > 0  # prefill-only iterations hold no inter-token gap
    resumed = np.asarray(req.resume_gaps, dtype=np.float64).reshape(-1, 2)
    durations = recorder.take_durations(room=len(resumed))
    iterations = len(durations) - len(resumed)
    decoding = np.repeat(rows, count)
    other = durations[:iterations][~decoding]
    kept = 0
    for at in range(0, iterations, _CHUNK_VALUES):  # (kept <= at: nothing unread is overwritten)
        moved = durations[at:min(at + _CHUNK_VALUES, iterations)][decoding[at:at + _CHUNK_VALUES]]
        durations[kept:kept + len(moved)] = moved
        kept += len(moved)
    del decoding
    durations[kept:kept + len(resumed)] = resumed[:, 0]
    gaps = durations[: kept + len(resumed)]
    counts = np.empty(len(gaps))
    counts[kept:] = 1.0
    filled, chunk = 0, max(_CHUNK_VALUES >> 4, 1)  # rows (of ~7 iterations each, fast-forwarded)
    for r in range(0, len(rows), chunk):  # np.repeat over row chunks: no second n-long array
        keep = rows[r:r + chunk]
        part = np.repeat(decode_tokens[r:r + chunk][keep].astype(np.float64), count[r:r + chunk][keep])
        counts[filled:filled + len(part)] = part
        filled += len(part)
    return InterTokenGaps(gaps, counts, count, steps["start_s"].to_numpy(), rows, other, resumed[:, 1].copy())


def summarize(req: RequestTable, rq: pd.DataFrame, steps: pd.DataFrame, recorder: Recorder, *,
              itl: InterTokenGaps, max_num_seqs: int,
              replicas: float, gpus: float, flops_per_token: float, weight_bytes: float,
              kv_bytes_per_token: float, peak_flops: float, hbm_bandwidth: float,
              slo=None, classes: tuple[str, ...] = (), experts: tuple[float, float] | None = None,
              state_bytes_per_decode: float = 0.0) -> dict:
    """`experts`: a MoE model's (routed experts' bytes, 1 - k / E): an iteration of T tokens reads the
    experts its tokens touch, E x (1 - (1 - k/E)^T) of a layer's E (each token routed to k, uniformly:
    the expectation RooflineCost uses), not all of them (MBU would pass 100% at small batches)."""
    done = rq[~rq["finish_s"].isna()]
    duration = float(done["finish_s"].max() - rq["arrival_s"].min()) if len(done) else 0.0
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)  # noqa: E731
    count = steps["count"].to_numpy()
    iterations = int(count.sum())
    useful = float((steps["prefill_tokens"] + steps["decode_tokens"] * steps["count"]).sum())
    padded = float((steps["padded_tokens"] * steps["count"]).sum())
    busy_gpu_s = duration * gpus
    weights_read = iterations * weight_bytes  # bytes of weights the iterations read, all GPUs
    if experts is not None and iterations:
        routed, miss = experts
        step_tokens = (steps["prefill_tokens"] + steps["decode_tokens"]).to_numpy(dtype=np.float64)
        touched = float((count * (1.0 - miss ** step_tokens)).sum())
        weights_read = iterations * (weight_bytes - routed) + routed * touched
    if state_bytes_per_decode:  # (a hybrid: sequence states instead of KV in its linear layers)
        weights_read += state_bytes_per_decode * float((steps["decode_tokens"] * count).sum())
    itl, itl_w = itl.gaps, itl.counts
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
        "e2el_ms": distribution(done["e2el_s"].to_numpy()),
        "slot_utilization": float((steps["num_seqs"] * count).sum() / (max_num_seqs * iterations))
        if iterations else 0.0,
        "kv_utilization": recorder.kv_block_seconds / (steps["kv_blocks_total"].iloc[0] * duration * replicas)
        if iterations and duration > 0 else 0.0,
        "kv_waste": 1.0 - recorder.kv_token_seconds / recorder.kv_slot_seconds
        if recorder.kv_slot_seconds > 0 else 0.0,
        "padding_waste": padded / (useful + padded) if useful + padded > 0 else 0.0,
        # estimates: matmul FLOPs of useful tokens; weights read once per iteration plus decode KV reads
        "mfu": useful * flops_per_token / (busy_gpu_s * peak_flops) if busy_gpu_s > 0 else 0.0,
        "mbu": (weights_read + recorder.decode_context_tokens * kv_bytes_per_token)
        / (busy_gpu_s * hbm_bandwidth) if busy_gpu_s > 0 else 0.0,
    }
    verdict = None if slo is None else judge(done, slo, duration, (itl, itl_w), classes)
    if verdict is not None:
        out["goodput"] = verdict
    if classes:  # workload.classes: each class's requests apart
        per_class: dict[str, dict] = {}
        out["classes"] = per_class
        for name in classes:
            mine = rq[rq["class"] == name]
            served = mine[~mine["finish_s"].isna()]
            entry: dict = {"requests": int(len(mine)), "completed": int(len(served))}
            if "shed" in mine:
                entry["shed"] = int(mine["shed"].sum())
            entry.update({"ttft_ms": distribution(served["ttft_s"].to_numpy()),
                          "tpot_ms": distribution(served["tpot_s"].to_numpy()),
                          "e2el_ms": distribution(served["e2el_s"].to_numpy())})
            if verdict is not None:
                entry["goodput"] = verdict["classes"][name]
            per_class[name] = entry
    return out


def judge(done: pd.DataFrame, slo, duration: float, itl: tuple[np.ndarray, np.ndarray] | None = None,
          classes: tuple[str, ...] = ()) -> dict:
    """`goodput` of the requests `done`; with workload classes (`done` has a `class` column), each
    class's requests are held to its own per-request targets (slo.for_class) and the SLO is met
    when every class meets its own and the ITL target (over every token stream) holds. The top
    level's per-target percentiles are then over all requests, for reading, and `by_class` is set."""
    whole = goodput(done, slo, duration, itl)
    if not classes:
        return whole
    ok = 0.0
    per: dict[str, dict] = {}
    for name in classes:
        mine = done[done["class"] == name]
        per[name] = goodput(mine, slo.for_class(name), duration)
        ok += per[name]["fraction"] * len(mine)
    whole["requests_per_s"] = ok / duration if duration > 0 else 0.0
    whole["fraction"] = ok / len(done) if len(done) else 0.0
    whole["met"] = all(g["met"] for g in per.values()) and whole.get("itl_ms", {}).get("met", True)
    whole["by_class"] = True
    whole["classes"] = per
    return whole


PER_REQUEST = {"ttft_ms": "ttft_s", "tpot_ms": "tpot_s", "e2el_ms": "e2el_s"}  # SLO key -> column


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
