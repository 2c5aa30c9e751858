"""The error band of a run's latencies: where the real server's value is expected to fall.

Every run's summary.json carries `error_band`: per latency metric (ttft_ms, tpot_ms, itl_ms,
e2el_ms) and statistic (mean, p50, p90, p99), `[low, high]` in the metric's unit, and `basis`:
what the band was measured on and how it was widened for this run's path.

The measured part (validated path: kernel tables of the H100 SXM with the default engine
overheads, a dense or Mixtral-style MoE model in bf16, no feature outside validation, a load
the server sustained): each statistic's held-out (leave-one-model-out) signed error against
real vLLM on H100, e = (sim - real) / real, over the 20 sustained stages of the training set
(sim/profiles/vllm_v1_overheads.yaml, `leave_one_model_out.signed_error`, written by
`bench/fidelity.py --fit --write`). The real value is sim / (1 + e): the band spans a Student-t
prediction interval (Student-t, scipy.special.stdtrit) at BAND_LEVEL of log(real / sim) = -log(1 + e) for a new
run, mean +- t x s x sqrt(1 + 1/n) over those n logs (and always the simulated value itself; in
logs, as ratios are: a real tail 3.6x the simulated one and one 0.8x it are as far apart). A prediction interval
rather than the errors' own quantiles: the stages are four models' and each model errs on its own
side, so a model the fit never saw is farther off than the others' spread (the quantiles' band held
on 50-80% of a left-out model's stages, this one on 65-100%: docs/validation.md).

Off that path nothing was measured against a real server, and the band says so by widening, in
log units of real/sim (`WIDEN`, each an assumption stated here and in docs/validation.md, never a
fit): more on the slow side (real slower than simulated), since a simulator that misses work errs
fast. The widenings of one run add. A `calibrate --from-bench` profile replaces the measured
part by the error of the user's own runs (its metadata.serving_error), and the GPU and model
widenings by nothing: it was measured on that server.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

# summary.json metric -> statistic -> the training set's metric whose held-out error it takes
# (bench/fidelity.py ALL_METRICS); a tuple: the widest of them, an entry of UNMEASURED: not
# measured per request there (see `basis`)
SOURCES: dict[str, dict[str, tuple[str, ...]]] = {
    "ttft_ms": {"mean": ("ttft_mean_ms",), "p50": ("ttft_p50_ms",), "p90": ("ttft_p90_ms",),
                "p99": ("ttft_p99_ms",)},
    # per-request TPOT tails: E2E's (at the runs' 250-1450-token outputs E2E is mostly decode time)
    "tpot_ms": {"mean": ("tpot_mean_ms",), "p50": ("tpot_p50_ms",), "p90": ("tpot_p50_ms", "e2e_p90_s"),
                "p99": ("tpot_p50_ms", "e2e_p99_s")},
    # the client's inter-token gaps were not usable (two stream messages per token): TPOT's error
    "itl_ms": {"mean": ("tpot_mean_ms",), "p50": ("tpot_p50_ms",), "p90": ("tpot_p50_ms", "e2e_p90_s"),
               "p99": ("tpot_p50_ms", "e2e_p99_s")},
    "e2el_ms": {"mean": ("e2e_mean_s",), "p50": ("e2e_p50_s",), "p90": ("e2e_p90_s",), "p99": ("e2e_p99_s",)},
}
STATISTICS = ("mean", "p50", "p90", "p99")
# the prediction interval's level (the cross-validated coverage it gave: docs/validation.md)
BAND_LEVEL = 0.95
# ITL tails were never measured (see SOURCES): their measured part counts twice as wide
ITL_TAIL_FACTOR = 2.0

# Widenings (log units of real / simulated: 0.10 ~ 10%), (fast side, slow side). Assumptions,
# stated: the validated path is one GPU; engine overheads and kernel efficiencies carried to
# another are not checked there.
WIDEN: dict[str, tuple[float, float]] = {
    # cost source
    "tables_other_gpu": (0.05, 0.15),    # measured kernel tables, engine overheads fitted on H100
    # the same on a PCIe card with GDDR memory (L40S, RTX PRO 6000): a board power cap that does not
    # sustain the clocks its kernels were timed at under serving's back-to-back load
    "tables_pcie_card": (0.05, 0.30),
    "roofline_nvidia": (0.15, 0.35),     # datasheet peaks x efficiencies, no kernel table
    # a GPU no table covers (AMD): efficiencies NVIDIA's, not ROCm's. Slow side log 5: real vLLM on
    # MI300X has been reported 2-5x slower than this roofline (issue 56: held-out runs, 50-80% fast)
    "roofline_unmeasured": (0.25, 1.61),
    "profile_unchecked": (0.10, 0.30),   # a profile never checked against a real server
    # model classes outside the training set's dense Llama and Mixtral MoE in bf16
    "model_class": (0.05, 0.10),         # MLA, linear-attention hybrids, sliding windows
    "quantised": (0.03, 0.08),           # FP8 / INT8 / 4-bit weights or an FP8 KV cache
    # features outside validation
    "feature": (0.05, 0.10),             # each: speculative decoding, disaggregation, LoRA, KV offload,
                                         # pipeline / expert / data parallelism, autoscaling
    # load: waiting time near saturation moves with small errors in capacity (TTFT and E2E only)
    "queueing": (0.10, 0.25),            # per unit of queued share (queue p90 / TTFT p90)
    "overloaded": (1.00, 1.00),          # the simulated server did not keep up
}
VALIDATED_GPUS = ("h100-sxm",)
UNMEASURED_VENDORS = ("mi",)  # preset name prefixes of GPUs no kernel table covers (AMD Instinct)
PCIE_CARDS = ("l40s", "rtx-pro-6000")  # GDDR memory, one board power cap, no NVLink


@dataclass(frozen=True)
class BandPath:
    """What about a run moves it off the validated path (simulate.band_path builds it)."""
    cost: str                     # "validated", "tables_other_gpu", "tables_pcie_card", "roofline_nvidia",
                                  # "roofline_unmeasured",
                                  # "profile_unchecked", "user_bench", "unit"
    gpu: str
    model_class: tuple[str, ...] = ()   # reasons: "mla", "linear attention", "sliding window"
    quantised: bool = False
    features: tuple[str, ...] = ()
    user_band: dict | None = None       # a calibrate --from-bench profile's serving_error
    widen: dict = field(default_factory=dict)

    @property
    def estimated(self) -> bool:
        """No measurement of this GPU's kernels: the run is an estimate, not validated."""
        return self.cost in ("roofline_unmeasured", "roofline_nvidia")


@lru_cache(maxsize=1)
def held_out_errors() -> dict[str, np.ndarray]:
    """Each training metric's held-out signed errors (the defaults file's)."""
    from sim.cost.overheads import _defaults_doc
    doc = (_defaults_doc().get("leave_one_model_out") or {}).get("signed_error") or {}
    return {k: np.array(sorted(v.values()), dtype=np.float64) for k, v in doc.items() if v}


def interval(errors: np.ndarray, level: float = BAND_LEVEL) -> tuple[float, float]:
    """The prediction interval of log(real / sim) for a new run from these held-out signed errors
    e (log(real / sim) = -log(1 + e)): mean +- t x s x sqrt(1 + 1/n) of the logs (Student-t, n - 1
    degrees of freedom; one error: its log, both ends), widened to hold 0 (the simulated value)."""
    # (scipy.special's inverse Student-t CDF: scipy.stats would add ~1.5 s to every run's import)
    from scipy.special import stdtrit
    logs = -np.log1p(np.asarray(errors, dtype=np.float64))
    n = len(logs)
    if n < 2:
        v = float(logs[0]) if n else 0.0
        return min(v, 0.0), max(v, 0.0)
    half = float(stdtrit(n - 1, 0.5 + level / 2)) * float(np.std(logs, ddof=1)) * math.sqrt(1 + 1 / n)
    m = float(np.mean(logs))
    return min(m - half, 0.0), max(m + half, 0.0)


def measured_part(metric: str, stat: str, errors: dict[str, np.ndarray] | None = None) -> tuple[float, float]:
    """(low, high) of log(real / sim) from the held-out errors of the statistic's sources."""
    errors = held_out_errors() if errors is None else errors
    lo, hi = 0.0, 0.0
    for key in SOURCES[metric][stat]:
        e = errors.get(key)
        if e is None or not len(e):
            continue
        a, b = interval(e)  # (real = sim / (1 + e): a fast simulation, e < 0, has the real value above it)
        lo, hi = min(lo, a), max(hi, b)
    if metric == "itl_ms" and stat in ("p90", "p99"):
        lo, hi = ITL_TAIL_FACTOR * lo, ITL_TAIL_FACTOR * hi
    return lo, hi


def widening(path: BandPath, metric: str, queued: float, overloaded: bool) -> tuple[float, float, list[str]]:
    """(fast, slow) widening in log units for this path and metric, and the reasons."""
    fast = slow = 0.0
    why: list[str] = []

    def add(key: str, reason: str, times: float = 1.0) -> None:
        nonlocal fast, slow
        f, s = WIDEN[key]
        fast, slow = fast + times * f, slow + times * s
        why.append(reason)

    if path.cost in ("tables_other_gpu", "tables_pcie_card", "roofline_nvidia", "roofline_unmeasured",
                     "profile_unchecked"):
        add(path.cost, {"tables_other_gpu": f"kernel tables of {path.gpu}, overheads fitted on H100 "
                                            "(not validated there)",
                        "tables_pcie_card": f"kernel tables of {path.gpu}, a power-capped PCIe card, overheads "
                                            "fitted on H100 (not validated there)",
                        "roofline_nvidia": f"datasheet roofline for {path.gpu} (no kernel table)",
                        "roofline_unmeasured": f"estimated, not validated: {path.gpu} datasheet roofline with "
                                               "NVIDIA efficiencies",
                        "profile_unchecked": "a step profile never checked against a real server"}[path.cost])
    if path.cost != "user_bench":
        if path.model_class:
            add("model_class", f"model class not validated ({', '.join(path.model_class)})")
        if path.quantised:
            add("quantised", "quantised weights or KV cache (validated in bf16 only)")
    for feature in path.features:
        add("feature", f"{feature} (not validated)")
    if metric in ("ttft_ms", "e2el_ms"):
        if overloaded:
            add("overloaded", "the simulated server did not keep up: waiting times grow with the run")
        elif queued > 0.25:
            add("queueing", f"near saturation (queue {queued:.0%} of TTFT p90)", times=queued)
    return fast, slow, why


def path_of(scenario, unvalidated: tuple[str, ...] = ()) -> BandPath:
    """The BandPath of a resolved Scenario (read, not imported: sim/config sits above);
    `unvalidated`: the features on in it that were never compared with real serving, by name
    (sim/features/: each feature's `unvalidated`)."""
    spec, hw, m, e = scenario.cost_model, scenario.hardware, scenario.model, scenario.engine
    profile = spec.profile
    user = profile.metadata.get("serving_error") if profile is not None else None
    if spec.name == "unit":
        cost = "unit"
    elif user is not None:
        cost = "user_bench"
    elif spec.name == "measured":
        cost = ("validated" if hw.name in VALIDATED_GPUS else
                "tables_pcie_card" if hw.name in PCIE_CARDS else "tables_other_gpu")
    elif spec.name == "roofline":
        cost = "roofline_unmeasured" if hw.name.startswith(UNMEASURED_VENDORS) else "roofline_nvidia"
    else:
        cost = "profile_unchecked"
    classes = tuple(name for name, on in (("latent attention (MLA)", m.mla is not None),
                                          ("linear-attention hybrid", m.linear_attention is not None),
                                          ("sliding-window attention", bool(m.sliding_layers)))
                    if on)
    quantised = (m.linear_weight_bytes is not None or m.expert_weight_bytes is not None
                 or e.kv_cache_dtype != "auto")
    features = tuple(name for name, on in (
        ("speculative decoding", e.speculative is not None), ("disaggregated prefill", e.disaggregation is not None),
        ("LoRA", e.lora is not None), ("KV offloading", bool(e.kv_offloading_size)),
        ("pipeline parallelism", e.pipeline_parallel_size > 1), ("data parallelism", e.data_parallel_size > 1),
        ("expert parallelism", bool(e.enable_expert_parallel)), ("autoscaling", e.autoscaling is not None),
        ("eager mode (no CUDA graphs)", e.enforce_eager)) if on) + unvalidated
    return BandPath(cost, hw.name, classes, quantised, features, user)


def band(path: BandPath, summary: dict, queued: float = 0.0) -> dict | None:
    """summary.json's `error_band` for a run on `path` with this summary (its ttft_ms, tpot_ms,
    itl_ms, e2el_ms distributions, in ms); `queued`: the run's queue p90 over its TTFT p90."""
    if path.cost == "unit":
        return None
    overloaded = overloaded_run(summary)
    out: dict = {}
    reasons: list[str] = []
    for metric in SOURCES:
        dist = summary.get(metric) or {}
        fast, slow, why = widening(path, metric, queued, overloaded)
        reasons += [r for r in why if r not in reasons]
        row = {}
        for stat in STATISTICS:
            value = dist.get(stat)
            if value is None or not math.isfinite(value):
                continue
            if path.user_band is not None:  # the user's own runs: their step-time error
                lo, hi = math.log(path.user_band["faster"]), math.log(path.user_band["slower"])
            else:
                lo, hi = measured_part(metric, stat)
            # (rounded outward: the band always holds the simulated value itself)
            row[stat] = [math.floor(value * math.exp(lo - fast) * 1e6) / 1e6,
                         math.ceil(value * math.exp(hi + slow) * 1e6) / 1e6]
        if row:
            out[metric] = row
    if path.user_band is not None:
        measured = f"your runs (calibrate --from-bench): {path.user_band['basis']}"
    else:
        n = len(next(iter(held_out_errors().values()), []))
        measured = (f"held-out (leave-one-model-out) error against real vLLM on H100 SXM, {n} sustained stages "
                    f"of 4 models, {BAND_LEVEL:.0%} prediction interval (docs/validation.md)")
    out["basis"] = {"measured": measured, "widened_for": reasons,
                    "validated": not reasons and path.cost in ("validated", "user_bench"),
                    "estimated": path.estimated}
    return out


def overloaded_run(summary: dict) -> bool:
    """Did the simulated median TTFT reach 1 s (the fidelity check's line between sustained and
    overloaded)?"""
    p50 = (summary.get("ttft_ms") or {}).get("p50")
    return bool(p50 is not None and p50 >= 1000.0)


def queued_share(queue_s: np.ndarray, ttft_s: np.ndarray) -> float:
    """A run's queue p90 over its TTFT p90 (finite values; 0 without any), in [0, 1]."""
    q, t = queue_s[np.isfinite(queue_s)], ttft_s[np.isfinite(ttft_s)]
    if not len(q) or not len(t):
        return 0.0
    p90 = float(np.percentile(t, 90))
    return max(0.0, min(1.0, float(np.percentile(q, 90)) / p90)) if p90 > 0 else 0.0


def one_line(b: dict | None) -> str:
    """The band as `run` prints it: the headline statistics, then what it rests on."""
    if not b:
        return "error band: none (unit cost model: times count iterations)"

    def cell(metric: str, stat: str, label: str, unit: str, scale: float = 1.0) -> str:
        v = b.get(metric, {}).get(stat)
        return "" if v is None else f"{label} {_figure(v[0] * scale)}-{_figure(v[1] * scale)} {unit}"
    cells = [c for c in (cell("ttft_ms", "p50", "TTFT p50", "ms"), cell("ttft_ms", "p99", "p99", "ms"),
                         cell("tpot_ms", "mean", "TPOT", "ms"), cell("e2el_ms", "p50", "E2E p50", "s", 1e-3))
             if c]
    basis = b["basis"]
    tag = ("estimated, not validated" if basis["estimated"] else "validated path" if basis["validated"]
           else "widened: " + "; ".join(basis["widened_for"]))
    return "real vLLM expected within: " + ", ".join(cells) + f" ({tag})"


def _figure(x: float) -> str:
    """Three significant figures, thousands grouped rather than in exponent form (a wide band's 1,120 ms
    read 1.12e+03); only a figure under 0.001 (of the line's unit) keeps the exponent."""
    if x >= 1000:
        return f"{x:,.0f}"
    return f"{x:.3g}" if x >= 1e-3 or x == 0 else f"{x:.2e}"


def serving_error_band() -> dict | None:
    """The error band of kernel-table step costs with the default overheads on the validated path
    (H100), from the fit's held-out (leave-one-model-out) TPOT errors against real vLLM: the
    step-time factors at the ends of their 95% prediction interval (`interval`; real = simulated /
    (1 + error)). A run's own band, widened for its path, is summary.json's `error_band`; a plan's,
    `step_factors`."""
    errors = held_out_errors().get("tpot_mean_ms")
    if errors is None or not len(errors):
        return None
    lo, hi = interval(errors)
    return {"slower": round(float(np.exp(hi)), 4), "faster": round(float(np.exp(lo)), 4),
            "basis": f"held-out (leave-one-model-out) TPOT error against real vLLM on H100 SXM, {len(errors)} "
                     f"stages, {BAND_LEVEL:.0%} prediction interval (docs/validation.md)"}


def step_factors(scenario) -> dict | None:
    """The planner's band for this scenario's path: step-time factors `slower` (>= 1) and `faster`
    (<= 1) bracketing the real iteration, and their `basis`. A user's calibrate --from-bench profile
    or a fitted profile's own held-out error as the cost model states it; else the held-out TPOT
    error of the validated path widened for this one (as `band`); None for the unit cost model."""
    path = path_of(scenario)
    if path.cost == "unit":
        return None
    own = scenario.cost_model.error_band()
    if path.cost in ("user_bench", "profile_unchecked") and own is not None:
        return own
    lo, hi = interval(held_out_errors().get("tpot_mean_ms", np.zeros(0)))  # (as serving_error_band)
    fast, slow, why = widening(path, "tpot_ms", 0.0, False)
    if path.cost == "profile_unchecked":  # (never checked: the widening alone)
        lo = hi = 0.0
    basis = (f"held-out TPOT error against real vLLM on H100 SXM ({BAND_LEVEL:.0%} prediction interval)"
             + (f", widened for: {'; '.join(why)}" if why else "") + " (docs/validation.md)")
    return {"slower": round(math.exp(hi + slow), 4), "faster": round(math.exp(lo - fast), 4), "basis": basis}
