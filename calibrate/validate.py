"""`servesim validate`: the real engine and the simulator on the same requests, compared.

    workload = build_workload(scenario.workload, rng)            # one Workload, used by both sides
    sim      = simulate(scenario with the profile P as its cost model, workload=workload)
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

import contextlib
import dataclasses
import datetime
import re
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from sim.config.errors import ScenarioError
from sim.cost.registry import ProfileCost, load_profile
from sim.files import probe_writable
from sim.scenario import Scenario
from sim.workload.generators import Workload, build_workload

from .comparison import Validation, compare, full_compare, saturation_warning, write  # noqa: F401  (for callers)
from .engine import (
    EngineResult,
    check_engine_scenario,
    check_workload,
    num_blocks,
    run_engine,
    without_prefix_caching,
)
from .harness import use_device
from .real_run import REAL_FILES, REAL_RUN_FORMAT, RealRun, load_real, write_real  # noqa: F401

CLOCKS = ("wall", "cpu")
ENGINES = ("servesim", "vllm")  # --engine: our engine (calibrate/engine.py) or real vLLM


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


def check_device(device: str) -> None:
    import torch

    if not (device == "cpu" or device == "cuda" or re.fullmatch(r"cuda:\d+", device)):
        raise ScenarioError(f"--device {device!r}: allowed: cpu, cuda, cuda:N")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ScenarioError(f"--device {device}: CUDA is not available on this machine "
                            f"(torch {torch.__version__}); use --device cpu")
    if device.startswith("cuda") and torch.device(device).index is not None \
            and torch.device(device).index >= torch.cuda.device_count():
        raise ScenarioError(f"--device {device}: only {torch.cuda.device_count()} CUDA devices")


def check_out_dir(out_dir: Path) -> None:
    """--out must be a folder we can write, checked before minutes of real steps."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ScenarioError(f"--out {out_dir}: exists and is not a directory")
    created = [d for d in (out_dir, *out_dir.parents) if not d.exists()]
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe_writable(out_dir)
    except OSError as exc:
        raise ScenarioError(f"--out {out_dir}: cannot write there ({exc.strerror or exc})") from None
    finally:  # leave no empty folder behind: results create it again
        for d in created:
            with contextlib.suppress(OSError):
                d.rmdir()


def check_profile(scenario: Scenario, profile: Path):
    """Load `profile` and check that it can price this scenario's real engine."""
    profile = Path(profile).absolute()
    prof = load_profile(profile, "--profile")
    meta = prof.metadata
    if meta["tensor_parallel_size"] != 1:
        raise ScenarioError(f"--profile {profile}: fitted at tensor_parallel_size="
                            f"{meta['tensor_parallel_size']}; the real engine runs 1")
    if meta["model"] != scenario.model.name:
        raise ScenarioError(f"--profile {profile}: metadata.model is {meta['model']!r} but the "
                            f"scenario runs model {scenario.model.name!r}; calibrate that model "
                            f"(servesim calibrate --model {scenario.model.name})")
    return prof


def _resolve_clock(device: str, clock: str | None) -> str:
    clock = clock or ("cpu" if device == "cpu" else "wall")
    if clock not in CLOCKS:
        raise ScenarioError(f"--clock {clock!r}: allowed: {', '.join(CLOCKS)}")
    if clock == "cpu" and device != "cpu":
        raise ScenarioError(f"--clock cpu counts CPU seconds and cannot see {device} time; "
                            f"use --clock wall")
    return clock


def check_memory(scenario: Scenario, device: str, dtype=None) -> None:
    """Refuse, before allocating, a model + KV cache that cannot fit: on the CPU the limit of
    `servesim calibrate` (small models such as tiny), on CUDA the free memory less a reserve."""
    import torch

    from .harness import CPU_WEIGHT_BYTES, RESERVE_BYTES

    m, e, where = scenario.model, scenario.engine, _where(scenario)
    cuda = device.startswith("cuda")
    elem = torch.empty((), dtype=dtype or (torch.bfloat16 if cuda else torch.float32)).element_size()
    weights = m.num_params * elem
    if not cuda:
        if weights > CPU_WEIGHT_BYTES:
            raise ScenarioError(f"{where}model: {m.name} has {weights / 1e9:.1f} GB of weights in "
                                f"float32; the real engine on the CPU is for small models such as "
                                f"tiny (use --device cuda)")
        return
    blocks = num_blocks(scenario)
    block_bytes = 2 * m.num_layers * e.block_size * m.kv_dim * elem
    free = torch.cuda.mem_get_info(torch.device(device))[0]
    if weights + blocks * block_bytes + RESERVE_BYTES > free:
        fit = max(0, int((free - weights - RESERVE_BYTES) // block_bytes))
        raise ScenarioError(f"{where}engine.num_gpu_blocks: {blocks} blocks need "
                            f"{blocks * block_bytes / 1e9:.1f} GB of KV cache beside "
                            f"{weights / 1e9:.1f} GB of weights and a {RESERVE_BYTES / 2**30:.0f} "
                            f"GiB reserve, but {free / 1e9:.1f} GB are free on {device}; set "
                            f"engine.num_gpu_blocks <= {fit}")


def _where(scenario: Scenario) -> str:
    return f"{scenario.source}: " if scenario.source else ""


def validate(scenario: Scenario, profile: Path, *, device: str = "cpu", clock: str | None = None,
             progress: Callable[[int, int], None] | None = None, warmup_fraction: float = 0.1) -> Validation:
    """Run the simulator (cost model: `profile`) and the real engine on the scenario's requests.
    `clock` defaults to cpu on the CPU, wall on CUDA."""
    scenario = without_prefix_caching(scenario)  # as our engine runs it (calibrate/engine.py)
    check_engine_scenario(scenario)
    check_device(device)
    _resolve_clock(device, clock)
    rng = np.random.default_rng(scenario.seed)
    workload = build_workload(scenario.workload, rng)
    check_workload(workload, _where(scenario))
    prof = check_profile(scenario, profile)
    # The simulator first: it is fast, and its checks reject a bad scenario before real steps.
    sim = simulate_half(scenario, prof, workload)
    real = run_real(scenario, device=device, clock=clock, prof=prof, progress=progress,
                    workload=workload, rng=rng)
    return compare_real(scenario, prof, real, sim=sim, warmup_fraction=warmup_fraction)


def run_vllm_real(scenario: Scenario, *, out_dir: Path, venv: Path | None = None, clock: str = "cpu",
                  progress: Callable[[int, int], None] | None = None,
                  workload: Workload | None = None) -> RealRun:
    """`workload`: the scenario's own (drawn here when not given)."""
    from . import vllm_engine

    if clock not in CLOCKS:
        raise ScenarioError(f"--clock {clock!r}: allowed: {', '.join(CLOCKS)}")
    if workload is None:
        workload = build_workload(scenario.workload, np.random.default_rng(scenario.seed))
    vllm_engine.check_vllm_scenario(scenario, workload)
    vllm_engine.venv_python(venv or vllm_engine.default_venv())  # before anything is written
    return vllm_engine.run_vllm(scenario, workload, venv=venv, clock=clock, progress=progress,
                                log=Path(out_dir) / "real" / "vllm.log")


def compare_vllm(scenario: Scenario, real: RealRun, *, out_dir: Path, profile: Path | None = None,
                 warmup_fraction: float = 0.1) -> Validation:
    """The simulator half of `--engine vllm`: with --profile, or a profile fitted on the real
    run's iterations (out_dir/profile.yaml)."""
    from . import vllm_engine
    from .fit import write_profile

    if profile is not None:
        prof = check_profile(scenario, profile)
    else:
        prof, meta, fit = vllm_engine.fit_profile(real, scenario)
        path = Path(out_dir) / "profile.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_profile(path, fit, meta)
        prof = load_profile(path, "profile fitted on the vLLM run")
    v = compare_real(scenario, prof, real, warmup_fraction=warmup_fraction)
    # the scheduler alone: priced with vLLM's own iteration times, does it batch as vLLM did?
    v.replay = scheduling_replay(scenario, real)
    v.notes.insert(4, replay_note(v.replay))
    return v


def run_real(scenario: Scenario, *, device: str = "cpu", clock: str | None = None, prof=None,
             progress: Callable[[int, int], None] | None = None, workload: Workload | None = None,
             rng: np.random.Generator | None = None) -> RealRun:
    """The real half alone: no simpy, no simulator (`servesim validate --real-only`). `prof`
    (optional, a loaded profile) sets the dtype and is recorded. `workload`/`rng` default to the
    scenario's, drawn from one default_rng(seed) as `servesim run` draws them."""
    import torch

    scenario = without_prefix_caching(scenario)  # as our engine runs it (calibrate/engine.py)
    check_engine_scenario(scenario)
    check_device(device)
    clock = _resolve_clock(device, clock)
    if rng is None:
        rng = np.random.default_rng(scenario.seed)
        workload = build_workload(scenario.workload, rng)
    check_workload(workload, _where(scenario))
    meta = prof.metadata if prof is not None else {}
    dtype = getattr(torch, str(meta.get("dtype")), None)
    dtype = dtype if isinstance(dtype, torch.dtype) else None
    check_memory(scenario, device, dtype)
    use_device(torch.device(device))  # cuda:N: Triton launches on the current device
    step = _model_step(scenario, device, dtype)
    _warm_up(step, scenario)
    timer = CPUClock() if clock == "cpu" else None
    kwargs = {"clock": timer.clock, "sleep": timer.sleep} if timer else {}
    start = time.perf_counter()
    result = run_engine(scenario, step, workload, rng, progress=progress, **kwargs)
    info = {
        "format": REAL_RUN_FORMAT, "complete": True,
        "scenario": scenario.name, "source": str(scenario.source) if scenario.source else None,
        "seed": scenario.seed, "model": scenario.model.name,
        "engine": dataclasses.asdict(scenario.engine), "num_gpu_blocks": num_blocks(scenario),
        "requests": len(workload), "device": device, "device_name": _device_name(device),
        "dtype": str(step.dtype).removeprefix("torch."), "attention": step.attention,
        "clock": clock, "iterations": len(result.steps), "duration_s": result.duration_s,
        "wall_s": time.perf_counter() - start, "engine_overhead_ms": _overhead_ms(result),
        "profile": str(prof.source) if prof is not None else None,
        "torch": str(torch.__version__), "triton": _triton_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if not device.startswith("cuda") and result.summary is not None:
        # the estimates use the scenario's GPU peaks: meaningless for a CPU run
        result.summary["mfu"] = result.summary["mbu"] = None
    return RealRun(result=result, workload=workload, meta=info)


def simulate_half(scenario: Scenario, prof, workload: Workload):
    """The simulator on `workload` with the profile as its cost model (imports simpy)."""
    from sim.cost.registry import CostModelSpec
    from sim.simulate import simulate

    return simulate(dataclasses.replace(scenario, cost_model=CostModelSpec("profile", {"profile": prof})),
                    workload=workload)


def compare_real(scenario: Scenario, prof, real: RealRun, *, sim=None, warmup_fraction: float = 0.1) -> Validation:
    """The simulator on the real run's own requests, and the comparison (latencies over the
    requests after the first `warmup_fraction` by arrival)."""
    if real.meta.get("engine_kind") != "vllm":  # our engine runs without prefix caching
        scenario = without_prefix_caching(scenario)
    if sim is None:
        sim = simulate_half(scenario, prof, real.workload)
    r = real.result
    ratios = step_ratios(r, ProfileCost(prof))
    n = len(r.requests)
    notes = _notes(scenario, prof, real.meta, r, sim, ratios) + [
        f"latencies over the {n - int(n * warmup_fraction)} requests after the first {warmup_fraction:.0%} by "
        f"arrival (warm-up: they meet an empty engine); throughputs over all {n}"]
    return Validation(real=r, sim=sim, comparison=full_compare(r, sim, warmup_fraction),
                      notes=notes,
                      step_ratio=float(np.median(ratios)) if len(ratios) else np.nan,
                      real_run=real)


class ReplayCost:
    """The real run's own iteration durations, in the order it ran them, whatever batch is asked
    about; the batches asked about are kept. With fast_forward off the simulator prices one
    iteration per call, so as long as it schedules what the real engine scheduled, its timeline
    is the real one to the float, and the first batch that differs is a scheduling difference."""

    def __init__(self, durations: np.ndarray):
        self.durations = np.asarray(durations, dtype=np.float64)
        self.asked: list = []

    def step_times(self, stats, steps: int = 1) -> np.ndarray:
        k = min(len(self.asked), len(self.durations) - 1)  # past the end: the last duration again
        self.asked.append(stats)
        return np.full(steps, self.durations[k])


def _same_batch(a, b) -> bool:
    return (a.num_decodes == b.num_decodes and a.decode_context_sum == b.decode_context_sum
            and sorted(zip(a.prefill_lens.tolist(), a.prefill_contexts.tolist()))
            == sorted(zip(b.prefill_lens.tolist(), b.prefill_contexts.tolist())))


def scheduling_replay(scenario: Scenario, real: RealRun) -> dict:
    """The simulator's scheduler priced with the real run's own iteration durations: how many of
    the real iterations it batched identically (same prefill chunks and contexts, same decodes
    and their context), where the first difference is, and the largest per-request difference in
    first-token and finish times. Every difference is the scheduler's, none the cost model's."""
    from sim.simulate import simulate

    r = real.result
    cost = ReplayCost(r.steps["duration_s"].to_numpy())  # whole iterations, as the timeline has them
    sim = simulate(scenario, workload=real.workload, fast_forward=False, cost=cost)
    n = min(len(r.stats), len(cost.asked))
    same = [_same_batch(a, b) for a, b in zip(r.stats[:n], cost.asked[:n])]
    first = next((k for k, ok in enumerate(same) if not ok), None)
    kv_sim = np.repeat(sim.steps["kv_blocks_used"].to_numpy(), sim.steps["count"].to_numpy())[:n]
    out = {"iterations_real": len(r.stats), "iterations_sim": len(cost.asked),
           "identical": int(sum(same)), "first_difference": first,
           "kv_identical": int(np.count_nonzero(kv_sim == r.steps["kv_blocks_used"].to_numpy()[:n])),
           "max_first_token_diff_s": float(np.nanmax(np.abs(sim.requests["first_token_s"].to_numpy()
                                                           - r.requests["first_token_s"].to_numpy()))),
           "max_finish_diff_s": float(np.nanmax(np.abs(sim.requests["finish_s"].to_numpy()
                                                      - r.requests["finish_s"].to_numpy())))}
    if first is not None:
        out["real_batch"], out["sim_batch"] = _show_batch(r.stats[first]), _show_batch(cost.asked[first])
    return out


def _show_batch(b) -> str:
    chunks = ", ".join(f"{n}@{c}" for n, c in zip(b.prefill_lens.tolist(), b.prefill_contexts.tolist()))
    return f"prefill [{chunks}] (tokens@context), {b.num_decodes} decodes (context sum {b.decode_context_sum})"


def replay_note(rep: dict) -> str:
    head = (f"scheduling replay (the simulator priced with the real iterations' own durations, in "
            f"order): {rep['identical']} of {rep['iterations_real']} iterations batched identically "
            f"(simulated {rep['iterations_sim']}), KV blocks in use equal on "
            f"{rep['kv_identical']}; per request, first token within "
            f"{rep['max_first_token_diff_s'] * 1e3:.3g} ms and finish within "
            f"{rep['max_finish_diff_s'] * 1e3:.3g} ms of the real run")
    if rep["first_difference"] is None:
        return head
    return (head + f"; first difference at iteration {rep['first_difference']}: real "
            f"{rep['real_batch']}, simulated {rep['sim_batch']}")


def _notes(scenario: Scenario, prof, meta: dict, real: EngineResult, sim,
           ratios: np.ndarray) -> list[str]:
    pm = prof.metadata
    notes = [(f"scenario: {scenario.name} ({len(real.requests)} requests, seed {scenario.seed}, "
              f"model {scenario.model.name}, scheduler {scenario.engine.scheduler})"),
             (f"profile: {prof.source} (measured on {pm['device']}, model {pm['model']}, "
              f"dtype {pm['dtype']}, measured={pm['measured']})"),
             (f"real engine: {meta.get('device_name', '?')}, clock {meta['clock']}, "
              f"{len(real.steps)} iterations (simulated: {sim.summary['iterations']}), model step "
              f"{meta.get('model_step_ms_mean', 0):.2f} ms per iteration on average; the profile "
              f"prices whole vLLM iterations (schedule, model, sampling, outputs)")
             if meta.get("engine_kind") == "vllm" else
             (f"real engine: device {meta['device']} ({meta.get('device_name', '?')}), clock "
              f"{meta['clock']}, {len(real.steps)} iterations (simulated: "
              f"{sim.summary['iterations']}), engine overhead {_overhead_ms(real):.3f} ms per "
              f"iteration outside the model step"),
             _step_accuracy(real, ratios)]
    if meta.get("loaded_from"):
        notes.append(f"real run: read from {meta['loaded_from']} (recorded {meta.get('date')}, "
                     + (f"vLLM {meta.get('vllm')}, " if meta.get("vllm") else "")
                     + f"torch {meta.get('torch')}, triton {meta.get('triton')})")
    if pm["device"].startswith("CPU") != (meta["device"] == "cpu"):
        notes.append(f"warning: the profile was measured on {pm['device']!r}, the engine ran on "
                     f"{meta['device']}")
    saturated = saturation_warning(real.requests)
    return notes + meta.get("warnings", []) + ([saturated] if saturated else [])


def _device_name(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    from .harness import _device_name as cpu_name

    return cpu_name(torch.device("cpu"))


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return str(triton.__version__)


def _model_step(scenario: Scenario, device: str, dtype=None):
    from .model import ModelStep

    return ModelStep(scenario.model, device=device, dtype=dtype, num_blocks=num_blocks(scenario),
                     block_size=scenario.engine.block_size, seed=scenario.seed)


def _warm_up(step, scenario: Scenario) -> None:
    """Untimed steps before time 0 so that first-call costs (allocator, kernel selection, Triton
    compiling a kernel variant) do not land on the first requests: prefill chunks of several sizes
    (Triton's prefill tile follows the longest chunk) and decode batches of several sizes and
    contexts (the decode kernel splits the keys of few, long sequences), each shape that fits the
    cache and the token budget, three times."""
    from .model import SeqChunk, blocks_needed, synthetic_chunks

    e, bs, cap = scenario.engine, scenario.engine.block_size, num_blocks(scenario)
    budget = e.max_num_batched_tokens
    shapes = [([n], [0], []) for n in (1, 8, 64, 256, 1024, budget) if n <= budget]
    shapes += [([], [], [ctx] * b) for b in (1, 8, 64) for ctx in (16, 512, 4096)
               if b <= e.max_num_seqs]
    shapes += [([min(256, budget)], [0], [128] * min(8, e.max_num_seqs))]
    for pre, pre_ctx, dec in shapes:
        need = blocks_needed(list(zip(pre, pre_ctx)) + [(1, c) for c in dec], bs)
        if need > cap:
            continue
        chunks = synthetic_chunks(pre, pre_ctx, dec, vocab_size=scenario.model.vocab_size,
                                  block_size=bs, num_blocks=cap, seed=len(dec) + sum(pre))
        for _ in range(3):
            step.run(chunks)
    n = min(bs * cap - 1, budget, 64)  # the old minimal pair, always possible
    table = list(range(-(-(n + 1) // bs)))
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
