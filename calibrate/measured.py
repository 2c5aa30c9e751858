"""Step profiles from published kernel measurements (no GPU needed).

    python -m calibrate.measured                     # regenerate every shipped profile
    servesim calibrate --from-tables sim/tables/h100_sxm --model llama-3-8b --gpu h100-sxm \
        --tp 1 --out my.yaml                         # one profile, any preset or HF-config model

The composer (sim/cost/composer.py) prices an iteration from the tables and tabulates it (`build_profile`)
into a `servesim-step-profile/v2` file (sim/cost/measured.py) on the tables' own grids: the GEMMs'
measured m values for the token and sequence curves (plus the all-reduce table's message sizes and
the CUDA-graph cut), the decode table's batch x KV-length grid and the prefill table's batch x
length grid. Then it checks the profile against the composer on held-out iteration shapes drawn the
way the schedulers produce them (decode-only, prefill-only, mixed chunked batches; none on a grid
point) and records the mean and worst relative error in the metadata.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from sim.config.checks import _int
from sim.config.errors import ScenarioError
from sim.cost.composer import SYSTEMS, TABLES, KernelTables, _round, build_profile
from sim.cost.measured import PROFILES
from sim.files import write_file
from sim.presets.hardware import HARDWARE_PRESETS, HardwareSpec
from sim.presets.memory import hybrid_block_size, kv_budget
from sim.presets.models import CPU_PRESETS, MODEL_PRESETS, ModelSpec, model_from_hf_config


def profile_from_tables(tables: Path, model: str, gpu: str | None, tp: int) -> tuple[dict, ModelSpec]:
    """`servesim calibrate --from-tables`: the v2 profile document of `model` (a preset or a
    config.json path) at `tp` on `gpu`, composed from the kernel tables in `tables` (a folder
    written by python -m calibrate.aic_import). ScenarioError naming the option for bad input."""
    _int(tp, "--tp", lo=1)
    if gpu not in HARDWARE_PRESETS:
        raise ScenarioError(f"--gpu: {gpu!r} is not one of {', '.join(HARDWARE_PRESETS)} "
                            f"(the GPU the tables were measured on)")
    if not (tables / "provenance.yaml").is_file():
        raise ScenarioError(f"--from-tables {tables}: no provenance.yaml there; expected a "
                            f"folder written by python -m calibrate.aic_import")
    if model in MODEL_PRESETS:
        spec = MODEL_PRESETS[model]
    elif Path(model).exists():
        spec = model_from_hf_config(Path(model))
    else:
        raise ScenarioError(f"--model: {model!r} is neither a preset ({', '.join(MODEL_PRESETS)}) "
                            f"nor a HF config.json path")
    if spec.num_attention_heads % tp:
        raise ScenarioError(f"--tp: {tp} does not divide {spec.name}'s {spec.num_attention_heads} attention heads")
    hw = HARDWARE_PRESETS[gpu]
    provenance = yaml.safe_load((tables / "provenance.yaml").read_text())
    try:
        return build_profile(KernelTables.load(tables, hw.hbm_bandwidth), spec, hw, tp, provenance=provenance), spec
    except ValueError as e:  # a shape the tables cannot reach (most messages name the folder)
        raise ScenarioError(f"--from-tables {tables}: {str(e).removeprefix(f'{tables}: ')}") from None


def write_profile(doc: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, yaml.safe_dump(_round(doc), sort_keys=False, width=120))


def fits(model: ModelSpec, hw: HardwareSpec, tp: int) -> bool:
    """Heads split evenly and the weights leave room for KV blocks at vLLM's defaults."""
    if model.num_attention_heads % tp:
        return False
    try:
        kv_budget(model, hw, tensor_parallel_size=tp, gpu_memory_utilization=0.9,
                  block_size=hybrid_block_size(model, hw, tp))  # (16, or a hybrid's bigger block)
    except ValueError:
        return False
    return True


def regenerate(tables_root: Path = TABLES, out: Path = PROFILES) -> list[tuple[str, str, int, dict]]:
    made = []
    for preset, system in sorted(SYSTEMS.items()):
        folder = tables_root / system
        hw = HARDWARE_PRESETS[preset]
        tables = KernelTables.load(folder, hw.hbm_bandwidth)
        provenance = yaml.safe_load((folder / "provenance.yaml").read_text())
        for name, model in sorted(MODEL_PRESETS.items()):
            if name in CPU_PRESETS:
                continue
            for tp in (1, 2, 4, 8):
                if not fits(model, hw, tp):
                    continue
                try:
                    doc = build_profile(tables, model, hw, tp, provenance=provenance)
                except ValueError as e:  # no rows for this model's kernels on this GPU
                    print(f"{preset:<10} {name:<12} tp{tp}: {e}; no profile (the roofline prices it)",
                          file=sys.stderr)
                    continue
                write_profile(doc, out / preset / f"{name}-tp{tp}.yaml")
                made.append((preset, name, tp, doc["metadata"]))
                print(f"{preset:<10} {name:<12} tp{tp}: held-out MAPE "
                      f"{100 * doc['metadata']['heldout_mape']:.3f}%, worst "
                      f"{100 * doc['metadata']['heldout_max_error']:.3f}%", file=sys.stderr)
    return made


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", type=Path, default=TABLES)
    ap.add_argument("--out", type=Path, default=PROFILES)
    args = ap.parse_args(argv)
    regenerate(args.tables, args.out)


if __name__ == "__main__":
    main()
