"""`servesim validate`: the real engine and the simulator on the same requests, compared.

    workload = build_workload(scenario.workload, rng)            # one Workload, used by both sides
    sim      = simulate(scenario with cost_model {profile: P}, workload=workload)
    real     = run_engine(scenario, ModelStep(...), workload, rng)  # calibrate/engine.py
    compare  -> comparison.csv / .md / .png (TTFT, TPOT, E2E mean/p50/p90/p99, throughput)

The simulator runs first: it is fast, and its up-front checks (a request that can never fit, a
prompt over a continuous scheduler's budget) reject a scenario before minutes of real steps.

Clocks: `wall` replays arrivals in real time and times everything with perf_counter (what a
server sees; use it on a GPU or a quiet machine). `cpu` times the engine with the CPU seconds of
its thread (time.thread_time) and skips idle time instead of sleeping through it: on a shared CPU
machine the neighbours then stretch neither the steps nor the engine's own work, which is how the
CPU calibration (calibrate/timing.py) times steps too.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sim.config import Scenario
from sim.cost import ProfileCost, load_profile
from sim.errors import ScenarioError
from sim.workload import build_workload

from .engine import (
    EngineResult,
    check_engine_scenario,
    check_workload,
    num_blocks,
    run_engine,
)

STATS = ("mean", "p50", "p90", "p99")
LATENCIES = (("ttft_ms", "ttft_s"), ("tpot_ms", "tpot_s"), ("e2e_ms", "e2e_s"))
THROUGHPUTS = ("request_throughput", "output_throughput")
CLOCKS = ("wall", "cpu")


class CPUClock:
    """The engine thread's CPU seconds plus the idle time skipped: busy time as the CPU
    calibration measures it, idle time as the workload says, neither stretched by other processes
    (nor counting the progress bar's refresh thread)."""

    def __init__(self):
        self.skipped = 0.0

    def clock(self) -> float:
        return time.thread_time() + self.skipped

    def sleep(self, dt: float) -> None:
        self.skipped += max(dt, 0.0)


@dataclass
class Validation:
    real: EngineResult
    sim: object              # sim.simulate.SimResult
    comparison: pd.DataFrame  # metric, stat, real, sim, error_pct
    notes: list[str]          # what was run, and warnings (profile measured elsewhere, ...)
    step_ratio: float         # median over the real iterations of measured / profile-predicted step


def check_device(device: str) -> None:
    import torch

    if not (device == "cpu" or device == "cuda" or device.startswith("cuda:")):
        raise ScenarioError(f"--device {device!r}: allowed: cpu, cuda, cuda:N")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ScenarioError(f"--device {device}: CUDA is not available on this machine "
                            f"(torch {torch.__version__}); use --device cpu")


def validate(scenario: Scenario, profile: Path, *, device: str = "cpu", clock: str | None = None,
             progress: Callable[[int, int], None] | None = None) -> Validation:
    """Run the simulator (cost model: `profile`) and the real engine on the scenario's requests.
    `clock` defaults to cpu on the CPU, wall on CUDA."""
    check_engine_scenario(scenario)
    check_device(device)
    clock = clock or ("cpu" if device == "cpu" else "wall")
    if clock not in CLOCKS:
        raise ScenarioError(f"--clock {clock!r}: allowed: {', '.join(CLOCKS)}")
    if clock == "cpu" and device != "cpu":
        raise ScenarioError(f"--clock cpu counts CPU seconds and cannot see {device} time; "
                            f"use --clock wall")
    profile = Path(profile).absolute()
    prof = load_profile(profile, "--profile")
    if prof.metadata["tensor_parallel_size"] != 1:
        raise ScenarioError(f"--profile {profile}: fitted at tensor_parallel_size="
                            f"{prof.metadata['tensor_parallel_size']}; the real engine runs 1")

    from sim.simulate import simulate  # the simulator half (the only simpy user here)

    rng = np.random.default_rng(scenario.seed)
    workload = build_workload(scenario.workload, rng)
    check_workload(workload)
    sim = simulate(dataclasses.replace(scenario, cost_model={"profile": profile}), workload=workload)

    step = _model_step(scenario, device, prof.metadata)
    _warm_up(step, scenario)
    timer = CPUClock() if clock == "cpu" else None
    kwargs = {"clock": timer.clock, "sleep": timer.sleep} if timer else {}
    real = run_engine(scenario, step, workload, rng, progress=progress, **kwargs)
    ratios = step_ratios(real, ProfileCost(prof))
    return Validation(real=real, sim=sim, comparison=compare(real.requests, sim.requests),
                      notes=_notes(scenario, prof, device, clock, real, sim, ratios),
                      step_ratio=float(np.median(ratios)) if len(ratios) else np.nan)


def _notes(scenario: Scenario, prof, device: str, clock: str, real: EngineResult, sim,
           ratios: np.ndarray) -> list[str]:
    meta = prof.metadata
    notes = [(f"scenario: {scenario.name} ({len(real.requests)} requests, seed {scenario.seed}, "
              f"model {scenario.model.name}, scheduler {scenario.engine.scheduler})"),
             (f"profile: {prof.source} (measured on {meta['device']}, model {meta['model']}, "
              f"dtype {meta['dtype']}, measured={meta['measured']})"),
             (f"real engine: device {device}, clock {clock}, {len(real.steps)} iterations "
              f"(simulated: {sim.summary['iterations']}), engine overhead "
              f"{_overhead_ms(real):.3f} ms per iteration outside the model step"),
             _step_accuracy(real, ratios)]
    if meta["model"] != scenario.model.name:
        notes.append(f"warning: the profile was fitted for model {meta['model']!r}, the scenario "
                     f"runs {scenario.model.name!r}")
    if meta["device"].startswith("CPU") != (device == "cpu"):
        notes.append(f"warning: the profile was measured on {meta['device']!r}, the engine ran on "
                     f"{device}")
    return notes


def _model_step(scenario: Scenario, device: str, meta: dict):
    import torch

    from .model import ModelStep

    dtype = getattr(torch, str(meta["dtype"]), None)
    return ModelStep(scenario.model, device=device,
                     dtype=dtype if isinstance(dtype, torch.dtype) else None,
                     num_blocks=num_blocks(scenario), block_size=scenario.engine.block_size,
                     seed=scenario.seed)


def _warm_up(step, scenario: Scenario) -> None:
    """A few untimed steps (a prefill, then a decode) so that first-call costs (allocator, kernel
    selection, Triton compilation) do not land on the first requests."""
    from .model import SeqChunk

    bs = scenario.engine.block_size
    n = min(bs * num_blocks(scenario) - 1, scenario.engine.max_num_batched_tokens, 64)
    table = list(range(-(-(n + 1) // bs)))
    for _ in range(3):
        step.run([SeqChunk(token_ids=[1] * n, context_len=0, block_table=table, sample=True)])
        step.run([SeqChunk(token_ids=[1], context_len=n, block_table=table, sample=True)])


def _overhead_ms(real: EngineResult) -> float:
    """Mean time per iteration spent in the engine (schedule, block tables) rather than the step."""
    busy = real.steps["duration_s"].to_numpy()
    return float((busy - real.step_s).mean() * 1e3) if len(busy) else 0.0


def step_ratios(real: EngineResult, cost: ProfileCost) -> np.ndarray:
    """Per real iteration: measured model step time / the profile's prediction for its batch.
    Separates step-cost error (or a machine running slower than when it was calibrated) from
    scheduling and queueing differences."""
    predicted = np.array([cost.step_times(s)[0] for s in real.stats])
    return real.step_s / predicted if len(predicted) else np.zeros(0)


def _step_accuracy(real: EngineResult, ratio: np.ndarray) -> str:
    if not len(ratio):
        return "no iterations"
    p10, p50, p90 = np.percentile(ratio, [10, 50, 90])
    total = real.step_s.sum() / (real.step_s / ratio).sum()
    return (f"model step time / profile prediction on the real batches: median {p50:.2f} "
            f"(p10 {p10:.2f}, p90 {p90:.2f}); total {total:.2f}")


# -- comparison ---------------------------------------------------------------------------------
def metrics(requests: pd.DataFrame) -> dict[tuple[str, str], float]:
    """(metric, stat) -> value: latencies in ms, throughputs per second over first arrival to
    last finish (as summary.json computes them)."""
    out = {}
    for name, col in LATENCIES:
        v = requests[col].dropna().to_numpy() * 1e3
        out[(name, "mean")] = float(v.mean()) if len(v) else np.nan
        for q in (50, 90, 99):
            out[(name, f"p{q}")] = float(np.percentile(v, q)) if len(v) else np.nan
    done = requests[requests["finish_s"].notna()]
    duration = float(done["finish_s"].max() - requests["arrival_s"].min()) if len(done) else np.nan
    out[("request_throughput", "per_s")] = len(done) / duration
    out[("output_throughput", "per_s")] = float(done["output_tokens"].sum()) / duration
    return out


def compare(real: pd.DataFrame, sim: pd.DataFrame) -> pd.DataFrame:
    """One row per (metric, stat): real, sim, error_pct = (sim - real) / real x 100."""
    r, s = metrics(real), metrics(sim)
    rows = [{"metric": m, "stat": st, "real": r[(m, st)], "sim": s[(m, st)],
             "error_pct": (s[(m, st)] - r[(m, st)]) / r[(m, st)] * 100 if r[(m, st)] else np.nan}
            for m, st in r]
    return pd.DataFrame(rows, columns=["metric", "stat", "real", "sim", "error_pct"])


def markdown(v: Validation) -> str:
    lines = ["# servesim validate: real engine vs simulator", ""]
    lines += [f"- {n}" for n in v.notes]
    lines += ["", "Latencies in ms, throughputs per second; error = (simulated - real) / real.", "",
              "| metric | stat | real | simulated | error |", "| --- | --- | ---: | ---: | ---: |"]
    for row in v.comparison.itertuples():
        lines.append(f"| {row.metric} | {row.stat} | {row.real:.2f} | {row.sim:.2f} | "
                     f"{row.error_pct:+.1f}% |")
    return "\n".join(lines) + "\n"


def plot(v: Validation, path: Path) -> None:
    """CDFs of TTFT, TPOT and E2E, real vs simulated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, (name, col) in zip(axes, LATENCIES):
        for label, frame, style in (("real", v.real.requests, "-"), ("simulated", v.sim.requests, "--")):
            x = np.sort(frame[col].dropna().to_numpy() * 1e3)
            ax.step(x, np.arange(1, len(x) + 1) / max(len(x), 1), style, where="post", label=label)
        ax.set_xlabel(f"{name.split('_')[0].upper()} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right")
    fig.suptitle("real engine vs simulator")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(v: Validation, out_dir: Path) -> list[Path]:
    """real/{requests,steps}.csv, sim/{requests,steps}.csv + summary.json, comparison.csv/.md/.png."""
    from sim.simulate import write_outputs

    out_dir = Path(out_dir)
    (out_dir / "real").mkdir(parents=True, exist_ok=True)
    v.real.requests.to_csv(out_dir / "real" / "requests.csv", index=False)
    v.real.steps.to_csv(out_dir / "real" / "steps.csv", index=False)
    write_outputs(v.sim, out_dir / "sim")
    v.comparison.to_csv(out_dir / "comparison.csv", index=False, float_format="%.6g")
    (out_dir / "comparison.md").write_text(markdown(v))
    plot(v, out_dir / "comparison.png")
    return [out_dir / "comparison.md", out_dir / "comparison.csv", out_dir / "comparison.png"]
