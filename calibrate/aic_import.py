"""Import the kernel timings servesim needs from NVIDIA AIConfigurator's published measurements.

    pip download --no-deps aiconfigurator-core==0.12.0 -d /tmp/aic
    python -m calibrate.aic_import /tmp/aic/aiconfigurator_core-0.12.0-*.whl [--out sim/tables]

The wheel (or a folder it was unpacked into) ships parquet tables of kernels timed on real GPUs with
vLLM's kernels (Apache-2.0). This script downloads nothing and imports nothing from the package: it
reads the parquet files with pandas + pyarrow and writes, per GPU, compact CSVs of the rows
servesim composes step costs from (any Llama-style or MoE model, not only the presets), plus
`provenance.yaml`: package and version, the wheel's and each source parquet's sha256 and in-wheel
path, the device string, the vLLM version and kernel, the licence, and each CSV's sha256. Latencies
stay in milliseconds, as measured; no value is changed.

Rows kept (sim/cost/composer.py decides which measured rows stand in for each shape):
  gemm.csv                  bf16 GEMMs: the whole measured m x n x k grid
  context_attention.csv     prefill attention (batch x length), bf16 and (where measured) FP8 KV
                            cache, every heads x kv-heads combination at head_dim 64, 128, 256,
                            no window
  generation_attention.csv  decode attention (batch x KV length = isl + step), same filters
  allreduce.csv             vLLM custom all-reduce, bf16, 2/4/8 GPUs, CUDA-graph and eager
  gemm_fp8.csv              FP8 GEMMs (per-tensor scales, vLLM's CUTLASS kernel), the whole grid
                            (GPUs with FP8 tensor cores; block-scaled layers read these rows,
                            sim/cost/composer.py says why)
  moe.csv                   vLLM's fused MoE layer, bf16, balanced routing, experts split by TP
                            (no expert parallelism), every shape measured; from the newest vLLM
                            version measuring all the MoE presets' shapes (GPUs without any: no
                            moe.csv)
  moe_fp8_block.csv         the same for block-scaled FP8 experts (DeepSeek-V3)
  moe_w4a16_mxfp4.csv       the same for MXFP4 experts (gpt-oss)
  power.csv                 measured board power (W) beside latency, where a table carries it (0.12:
                            B200 context / generation attention and fused MoE under vLLM 0.22.0):
                            each row's shape, dtype, latency and power, kernels of at least
                            POWER_MIN_LATENCY_MS only (sim/features/energy/measured.py says why)
  moe_a2a.csv               DeepEP's expert-parallel dispatch and combine as vLLM 0.24 runs them
                            (high-throughput on 20 SMs, low-latency), by group size, hidden size,
                            top-k, experts and tokens per rank; microseconds in the wheel, ms here
  gdn.csv                   vLLM's Gated DeltaNet kernels (linear attention: Qwen3-Next / Qwen3.5),
                            every (key heads, value heads) per GPU measured, head dims 128, conv 4:
                            prefill (causal_conv1d_fn, chunk_gated_delta_rule) by batch x length,
                            decode (causal_conv1d_update, fused_recurrent_gated_delta_rule) by
                            batch; the median where several models' rows time one shape
  mla_context.csv           vLLM's whole MLA attention module (DeepseekV2MLAAttention: projections,
  mla_generation.csv        latent attention, o_proj), bf16 activations, bf16 or FP8 KV, at the MLA
                            presets' heads per GPU and projection precision; the prefill rows are
                            the backends vLLM runs at each length (on Hopper, bf16 KV:
                            FlashAttention-MLA's decode path up to 512 tokens, FlashAttention above;
                            FP8 KV: FlashMLA up to 128, FlashAttention above)
"""
from __future__ import annotations

import argparse
import hashlib
import io
import re
import sys
import zipfile
from pathlib import Path

import pandas as pd
import yaml

from sim.cost.composer import MOE_COLUMNS, MOE_TABLES, TABLE_SYSTEMS, mla_gemm_type, moe_dtype, moe_key
from sim.presets.models import CPU_PRESETS, MODEL_PRESETS

PACKAGE = "aiconfigurator-core"
DATA = "aiconfigurator_core/systems/data"
TP_SIZES = (1, 2, 4, 8)
# the KV-cache dtypes imported (the tables' names): engine.kv_cache_dtype auto (bf16 models), fp8
KV_CACHE_DTYPES = ("bfloat16", "fp8")
# attention head sizes imported (every Llama-style model servesim reads has one of these)
HEAD_DIMS = (64, 128, 256)
# servesim preset -> (AIConfigurator's system folder, (prefill, decode) attention kernels): the
# composer's registry (sim/cost/composer.TABLE_SYSTEMS), the one line a GPU with tables takes
GPUS = TABLE_SYSTEMS  # preset -> (folder, kernels)
OUT = Path(__file__).resolve().parents[1] / "sim" / "tables"


class Source:
    """The wheel (a zip) or an unpacked folder; paths are in-wheel paths."""

    def __init__(self, path: Path):
        self.path = path
        self.zip = zipfile.ZipFile(path) if path.is_file() else None
        names = self.zip.namelist() if self.zip else [
            str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()]
        self.names = sorted(names)

    def read(self, name: str) -> bytes:
        return self.zip.read(name) if self.zip else (self.path / name).read_bytes()

    def version(self) -> str:
        meta = next((n for n in self.names if n.endswith(".dist-info/METADATA")), None)
        if meta is None:
            return "unknown"
        found = re.search(r"^Version: (.+)$", self.read(meta).decode(), re.M)
        return found.group(1).strip() if found else "unknown"


def _latest(src: Source, system: str, op: str, table: str, kernel: str | None = None) -> str:
    """The in-wheel path of `table` for the newest vLLM version that has it (with `kernel`)."""
    pattern = re.compile(rf"{DATA}/{system}/{op}/vllm/([^/]+)/{table}\.parquet$")
    found = []
    for name in src.names:
        m = pattern.match(name)
        if m:
            if kernel is not None and kernel not in set(_parquet(src, name)["kernel_source"]):
                continue
            found.append((tuple(int(x) for x in re.findall(r"\d+", m.group(1))[:3]), name))
    if not found:
        raise SystemExit(f"error: no {system}/{op}/vllm/*/{table}.parquet"
                         + (f" with kernel {kernel}" if kernel else "") + f" in {src.path}")
    return max(found)[1]


_CACHE: dict[str, pd.DataFrame] = {}


def _parquet(src: Source, name: str) -> pd.DataFrame:
    if name not in _CACHE:
        _CACHE[name] = pd.read_parquet(io.BytesIO(src.read(name)))
    return _CACHE[name]


def _reachable_shapes():
    """(model, tp) pairs of the presets: every TP size that divides the attention heads."""
    for name, model in sorted(MODEL_PRESETS.items()):
        if name in CPU_PRESETS:
            continue
        for tp in TP_SIZES:
            if model.num_attention_heads % tp == 0:
                yield model, tp


def _gemm_rows(frame: pd.DataFrame, dtype: str = "bfloat16") -> pd.DataFrame:
    """Every row of one GEMM table (bf16, fp8): the whole measured m x n x k grid, so that any
    model's layers (not only the presets') are bracketed by measured points (sim/cost/composer.py)."""
    frame = frame[frame["gemm_dtype"] == dtype]
    return frame[["m", "n", "k", "latency", "kernel_source"]]


def _attention_rows(frame: pd.DataFrame, kernel: str, length: str) -> pd.DataFrame:
    """Every (heads, kv heads) combination measured at the head sizes of Llama-style models (64,
    128, 256 where measured), bf16 and FP8 KV, no window: what any such model's heads per GPU are
    composed from (sim/cost/composer.attention_sources)."""
    frame = frame[(frame["kernel_source"] == kernel) & frame["kv_cache_dtype"].isin(KV_CACHE_DTYPES)
                  & frame["head_dim"].isin(HEAD_DIMS)]
    if "window_size" in frame:
        frame = frame[frame["window_size"] == 0]
    out = frame.rename(columns={"num_key_value_heads": "num_kv_heads"})
    if length == "kv_len":  # decode: the KV length is isl + step
        out = out.assign(kv_len=out["isl"] + out["step"])
    else:
        out = out[out["step"] == 0]
    return out[["kv_cache_dtype", "head_dim", "num_heads", "num_kv_heads", "batch_size", length, "latency"]]


def _mla_rows(frame: pd.DataFrame, length: str) -> pd.DataFrame:
    """The MLA module rows at the MLA presets' heads per GPU and projection precision, bf16 and
    FP8 KV. Prefill: every backend measured (vLLM picks by length; their lengths do not overlap)."""
    frame = frame[frame["kv_cache_dtype"].isin(KV_CACHE_DTYPES) & (frame["mla_dtype"] == "bfloat16")]
    keep = {(mla_gemm_type(model), model.num_attention_heads // tp)
            for model, tp in _reachable_shapes() if model.mla is not None}
    frame = frame[[c in keep for c in zip(frame["gemm_type"], frame["num_heads"])]]
    out = frame.assign(kv_len=frame["isl"] + frame["step"]) if length == "kv_len" else frame[frame["step"] == 0]
    return out[["kv_cache_dtype", "gemm_type", "num_heads", "batch_size", length, "latency", "kernel_source"]]


def _moe_keys(dtype: str) -> set[tuple]:
    return {moe_key(model, tp) for model, tp in _reachable_shapes()
            if model.moe is not None and moe_dtype(model) == dtype}


def _moe_source(src: Source, system: str, dtype: str) -> str | None:
    """The newest fused-MoE table covering every MoE preset's shapes in `dtype` (else the one
    covering most)."""
    pattern = re.compile(rf"{DATA}/{system}/moe/vllm/([^/]+)/moe_perf\.parquet$")
    best = None
    for name in src.names:
        m = pattern.match(name)
        if m:
            rows = _moe_rows(_parquet(src, name), dtype)
            covered = len(_moe_keys(dtype) & set(map(tuple, rows[MOE_COLUMNS].to_numpy().tolist())))
            rank = (covered, tuple(int(x) for x in re.findall(r"\d+", m.group(1))[:3]))
            if covered and (best is None or rank > best[0]):
                best = (rank, name)
    return None if best is None else best[1]


def _moe_rows(frame: pd.DataFrame, dtype: str) -> pd.DataFrame:
    """Every shape measured in `dtype` with balanced routing and the experts split by TP (not only
    the presets': a config.json model composes from its own shape where it was measured)."""
    frame = frame[(frame["moe_dtype"] == dtype) & (frame["moe_ep_size"] == 1)
                  & (frame["distribution"] == "balanced")].rename(columns={"moe_tp_size": "tp"})
    return frame[[*MOE_COLUMNS, "num_tokens", "latency", "kernel_source"]]


# moe_a2a.csv's key columns (sim/cost/expert_parallel.py reads them)
A2A_KEYS = ["comm_backend", "phase", "ep_size", "node_num", "hidden_size", "topk", "num_experts", "num_tokens"]


def _a2a_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """DeepEP's dispatch and combine as vLLM runs them: high-throughput on its default 20 SMs, low-latency
    (no SM setting); latencies are in microseconds there, converted to ms here like every other table."""
    frame = frame[((frame["comm_backend"] == "deepep_ht") & (frame["sms"] == 20))
                  | ((frame["comm_backend"] == "deepep_ll") & (frame["sms"] == 0))]
    return frame.assign(latency=frame["latency"] / 1e3)[[*A2A_KEYS, "latency", "kernel_source"]]


# gdn.csv's key columns (sim/cost/linear_attention.py reads them)
GDN_KEYS = ["kernel", "phase", "head_k_dim", "head_v_dim", "d_conv", "num_k_heads", "num_v_heads",
            "batch_size", "seq_len"]


def _gdn_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Every Gated DeltaNet kernel row; the kernel is a key column here (four of them), and rows timed
    for several models at one shape (the kernels do not read d_model) become their median."""
    return frame.rename(columns={"kernel_source": "kernel"})[[*GDN_KEYS, "latency"]]


def _one_per_key(rows: pd.DataFrame, keys: list[str]) -> tuple[pd.DataFrame, int]:
    """Repeated measurements of one shape (rare) are reduced to their median; returns how many."""
    dup = int(rows.duplicated(keys).sum())
    rows = rows.groupby(keys, as_index=False)["latency"].median() if dup else rows
    return rows.sort_values(keys).rename(columns={"latency": "latency_ms"}), dup


# A board power reading over a kernel shorter than this is not its steady draw: the B200 rows read
# more the longer the kernel (context attention: a 473 W median under 0.01 ms, 883 W at 0.3-1 ms;
# docs/energy.md), so only these are kept
POWER_MIN_LATENCY_MS = 0.3
# power.csv's columns: the op, its dtype, every shape column any op has (empty where it has none)
POWER_COLUMNS = ["op", "kernel_source", "dtype", "batch_size", "isl", "step", "num_heads", "num_kv_heads",
                 "head_dim", "num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "tp",
                 "latency_ms", "power_w"]


def _power_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """One measured table's rows that carry board power, as power.csv writes them: attention with
    no window, MoE with balanced routing and the experts split by TP; kernels of at least
    POWER_MIN_LATENCY_MS; values as measured (latency ms, power W)."""
    frame = frame[frame["power"].notna() & (frame["latency"] >= POWER_MIN_LATENCY_MS)]
    if "window_size" in frame:
        frame = frame[frame["window_size"] == 0]
    if "moe_dtype" in frame:
        frame = frame[(frame["moe_ep_size"] == 1) & (frame["distribution"] == "balanced")]
        frame = frame.rename(columns={"moe_dtype": "dtype", "moe_tp_size": "tp"})
    else:
        frame = frame.rename(columns={"kv_cache_dtype": "dtype", "num_key_value_heads": "num_kv_heads"})
    frame = frame.rename(columns={"op_name": "op", "latency": "latency_ms", "power": "power_w"})
    return frame.reindex(columns=POWER_COLUMNS)


def _power(src: Source, system: str) -> tuple[pd.DataFrame, list[str]] | None:
    """power.csv's rows from every table of `system` with a power column, and their in-wheel paths."""
    paths = [n for n in src.names if n.startswith(f"{DATA}/{system}/") and n.endswith(".parquet")
             and "power" in _parquet(src, n).columns]
    if not paths:
        return None
    rows = pd.concat([_power_rows(_parquet(src, n)) for n in paths], ignore_index=True)
    keys = [c for c in POWER_COLUMNS if c not in ("latency_ms", "power_w")]
    # (a stable sort on the shape only: repeats of one shape keep their order, every one is kept)
    return rows.sort_values(keys, kind="stable", na_position="last").reset_index(drop=True), paths


def _licence(src: Source, parquet: str) -> str:
    meta = parquet.rsplit("/", 1)[0] + "/collection_meta.yaml"
    if meta in src.names:
        found = re.search(r"SPDX-License-Identifier:\s*(\S+)", src.read(meta).decode())
        if found:
            return found.group(1)
    return "Apache-2.0 (package licence)"


def import_gpu(src: Source, preset: str, out: Path, wheel_sha: str | None) -> dict:
    system, (prefill_kernel, decode_kernel) = GPUS[preset]
    gemm_path = _latest(src, system, "gemm", "gemm_perf")
    gemm = _parquet(src, gemm_path)
    ctx_path = _latest(src, system, "attention", "context_attention_perf", prefill_kernel)
    gen_path = _latest(src, system, "attention", "generation_attention_perf", decode_kernel)
    ar_path = _latest(src, system, "comm", "custom_allreduce_perf")
    ar = _parquet(src, ar_path)
    ar = ar[ar["allreduce_dtype"] == "bfloat16"][["num_gpus", "message_size", "backend", "latency"]]
    attention = ["kv_cache_dtype", "head_dim", "num_heads", "num_kv_heads", "batch_size"]
    # name -> (rows, key columns, in-wheel source, kernel when the rows do not say)
    tables = {
        "gemm": (_gemm_rows(gemm), ["m", "n", "k"], gemm_path, None),
        "context_attention": (_attention_rows(_parquet(src, ctx_path), prefill_kernel, "isl"),
                              [*attention, "isl"], ctx_path, prefill_kernel),
        "generation_attention": (_attention_rows(_parquet(src, gen_path), decode_kernel, "kv_len"),
                                 [*attention, "kv_len"], gen_path, decode_kernel),
        "allreduce": (ar, ["num_gpus", "backend", "message_size"], ar_path, None),
    }
    if (gemm["gemm_dtype"] == "fp8").any():
        tables["gemm_fp8"] = (_gemm_rows(gemm, "fp8"), ["m", "n", "k"], gemm_path, None)
    for dtype, name in MOE_TABLES.items():
        path = _moe_source(src, system, dtype)
        if path is not None:
            tables[name] = (_moe_rows(_parquet(src, path), dtype), [*MOE_COLUMNS, "num_tokens"], path, None)
    mla = [n for n in src.names if re.match(rf"{DATA}/{system}/mla/vllm/[^/]+/mla_context_module_perf", n)]
    if mla:
        for phase, length in (("context", "isl"), ("generation", "kv_len")):
            path = _latest(src, system, "mla", f"mla_{phase}_module_perf")
            rows = _mla_rows(_parquet(src, path), length)
            if len(rows):
                tables[f"mla_{phase}"] = (rows, ["kv_cache_dtype", "gemm_type", "num_heads", "batch_size", length],
                                          path, None)
    if any(re.match(rf"{DATA}/{system}/comm/vllm/[^/]+/moe_a2a_perf\.parquet$", n) for n in src.names):
        path = _latest(src, system, "comm", "moe_a2a_perf")
        tables["moe_a2a"] = (_a2a_rows(_parquet(src, path)), A2A_KEYS, path, None)
    if any(re.match(rf"{DATA}/{system}/linear_attention/vllm/[^/]+/gdn_perf\.parquet$", n) for n in src.names):
        path = _latest(src, system, "linear_attention", "gdn_perf")
        tables["gdn"] = (_gdn_rows(_parquet(src, path)), GDN_KEYS, path, None)
    folder = out / system
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, (rows, keys, path, kernel) in tables.items():
        kernels = (sorted(set(rows["kernel_source"])) if "kernel_source" in rows else
                   sorted(set(rows["kernel"])) if "kernel" in rows else [kernel] if kernel else [])
        rows, dup = _one_per_key(rows.drop(columns="kernel_source", errors="ignore"), keys)
        text = rows.to_csv(index=False, float_format="%.9g")
        (folder / f"{name}.csv").write_text(text)
        f = _parquet(src, path)
        files[name] = {
            "csv": f"{name}.csv", "csv_sha256": hashlib.sha256(text.encode()).hexdigest(),
            "rows": len(rows), "medians_of_repeats": dup,
            "source": path, "source_sha256": hashlib.sha256(src.read(path)).hexdigest(),
            "source_rows": len(f), "device": str(f["device"].iloc[0]),
            "framework_version": f"{f['framework'].iloc[0]} {f['version'].iloc[0]}",
            "licence": _licence(src, path),
        }
        if kernels:
            files[name]["kernel"] = ", ".join(kernels)
    power = _power(src, system)
    power_entry: dict = {}
    if power is not None:
        rows, paths = power
        text = rows.to_csv(index=False, float_format="%.9g")
        (folder / "power.csv").write_text(text)
        power_entry = {
            "csv": "power.csv", "csv_sha256": hashlib.sha256(text.encode()).hexdigest(), "rows": len(rows),
            "unit": "latency_ms ms, power_w W (the board's reading while the kernel ran)",
            "kept": f"kernels of at least {POWER_MIN_LATENCY_MS:g} ms; attention with no window; MoE balanced, "
                    "experts split by TP",
            "sources": [{"source": n, "source_sha256": hashlib.sha256(src.read(n)).hexdigest(),
                         "source_rows": len(_parquet(src, n)), "device": str(_parquet(src, n)["device"].iloc[0]),
                         "framework_version": f"{_parquet(src, n)['framework'].iloc[0]} "
                                              f"{_parquet(src, n)['version'].iloc[0]}",
                         "licence": _licence(src, n)} for n in paths],
        }
    provenance = {
        "package": PACKAGE, "package_version": src.version(), "wheel": src.path.name,
        "wheel_sha256": wheel_sha, "servesim_hardware_preset": preset, "system": system,
        "latency_unit": "ms", "licence": "Apache-2.0 (NVIDIA AIConfigurator; see NOTICE)",
        "importer": "python -m calibrate.aic_import", "tables": files,
    }
    if power is not None:  # (apart from `tables`: the composer prices latency from those alone)
        provenance["power"] = power_entry
    (folder / "provenance.yaml").write_text(yaml.safe_dump(provenance, sort_keys=False))
    return provenance


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", type=Path, help="the aiconfigurator-core wheel, or its unpacked folder")
    ap.add_argument("--out", type=Path, default=OUT, help=f"tables folder (default {OUT})")
    ap.add_argument("--gpu", action="append", choices=sorted(GPUS), help="only these (repeatable)")
    args = ap.parse_args(argv)
    if not args.source.exists():
        raise SystemExit(f"error: {args.source}: no such file or folder")
    src = Source(args.source)
    wheel_sha = hashlib.sha256(args.source.read_bytes()).hexdigest() if src.zip else None
    for preset in args.gpu or sorted(GPUS):
        p = import_gpu(src, preset, args.out, wheel_sha)
        sizes = ", ".join(f"{k} {v['rows']}" for k, v in [*p["tables"].items(), *(
            [("power", p["power"])] if "power" in p else [])])
        print(f"{preset:<10} -> {args.out / p['system']}: {sizes} rows", file=sys.stderr)


if __name__ == "__main__":
    main()
