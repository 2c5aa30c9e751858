"""Step profiles from published kernel measurements (no GPU needed).

    python -m calibrate.measured                     # regenerate every shipped profile
    servesim calibrate --from-tables calibrate/tables/h100_sxm --model llama-3-8b --gpu h100-sxm \
        --tp 1 --out my.yaml                         # one profile, any preset or HF-config model

The composer (calibrate/composer.py) prices an iteration from the tables; this module tabulates it
into a `servesim-step-profile/v2` file (sim/measured.py) on the tables' own grids: the GEMMs'
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

import numpy as np
import yaml

from calibrate.composer import (CUDA_GRAPH_MAX_TOKENS, DEFAULT_CPU_OVERHEAD_PER_SEQ_S,
                                DEFAULT_CPU_OVERHEAD_S, KernelTables, StepComposer, moe_dtype)
from sim.batch import BatchStats
from sim.hardware import HARDWARE_PRESETS, HardwareSpec
from sim.measured import FORMAT, PROFILES, TableProfileCost, load_table_profile
from sim.memory import kv_budget
from sim.models import CPU_PRESETS, MODEL_PRESETS, ModelSpec

TABLES = Path(__file__).resolve().parent / "tables"
HELDOUT_SHAPES = 300
# servesim hardware preset -> tables folder (calibrate/aic_import.py's GPUS)
SYSTEMS = {"h100-sxm": "h100_sxm", "h200": "h200_sxm", "a100-80gb": "a100_sxm", "l40s": "l40s",
           "b200": "b200_sxm"}


def _axis(values) -> list[float]:
    return sorted({float(v) for v in values})


def tabulate(composer: StepComposer, max_tokens: int = 32768) -> dict:
    """The profile's `model` section: every term evaluated on its grid (seconds)."""
    t = composer.tables
    # the measured m of every GEMM table this model reads (bf16 for the LM head and router, and
    # the layers' FP8 table when quantised)
    m_knots = [m for m in _axis(np.concatenate([t.gemm_table(d)["m"].to_numpy()
                                                for d in {s.dtype for s in composer.shapes}]))
               if m <= max_tokens]
    model, tp = composer.model, composer.tp
    knots = set(m_knots)
    if tp > 1:
        sizes = t.allreduce[t.allreduce["num_gpus"] == tp]["message_size"]
        per_token = model.hidden_size * model.dtype_bytes
        knots |= {s / per_token for s in sizes if 1 <= s / per_token <= max_tokens}
        knots |= {CUDA_GRAPH_MAX_TOKENS, CUDA_GRAPH_MAX_TOKENS + 1}  # graph -> eager all-reduce
    knots = sorted(knots)
    layers = model.num_layers

    if model.moe is not None:  # the fused-MoE table's own token counts
        experts = t.moe_table(moe_dtype(model))["num_tokens"]
        knots = sorted(set(knots) | {float(x) for x in experts if x <= max_tokens})

    def tokens_s(T: float) -> float:
        ms = composer.linear_ms(T)
        ms += 2 * layers * composer.allreduce_ms(int(T)) + 1e3 * composer._elementwise_s_per_token * T
        return ms / 1e3

    return {
        "tokens": {"knots": knots, "seconds": [tokens_s(T) for T in knots]},
        "sequences": {"knots": m_knots, "seconds": [composer.gemm_ms("lm_head", S) / 1e3 for S in m_knots]},
        **attention_grids(composer),
        "cpu_overhead": {"per_iteration": composer.cpu_overhead_s,
                         "per_sequence": composer.cpu_overhead_per_seq_s},
    }


def attention_grids(composer: StepComposer) -> dict:
    """The decode and prefill attention terms (seconds, every layer) on the attention table's grid,
    for the composer's KV-cache dtype."""
    layers = composer.model.num_layers
    batch, kv = composer.attention_axes("decode")
    chunks, length = composer.attention_axes("prefill")
    dec = [[layers * composer.decode_attention_ms(int(b), b * c) / 1e3 for c in kv] for b in batch]
    pre = [[layers * _prefill_ms(composer, int(b), s) / 1e3 for s in length] for b in chunks]
    return {"decode_attention": {"batch": batch, "context": kv, "seconds": dec},
            "prefill_attention": {"chunks": chunks, "length": length, "seconds": pre}}


def _prefill_ms(composer: StepComposer, b: int, s: float) -> float:
    """b fresh prompts of s tokens: what prefill_attention_ms gives for equal chunks."""
    return composer.prefill_attention_ms([s] * b, [0] * b)


def heldout_shapes(rng: np.random.Generator, max_tokens: int, max_seqs: int, n: int = HELDOUT_SHAPES):
    """Iteration shapes as the schedulers make them, off the grids: decode-only batches, prefill-only
    (one to a few chunks, fresh or after earlier chunks), and mixed chunked batches."""
    shapes = []
    for i in range(n):
        kind = i % 3
        decodes = int(rng.integers(1, max_seqs)) if kind != 1 else 0
        ctx = int(decodes * rng.uniform(40, 6000)) if decodes else 0
        lens, contexts = [], []
        if kind != 0:
            budget = max(1, max_tokens - decodes)
            for _ in range(int(rng.integers(1, 4))):
                c = int(rng.integers(17, max(18, min(budget, 6000))))
                lens.append(c)
                contexts.append(int(rng.integers(0, 4000)) if rng.random() < 0.5 else 0)
        shapes.append(BatchStats(prefill_lens=np.array(lens, dtype=np.int64),
                                 prefill_contexts=np.array(contexts, dtype=np.int64),
                                 num_decodes=decodes, decode_context_sum=ctx + decodes))
    return shapes


def build_profile(tables: KernelTables, model: ModelSpec, hardware: HardwareSpec, tp: int, *,
                  max_tokens: int = 16384, max_seqs: int = 512, seed: int = 0,
                  cpu_overhead_s: float = DEFAULT_CPU_OVERHEAD_S,
                  cpu_overhead_per_seq_s: float = DEFAULT_CPU_OVERHEAD_PER_SEQ_S,
                  provenance: dict | None = None) -> dict:
    composers = {"auto": StepComposer(tables, model, tp, cpu_overhead_s=cpu_overhead_s,
                                      cpu_overhead_per_seq_s=cpu_overhead_per_seq_s)}
    body = tabulate(composers["auto"])
    try:  # FP8 KV cache (engine.kv_cache_dtype fp8): its own attention grids, where measured
        composers["fp8"] = StepComposer(tables, model, tp, cpu_overhead_s=cpu_overhead_s,
                                        cpu_overhead_per_seq_s=cpu_overhead_per_seq_s, kv_cache_dtype="fp8")
        body["fp8_kv_cache"] = attention_grids(composers["fp8"])
    except ValueError:
        pass
    body = _round(body)  # what is written is what is checked
    doc = {"format": FORMAT, "metadata": {}, "model": body}
    loaded = load_table_profile(Path("<memory>"), {**doc, "metadata": {
        "device": "-", "model": model.name, "tensor_parallel_size": tp}}, b"")
    errors = []
    shapes = heldout_shapes(np.random.default_rng(seed), max_tokens, max_seqs)
    for kv, composer in composers.items():
        profile = TableProfileCost(loaded, kv_cache_dtype=kv)
        for stats in shapes:
            want = composer.seconds(stats)
            errors.append(abs(profile.step_times(stats)[0] - want) / want)
    composer = composers["auto"]
    prov = provenance or {}
    doc["metadata"] = {
        "device": next(iter(prov.get("tables", {}).values()), {}).get("device", "unknown"),
        "hardware": hardware.name, "model": model.name, "dtype": "bfloat16",
        "tensor_parallel_size": tp, "measured": True,
        "source": (f"{prov.get('package', 'kernel tables')} {prov.get('package_version', '')}, "
                   f"tables {_relative(tables.folder)} composed by calibrate/composer.py").strip(),
        "tables": {k: {"csv_sha256": v["csv_sha256"], "framework_version": v["framework_version"]}
                   for k, v in prov.get("tables", {}).items()},
        "heldout_shapes": len(shapes),
        "kv_cache_dtypes": list(composers),
        "heldout_mape": round(float(np.mean(errors)), 6),
        "heldout_max_error": round(float(np.max(errors)), 6),
        "notes": composer.notes + [
            "elementwise (norms, activation, residual adds, rope) modelled as bytes / "
            "(HBM bandwidth x 0.7); CPU overhead per vLLM issue #6854 (see calibrate/composer.py)"],
        "extrapolated": {k: int(v) for k, v in composer.extrapolated.items()},
    }
    return doc


def _relative(folder: Path | None) -> str:
    root = Path(__file__).resolve().parents[1]
    try:
        return str(Path(folder).resolve().relative_to(root))
    except (TypeError, ValueError):
        return str(folder)


def write_profile(doc: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(_round(doc), sort_keys=False, width=120))


def _round(v):
    """Seconds to 6 significant digits (a microsecond of a 100 ms step): smaller files."""
    if isinstance(v, float):
        return float(f"{v:.6g}")
    if isinstance(v, dict):
        return {k: _round(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_round(x) for x in v]
    return v


def fits(model: ModelSpec, hw: HardwareSpec, tp: int) -> bool:
    """Heads split evenly and the weights leave room for KV blocks at vLLM's defaults."""
    if model.num_attention_heads % tp:
        return False
    try:
        kv_budget(model, hw, tensor_parallel_size=tp, gpu_memory_utilization=0.9, block_size=16)
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
