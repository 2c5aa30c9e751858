"""`servesim calibrate` and `servesim validate`: what each does with its request
(calibrate/command_requests.py), printed through sim/reporting/console.py. torch and the calibration
modules load inside the functions: the command line is built without them."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from calibrate.command_requests import CalibrateRequest, ValidateRequest
from sim.config.errors import CommandFailed, ScenarioError, os_message
from sim.reporting.console import err, esc, fmt, out, show
from sim.reporting.progress import Progress


def calibrate(r: CalibrateRequest) -> None:
    """A profile from --from-bench, --from-tables or --from-runs, else timed on --device."""
    if r.base_profile is not None and not r.from_bench:
        raise ScenarioError("--profile is the base of --from-bench's fit; give --from-bench RESULT.json too")
    if r.from_bench:
        return _from_bench(r)
    if r.from_tables is not None:
        return _from_tables(r.from_tables, r.model, r.gpu, r.tp, r.out)
    if r.from_runs:
        return _from_runs(list(r.from_runs), r.model, r.out)
    try:
        import torch
    except ImportError:
        raise CommandFailed("calibrate needs torch (and triton on CUDA): pip install -e '.[gpu]'", 2) from None
    from calibrate.harness import CalibrationError
    from calibrate.harness import calibrate as run_calibration

    device = r.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        torch.set_num_threads(1)  # small CPU ops gain nothing from threads; steadier timings
    try:
        with Progress("calibrating", "steps") as progress:
            result = run_calibration(r.model, device, r.out, grid=r.grid, repeats=r.repeats, burst=r.burst,
                                     warmup=r.warmup, seed=r.seed, attention=r.attention, progress=progress, log=err)
    except CalibrationError as e:
        raise CommandFailed(str(e), 2) from None
    except KeyboardInterrupt:
        raise CommandFailed("interrupted; no profile written", 130) from None
    mape, worst = result["heldout_mape"], result["heldout_max_error"]
    held = "no held-out shapes" if mape is None else f"held-out MAPE {mape:.1%}, max {worst:.1%}"
    out(f"profile: {result['profile']} ({result['shapes']} shapes in "
        f"{result['wall_s']:.0f} s; fit MAPE {result['fit_mape']:.1%}, {held})")
    out(f"measurements: {result['csv']}")


def _from_runs(runs: list[Path], model: str, path: Path) -> None:
    try:
        from calibrate.fit import write_profile
        from calibrate.vllm_engine import fit_runs

        _, meta, fit = fit_runs(runs, model)
        write_profile(path, fit, meta)
    except OSError as e:
        raise CommandFailed(os_message(e), 2) from None
    out(f"profile: {path} ({meta['notes']}; held-out MAPE {meta['heldout_mape']:.1%}, "
        f"max {meta['heldout_max_error']:.1%})")


def _from_bench(r: CalibrateRequest) -> None:
    from calibrate.overheads import (
        FIT_METRICS,
        base_of_another_preset,
        bench_model,
        bench_profile,
        bench_warnings,
        fit_bench,
        write_bench_profile,
    )

    benches, base = list(r.from_bench), r.base_profile
    try:
        model_value = bench_model(benches, r.model, r.gpu, r.tp, r.overrides, base)
        assert r.gpu is not None  # (checked by bench_model)
        with Progress("fitting overheads", "grid points") as progress:
            result = fit_bench(benches, model_value, r.gpu, r.tp, r.overrides, profile=base, tick=progress)
        write_bench_profile(bench_profile(result, benches), r.out)
    except OSError as e:
        raise CommandFailed(os_message(e), 2) from None
    label = {"ttft_p50_ms": "TTFT p50", "tpot_mean_ms": "TPOT mean", "e2e_p50_s": "E2E p50"}
    unit = {"ttft_p50_ms": "ms", "tpot_mean_ms": "ms", "e2e_p50_s": "s"}  # (the fit's keys carry their unit)
    for before, after in zip(result["before"], result["after"]):
        cells = "; ".join(f"{label[k]} {after.real[k]:.4g} {unit[k]} real, error {before.error[k]:+.1%} -> "
                          f"{after.error[k]:+.1%}" for k in FIT_METRICS)
        out(f"{before.name}: {cells}")
    mismatch = base_of_another_preset(result["scenario"]) if base is not None else None
    if mismatch:
        err(f"warning: --profile {base} was fitted on the preset {mismatch!r}, whose shape is not "
            f"--model's ({result['scenario'].model.name}): its step times are another model's")
    for _, held in result["held_out"]:
        cells = "; ".join(f"{label[k]} {held.error[k]:+.1%}" for k in FIT_METRICS)
        out(f"held out, fitted on the other runs: {held.name}: {cells}")
    p = result["params"]
    out("fitted: " + ", ".join(f"{k} {v}" for k, v in p.items())
        + (f" (on top of the iterations of {base})" if base is not None else ""))
    which = ("the held-out error above" if result["held_out"] else
             "the error above, on the run it was fitted on (give two or more runs for a held-out one)")
    out(f"profile: {r.out} (use it as cost_model: {{profile: {r.out}}}; the plan's error band is {which})")
    for line in bench_warnings(result):
        err(f"warning: {line}")


def _from_tables(tables: Path, model: str, gpu: str | None, tp: int, path: Path) -> None:
    from calibrate.measured import profile_from_tables, write_profile

    doc, spec = profile_from_tables(tables, model, gpu, tp)
    write_profile(doc, path)
    meta = doc["metadata"]
    out(f"profile: {path} ({spec.name} on {gpu}, tp {tp}; the profile reproduces the tables' own "
        f"composition within {meta['heldout_max_error']:.2%} on held-out shapes (mean "
        f"{meta['heldout_mape']:.2%}): a check of the profile, not of accuracy against a real server, "
        "which docs/validation.md reports)")


def validate(r: ValidateRequest) -> None:
    """Both halves (or one), the comparison table, and CommandFailed (exit 1) when the verdict fails."""
    try:
        import torch  # noqa: F401  (said here, before anything loads)
    except ImportError:
        raise CommandFailed("validate needs torch: pip install -e '.[gpu]'", 2) from None
    from calibrate.comparison import passed, verdict
    from calibrate.validation_job import run_validation

    try:
        outcome = run_validation(r, progress=Progress, say=err)
    except ModuleNotFoundError as e:
        if e.name != "simpy":
            raise
        raise CommandFailed("the simulator half needs simpy, which is not installed here: run the real "
                            "engine alone with --real-only, then --compare-only where simpy is", 2) from None
    except OSError as e:
        raise CommandFailed(os_message(e)) from None
    except KeyboardInterrupt:
        raise CommandFailed("interrupted; the output is incomplete (no comparison.md / real/run.json "
                            "written)", 130) from None
    if outcome.result is not None:
        show(_comparison_table(outcome.scenario.name, outcome.result))
        for note in outcome.result.notes:  # (also in comparison.md) what makes the verdict worth less
            if note.startswith("warning:"):
                err(note)
    out(outcome.message)
    if outcome.result is not None and not passed(outcome.result.comparison):  # written, but a failed check
        raise CommandFailed(f"verdict: {verdict(outcome.result.comparison)}")


def _comparison_table(name: str, result: Any) -> Any:
    from rich.table import Table

    from calibrate.comparison import verdict

    t = Table(title=esc(f"servesim validate: {name}"), caption="error = (simulated - real) / real; "
              "latencies in ms", title_justify="left", caption_justify="left", header_style="bold")
    for col in ("metric", "stat", "real", "simulated", "error", "tolerance"):
        t.add_column(col, justify="left" if col in ("metric", "stat") else "right")
    for row in result.comparison.itertuples():
        tol = "" if row.tolerance_pct != row.tolerance_pct else \
            f"±{row.tolerance_pct:g}% " + ("[green]ok[/]" if row.within else "[red]MISS[/]")
        t.add_row(row.metric, row.stat, fmt(row.real, 2), fmt(row.sim, 2), f"{row.error_pct:+.1f}%", tol)
    t.caption += f"\nverdict: {verdict(result.comparison)}"
    return t
