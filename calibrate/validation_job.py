"""What `servesim validate` is asked, checked, and the runs it makes: our real engine
(calibrate/engine.py) or real vLLM (calibrate/vllm_engine.py), then the simulator, on the same
requests; or either half alone (--real-only here, --compare-only on another machine).

    request = ValidateRequest(scenario=path, profile=profile_yaml)
    outcome = run_validation(request, progress=bar, say=print)   # ScenarioError: one line
    outcome.result                                               # the Validation (None: --real-only)

`progress(label, unit)` is a context manager giving a progress(done, total) callback; `say(text)`
hears what the run does while it does it (vLLM's start-up takes minutes).
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from calibrate import validate as V
from calibrate.command_requests import ValidateRequest
from sim.config.errors import ScenarioError
from sim.scenario import Scenario, load_scenario

Progress = Callable[[str, str], AbstractContextManager]


@dataclass(frozen=True)
class ValidationOutcome:
    scenario: Scenario
    out_dir: Path
    result: Any                       # V.Validation; None when only the real half ran
    message: str                      # the closing line for the user


def check(r: ValidateRequest) -> None:
    """The options both engines share, before anything loads."""
    if r.engine not in V.ENGINES:
        raise ScenarioError(f"--engine {r.engine!r}: allowed: {', '.join(V.ENGINES)}")
    if not 0 <= r.warmup_fraction < 1:
        raise ScenarioError(f"--warmup-fraction: {r.warmup_fraction:g} is not in [0, 1)")
    if r.real_only and r.compare_only is not None:
        raise ScenarioError("--real-only and --compare-only: give one of them (the first runs "
                            "the real engine, the second only the simulator)")


def run_validation(r: ValidateRequest, progress: Progress, say: Callable[[str], None]) -> ValidationOutcome:
    check(r)
    return _vllm(r, progress, say) if r.engine == "vllm" else _ours(r, progress)


def _compared_dir(r: ValidateRequest, default: Path) -> Path:
    if r.out is not None:
        return r.out
    if r.compare_only is not None:  # beside the real/ folder it reads
        return r.compare_only.parent if r.compare_only.name == "real" else r.compare_only
    return default


def _ours(r: ValidateRequest, progress: Progress) -> ValidationOutcome:
    if r.setup or r.venv is not None:
        raise ScenarioError("--setup/--vllm-venv: only with --engine vllm")
    if r.compare_only is not None and (r.device is not None or r.clock is not None):
        raise ScenarioError("--device/--clock: not used with --compare-only (the real run recorded its own)")
    if r.profile is None and not r.real_only:
        raise ScenarioError("--profile FILE is required (the simulator's cost model); only "
                            "--real-only runs without one")
    device = r.device or "cpu"
    sc = load_scenario(r.scenario, overrides=r.overrides, seed=r.seed)
    out_dir = _compared_dir(r, Path("runs") / f"validate-{sc.name}")
    done = f"output: {out_dir}/ (comparison.md, comparison.csv, comparison.png, real/, sim/)"
    if r.compare_only is not None:
        assert r.profile is not None  # (required above unless --real-only, which excludes this)
        prof = V.check_profile(sc, r.profile)
        real = V.load_real(r.compare_only, sc)
        V.check_out_dir(out_dir)
        result = V.compare_real(sc, prof, real, warmup_fraction=r.warmup_fraction)
        V.write(result, out_dir)
        return ValidationOutcome(sc, out_dir, result, done)
    V.check_out_dir(out_dir)
    if device == "cpu":
        import torch

        torch.set_num_threads(1)  # as servesim calibrate measures the CPU
    if r.real_only:
        prof = V.check_profile(sc, r.profile) if r.profile is not None else None
        with progress("real engine", "requests") as bar:
            real = V.run_real(sc, device=device, clock=r.clock, prof=prof, progress=bar)
        d = V.write_real(real, out_dir)
        meta = real.meta
        return ValidationOutcome(sc, out_dir, None, (
            f"real engine: {len(real.result.requests)} requests, {meta['iterations']} iterations in "
            f"{meta['wall_s']:.1f} s on {meta['device_name']} (engine overhead "
            f"{meta['engine_overhead_ms']:.3f} ms per iteration)\n"
            f"output: {d}/ ({', '.join(V.REAL_FILES)}); compare on a machine with simpy: servesim validate "
            f"{r.scenario} --profile FILE --compare-only {out_dir}"))
    assert r.profile is not None  # (required above unless --real-only)
    with progress("real engine", "requests") as bar:
        result = V.validate(sc, r.profile, device=device, clock=r.clock, progress=bar,
                            warmup_fraction=r.warmup_fraction)
    V.write(result, out_dir)
    return ValidationOutcome(sc, out_dir, result, done)


def _vllm(r: ValidateRequest, progress: Progress, say: Callable[[str], None]) -> ValidationOutcome:
    """Real vLLM in its own virtualenv, then the simulator (a profile fitted on vLLM's iterations
    when none is given)."""
    from calibrate import vllm_engine

    if r.device not in (None, "cpu"):
        raise ScenarioError(f"--device {r.device}: --engine vllm runs vLLM's CPU backend only")
    clock = r.clock or "cpu"
    sc = load_scenario(r.scenario, overrides=r.overrides, seed=r.seed)
    out_dir = _compared_dir(r, Path("runs") / f"validate-vllm-{sc.name}")
    if r.compare_only is not None:
        real = V.load_real(r.compare_only, sc)
        V.check_out_dir(out_dir)
    else:
        venv = r.venv or vllm_engine.default_venv()
        if r.profile is not None:
            V.check_profile(sc, r.profile)
        V.check_out_dir(out_dir)
        workload = V.build_workload(sc.workload, np.random.default_rng(sc.seed))
        vllm_engine.check_vllm_scenario(sc, workload)  # before minutes of setup or start-up
        if r.setup:
            vllm_engine.setup(venv)
        say(f"vLLM: starting the engine in {venv} (start-up and compilation take 1-2 min)")
        with progress("vLLM", "requests") as bar:
            real = V.run_vllm_real(sc, out_dir=out_dir, venv=venv, clock=clock, progress=bar, workload=workload)
        if r.real_only:
            d = V.write_real(real, out_dir)
            return ValidationOutcome(sc, out_dir, None, f"vLLM: {len(real.result.requests)} requests, "
                                                        f"{real.meta['iterations']} iterations; output: {d}/")
    result = V.compare_vllm(sc, real, out_dir=out_dir, profile=r.profile, warmup_fraction=r.warmup_fraction)
    V.write(result, out_dir)
    fitted = ", profile.yaml (fitted on vLLM's iterations)" if r.profile is None else ""
    return ValidationOutcome(sc, out_dir, result, f"output: {out_dir}/ (comparison.md, comparison.csv, "
                                                  f"comparison.png, real/, sim/{fitted})")
