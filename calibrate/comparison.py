"""The comparison `servesim validate` writes: real vs simulated TTFT, TPOT and E2E (mean, p50,
p90, p99) and throughput, as comparison.csv / .md / .png beside the real/ and sim/ run folders."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sim.files import plain_text, save_figure, write_file

from .engine import EngineResult
from .real_run import RealRun, write_real

STATS = ("mean", "p50", "p90", "p99")
LATENCIES = (("ttft_ms", "ttft_s"), ("tpot_ms", "tpot_s"), ("e2el_ms", "e2el_s"))
THROUGHPUTS = ("request_throughput", "output_throughput")


@dataclass
class Validation:
    real: EngineResult
    sim: object              # sim.simulate.SimResult
    comparison: pd.DataFrame  # metric, stat, real, sim, error_pct
    notes: list[str]          # what was run, and warnings (profile measured elsewhere, ...)
    step_ratio: float         # median over the real iterations of measured / profile-predicted step
    real_run: RealRun | None = None  # set when the real half ran in this process (write() saves it)
    replay: dict | None = None       # --engine vllm: calibrate.validate.scheduling_replay's result


def metrics(requests: pd.DataFrame, warmup_fraction: float = 0.0) -> dict[tuple[str, str], float]:
    """(metric, stat) -> value: latencies in ms over the requests after the first
    `warmup_fraction` by arrival (they meet an empty engine: with 48 requests and none left out, a
    p99 is the one slowest request of a cold start), throughputs per second over the whole run,
    first arrival to last finish (as summary.json computes them)."""
    out = {}
    judged = requests.sort_values("arrival_s", kind="stable").iloc[int(len(requests) * warmup_fraction):]
    for name, col in LATENCIES:
        v = judged[col].dropna().to_numpy() * 1e3
        out[(name, "mean")] = float(v.mean()) if len(v) else np.nan
        for q in (50, 90, 99):
            out[(name, f"p{q}")] = float(np.percentile(v, q)) if len(v) else np.nan
    done = requests[requests["finish_s"].notna()]
    duration = float(done["finish_s"].max() - requests["arrival_s"].min()) if len(done) else np.nan
    out[("request_throughput", "per_s")] = len(done) / duration
    out[("output_throughput", "per_s")] = float(done["output_tokens"].sum()) / duration
    return out


def compare(real: pd.DataFrame, sim: pd.DataFrame, warmup_fraction: float = 0.0) -> pd.DataFrame:
    """One row per (metric, stat): real, sim, error_pct = (sim - real) / real x 100; latencies after
    the first `warmup_fraction` of requests by arrival (the same requests on both sides)."""
    r, s = metrics(real, warmup_fraction), metrics(sim, warmup_fraction)
    rows = [{"metric": m, "stat": st, "real": r[(m, st)], "sim": s[(m, st)],
             "error_pct": (s[(m, st)] - r[(m, st)]) / r[(m, st)] * 100 if r[(m, st)] else np.nan}
            for m, st in r]
    return pd.DataFrame(rows, columns=["metric", "stat", "real", "sim", "error_pct"])


# (metric, stat) -> largest |error| in % that counts as agreement (issue 21's targets: latencies
# below saturation, throughput, preemptions on a burst). Rows without one are reported only.
TOLERANCES_PCT = {(m, st): tol for m in ("ttft_ms", "tpot_ms", "e2el_ms")
                  for st, tol in (("mean", 10.0), ("p90", 15.0))}
TOLERANCES_PCT |= {("request_throughput", "per_s"): 2.0, ("output_throughput", "per_s"): 2.0,
                   ("preemptions", "count"): 10.0}
COLUMNS = ["metric", "stat", "real", "sim", "error_pct", "tolerance_pct", "within"]


def _iteration_means(steps: pd.DataFrame) -> dict[tuple[str, str], float]:
    """Batch composition per iteration (steps.csv rows weighted by their `count`: the simulator
    writes a run of identical decode iterations as one row)."""
    count = steps["count"].to_numpy(np.float64)
    n = count.sum()
    if n == 0:
        return {}
    tokens = steps["prefill_tokens"].to_numpy(np.float64) + steps["decode_tokens"].to_numpy(np.float64) * count
    return {("iterations", "count"): float(n),
            ("tokens_per_iteration", "mean"): float(tokens.sum() / n),
            ("decodes_per_iteration", "mean"): float((steps["decode_tokens"] * count).sum() / n),
            ("seqs_per_iteration", "mean"): float((steps["num_seqs"] * count).sum() / n),
            ("prefill_iterations", "share"): float(count[steps["prefill_tokens"].to_numpy() > 0].sum() / n)}


def full_compare(real, sim, warmup_fraction: float = 0.0) -> pd.DataFrame:
    """compare() plus ITL (every inter-token gap, from each run's summary), batch composition per
    iteration and preemptions, with each row's tolerance and whether the error is within it."""
    table = compare(real.requests, sim.requests, warmup_fraction)
    rows = []
    extra_real, extra_sim = {}, {}
    for run, extra in ((real, extra_real), (sim, extra_sim)):
        itl = (run.summary or {}).get("itl_ms") or {}
        for st in STATS:
            extra[("itl_ms", st)] = np.nan if itl.get(st) is None else float(itl[st])
        extra[("preemptions", "count")] = float(run.requests["preemptions"].sum())
        extra.update(_iteration_means(run.steps))
    for key in extra_real:
        r, s = extra_real[key], extra_sim.get(key, np.nan)
        err = (s - r) / r * 100 if r else (0.0 if s == r else np.nan)
        rows.append({"metric": key[0], "stat": key[1], "real": r, "sim": s, "error_pct": err})
    table = pd.concat([table, pd.DataFrame(rows)], ignore_index=True)
    tol = [TOLERANCES_PCT.get((m, st), np.nan) for m, st in zip(table["metric"], table["stat"])]
    table["tolerance_pct"] = tol
    table["within"] = [None if np.isnan(t) else bool(abs(e) <= t) for e, t in zip(table["error_pct"], tol)]
    return table[COLUMNS]


SATURATED_SERVED = 0.9  # served / offered request rate below which a run's queue was growing


def saturation_warning(requests: pd.DataFrame) -> str | None:
    """A `warning:` line when the real engine could not keep up with its arrivals: it served (its
    requests over first arrival to last finish) under 90% of the rate offered (over first to last
    arrival). Its latencies then measure a growing queue, which agreement with the simulator does
    not make a validation of steady serving. None when it kept up, or all arrived at once (a burst
    is queued by design)."""
    arrival, finish = requests["arrival_s"].to_numpy(float), requests["finish_s"].to_numpy(float)
    n = len(arrival)
    span = float(np.nanmax(arrival) - np.nanmin(arrival)) if n > 1 else 0.0
    if n < 2 or span <= 0 or not np.isfinite(finish).any():
        return None
    offered = (n - 1) / span
    served = int(np.isfinite(finish).sum()) / float(np.nanmax(finish) - np.nanmin(arrival))
    if served >= SATURATED_SERVED * offered:
        return None
    queue = requests["queue_s"].to_numpy(float) if "queue_s" in requests else np.array([np.nan])
    waited = f", median queue {np.nanmedian(queue):.3g} s" if np.isfinite(queue).any() else ""
    return (f"warning: the real engine ran saturated: it served {served:.3g} req/s of the {offered:.3g} req/s "
            f"offered{waited}; its latencies measure a growing queue, not steady serving (a lower "
            f"workload.arrival.rate validates that)")


def passed(table: pd.DataFrame) -> bool:
    """Every row with a tolerance is within it (`servesim validate` exits 1 otherwise)."""
    return not (table["within"] == False).any()  # noqa: E712  (None: not judged)


def verdict(table: pd.DataFrame) -> str:
    judged = table[table["tolerance_pct"].notna()]
    failed = judged[judged["within"] == False]  # noqa: E712  (None: not judged)
    if failed.empty:
        return f"all {len(judged)} judged rows within tolerance"
    return (f"{len(failed)} of {len(judged)} judged rows outside tolerance: "
            + ", ".join(f"{m} {st} {e:+.1f}% (tolerance {t:g}%)" for m, st, e, t in
                        zip(failed["metric"], failed["stat"], failed["error_pct"], failed["tolerance_pct"])))


def _cell(value: float) -> str:
    return "n/a" if value is None or not np.isfinite(value) else f"{value:.2f}"


def markdown(v: Validation) -> str:
    kind = (v.real_run.meta.get("engine_kind") if v.real_run is not None else None) or "servesim"
    lines = [f"# servesim validate: {'real vLLM' if kind == 'vllm' else 'real engine'} vs simulator", ""]
    lines += [f"- {n}" for n in v.notes]
    table = v.comparison
    has_tol = "tolerance_pct" in table
    lines += ["", "Latencies in ms, throughputs per second; error = (simulated - real) / real."]
    if has_tol:
        lines += [f"Verdict: {verdict(table)}."]
    lines += ["", "| metric | stat | real | simulated | error |" + (" tolerance |" if has_tol else ""),
              "| --- | --- | ---: | ---: | ---: |" + (" :---: |" if has_tol else "")]
    for row in table.itertuples():
        line = f"| {row.metric} | {row.stat} | {_cell(row.real)} | {_cell(row.sim)} | {row.error_pct:+.1f}% |"
        if has_tol:
            line += (" |" if np.isnan(row.tolerance_pct) else
                     f" ±{row.tolerance_pct:g}% {'ok' if row.within else 'MISS'} |")
        lines.append(line)
    return "\n".join(lines) + "\n"


@plain_text
def plot(v: Validation, path: Path) -> None:
    """CDFs of TTFT, TPOT and E2E, real vs simulated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    meta = v.real_run.meta if v.real_run is not None else {}
    real_label = f"vLLM {meta.get('vllm')}" if meta.get("engine_kind") == "vllm" else "real"
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, (name, col) in zip(axes, LATENCIES):
        longest = max(float(f[col].max()) for f in (v.real.requests, v.sim.requests) if f[col].notna().any()) \
            if any(f[col].notna().any() for f in (v.real.requests, v.sim.requests)) else 0.0
        # seconds past 10 s: a saturated run's TTFTs of hundreds of seconds in ms overlapped their labels
        unit, scale = ("s", 1.0) if longest > 10.0 else ("ms", 1e3)
        for label, frame, style in ((real_label, v.real.requests, "-"), ("simulated", v.sim.requests, "--")):
            x = np.sort(frame[col].dropna().to_numpy() * scale)
            ax.step(x, np.arange(1, len(x) + 1) / max(len(x), 1), style, where="post", label=label)
        ax.set_xlabel(f"{name.split('_')[0].upper()} ({unit})")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right")
    what = "real vLLM (CPU)" if meta.get("engine_kind") == "vllm" else "real engine"
    scenario = f": {meta['scenario']}, {len(v.real.requests)} requests" if meta.get("scenario") else ""
    fig.suptitle(f"{what} vs simulator{scenario} (CDF per request)")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def write(v: Validation, out_dir: Path) -> list[Path]:
    """real/ (write_real; kept as it is when the real run was read from this folder), sim/
    {requests,steps}.csv + summary.json, comparison.csv, .png and .md. comparison.md goes last and
    is removed first: a folder holding it holds a complete validation."""
    from sim.simulate import write_outputs

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "comparison.md").unlink(missing_ok=True)
    if v.real_run is None:  # a Validation built by hand: the two run files only
        (out_dir / "real").mkdir(exist_ok=True)
        write_file(out_dir / "real" / "requests.csv", v.real.requests.to_csv(index=False))
        write_file(out_dir / "real" / "steps.csv", v.real.steps.to_csv(index=False))
    else:
        loaded = v.real_run.meta.get("loaded_from")
        if not loaded or Path(loaded).resolve() != (out_dir / "real").resolve():
            write_real(v.real_run, out_dir)
    write_outputs(v.sim, out_dir / "sim")
    write_file(out_dir / "comparison.csv", v.comparison.to_csv(index=False, float_format="%.6g"))
    plot(v, out_dir / "comparison.png")
    write_file(out_dir / "comparison.md", markdown(v))
    return [out_dir / "comparison.md", out_dir / "comparison.csv", out_dir / "comparison.png"]
