"""What `servesim calibrate` and `servesim validate` are asked: each field with how the command line
spells it (sim/config/options.py), read by cli.py to declare the options. Plain data, no torch: the
command line is built from these on every call, on machines without torch too."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sim.config.options import argument, option


@dataclass(frozen=True)
class CalibrateRequest:
    """`servesim calibrate`'s options: time a step on a device, or fit from tables, runs or benchmarks."""
    model: str = field(metadata=option(
        "Model preset built with random weights, e.g. [bold]llama-3-8b[/] (GPU) or [bold]tiny[/] (CPU).",
        show_default=False))
    out: Path = field(metadata=option(
        "Profile YAML to write; the raw measurements go next to it (.csv).",
        "--out", "-o", metavar="FILE", show_default=False))
    device: str | None = field(default=None, metadata=option(
        "cpu, cuda or cuda:N. \\[default: cuda if available, else cpu]", show_default=False))
    grid: str | None = field(default=None, metadata=option(
        "Batch-shape grid: small or full. \\[default: full on cuda, small on cpu]", show_default=False))
    repeats: int | None = field(default=None, metadata=option(
        "Rounds over the grid, each in a fresh random order. \\[default: 6 on cuda, 8 on cpu]", show_default=False))
    burst: int | None = field(default=None, metadata=option(
        "Timed steps per shape and round, run back to back after one left-out step; the median of all is fitted. "
        "\\[default: 3]", show_default=False))
    warmup: int | None = field(default=None, metadata=option(
        "Untimed steps per shape first. \\[default: 3]", show_default=False))
    seed: int = field(default=0, metadata=option(
        "Seeds weights, token ids, block layout, held-out shapes and the run order."))
    attention: str | None = field(default=None, metadata=option(
        "triton (paged kernels) or torch (gather + SDPA). \\[default: triton on cuda, torch on cpu]",
        show_default=False))
    from_tables: Path | None = field(default=None, metadata=option(
        "Build the profile from published kernel timings instead of timing a GPU: a tables folder, e.g. "
        "[bold]sim/tables/h100_sxm[/] (no torch needed). --model may then be a preset or a HF config.json.",
        "--from-tables", metavar="DIR", show_default=False))
    gpu: str | None = field(default=None, metadata=option(
        "With --from-tables: the hardware preset the tables were measured on.", show_default=False))
    tp: int = field(default=1, metadata=option("With --from-tables: tensor-parallel size.", "--tp"))
    from_runs: tuple[Path, ...] = field(default=(), metadata=option(
        "Fit the profile on the iterations that [bold]servesim validate[/] recorded (its output folder or real/; "
        "e.g. real vLLM runs). Repeatable: several workloads cover more batch shapes.",
        "--from-runs", metavar="DIR", show_default=False))
    from_bench: tuple[Path, ...] = field(default=(), metadata=option(
        "Fit the engine overheads (request handling, per-iteration host and sync time, scheduling lag) to "
        "[bold]vllm bench serve --save-result --save-detailed[/] results of your server: --model, --gpu, --tp and "
        "--set engine.KEY=VALUE describe it. Repeatable (several loads).",
        "--from-bench", metavar="JSON", show_default=False))
    overrides: tuple[str, ...] = field(default=(), metadata=option(
        "With --from-bench: a scenario key of your server's engine, e.g. engine.max_num_seqs=128 (repeatable).",
        "--set", metavar="KEY=VALUE", show_default=False))
    base_profile: Path | None = field(default=None, metadata=option(
        "With --from-bench: the step costs to fit on top of, instead of the GPU's kernel tables: a profile of your "
        "engine's own iterations (calibrate --from-runs or --device: the iterations hold the host work, so no host "
        "floor is fitted on top), or a kernel-table one.", "--profile", metavar="FILE", show_default=False))


@dataclass(frozen=True)
class ValidateRequest:
    """`servesim validate`'s options (calibrate/validation_job.py runs them)."""
    scenario: Path = field(metadata=argument(
        "Scenario YAML (continuous or chunked, one replica), e.g. scenarios/validate-tiny-cpu.yaml."))
    profile: Path | None = field(default=None, metadata=option(
        "Step-cost profile YAML (from [bold]servesim calibrate[/]) for the simulator; it replaces the scenario's "
        "cost_model. Optional with --real-only (it then sets the dtype and is recorded).",
        metavar="FILE", show_default=False))
    device: str | None = field(default=None, metadata=option(
        "Where the real engine runs: cpu, cuda or cuda:N. \\[default: cpu]", show_default=False))
    out: Path | None = field(default=None, metadata=option(
        "Output directory. \\[default: runs/validate-<scenario name>; with --compare-only, its REAL_DIR]",
        "--out", "-o", metavar="DIR", show_default=False))
    clock: str | None = field(default=None, metadata=option(
        "wall (real time) or cpu (the engine thread's CPU seconds, idle time skipped: steady on a shared machine). "
        "\\[default: cpu on cpu, wall on cuda]", show_default=False))
    seed: int | None = field(default=None, metadata=option(
        "Override the scenario's seed.", metavar="N", show_default=False))
    overrides: tuple[str, ...] = field(default=(), metadata=option(
        "Override a scenario key, as for [bold]run[/]. Repeatable.", "--set", metavar="KEY=VALUE", show_default=False))
    real_only: bool = field(default=False, metadata=option(
        "Run only the real engine and write DIR/real/ (no simulator, no simpy: for a GPU machine); compare later "
        "with --compare-only.", "--real-only"))
    compare_only: Path | None = field(default=None, metadata=option(
        "Skip the real engine: read the real run that --real-only wrote to REAL_DIR, simulate the same requests "
        "and compare.", "--compare-only", metavar="REAL_DIR", show_default=False))
    warmup_fraction: float = field(default=0.1, metadata=option(
        "Latency percentiles leave out this share of the first requests by arrival (they meet an empty engine).",
        metavar="F"))
    engine: str = field(default='servesim', metadata=option(
        "servesim (our engine: a real model step under the simulator's scheduler) or vllm (real vLLM on the CPU, "
        "in its own venv; the simulator's profile is fitted on vLLM's own iterations unless --profile).",
        metavar="NAME"))
    setup: bool = field(default=False, metadata=option(
        "With --engine vllm: build the vLLM venv first if it is missing (calibrate/vllm_setup.sh, ~2 min, ~3.4 GB).",
        "--setup"))
    venv: Path | None = field(default=None, metadata=option(
        "The vLLM virtualenv. \\[default: $SERVESIM_VLLM_VENV or .vllm-venv in the repository]",
        "--vllm-venv", metavar="DIR", show_default=False))
