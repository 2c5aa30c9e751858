"""Benchmark the paged-attention kernels on a CUDA GPU against limits measured in the same run.

- decode: KV bytes read per second vs. the device's copy bandwidth (``copy_`` of a 1 GiB buffer,
  read + write bytes), over batch x context grids;
- prefill: achieved TFLOP/s vs. a bf16 ``8192^3`` matmul, over chunk x earlier-context grids;
- each next to a torch baseline timed in the same run: gather the paged KV into contiguous tensors,
  then ``scaled_dot_product_attention`` (gather included in its time, as a non-paged server pays it).

Shapes are Llama-3-8B attention: 32 query heads, 8 KV heads, head_dim 128, bf16, 16-token pages,
pages of each sequence scattered over the cache. Times are medians of ``triton.testing.do_bench``
(CUDA events, L2 flushed between runs). Only torch, triton and the standard library are needed.

    python -m bench.kernels --out bench_out          # full grids, CSVs in bench_out/
    python -m bench.kernels --quick --only decode    # a few points
Exits with status 2 when no CUDA device is present.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":  # run as a script: make `kernels` the package, not this file
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _ROOT / "bench"]
    sys.path.insert(0, str(_ROOT))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.testing  # noqa: E402
from torch.nn.attention.bias import causal_lower_right  # noqa: E402

import kernels  # noqa: E402

Q_HEADS, KV_HEADS, HEAD_DIM, BLOCK, DTYPE = 32, 8, 128, 16, torch.bfloat16
DECODE_BATCHES, DECODE_CONTEXTS = [1, 8, 32, 128, 256], [512, 2048, 8192, 32768]
PREFILL_CHUNKS, PREFILL_EARLIER = [512, 2048, 8192], [0, 8192]
GIB = 1 << 30


def median_ms(fn, warmup: int = 25, rep: int = 100) -> float:
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def copy_bandwidth(device) -> float:
    """Bytes per second moved by a device-to-device copy (read + write)."""
    src = torch.empty(GIB, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * GIB / (median_ms(lambda: dst.copy_(src)) * 1e-3)


def matmul_flops(device, n: int = 8192) -> float:
    """FLOP/s of a bf16 n x n x n matmul."""
    a = torch.randn(n, n, dtype=DTYPE, device=device)
    b = torch.randn(n, n, dtype=DTYPE, device=device)
    return 2 * n**3 / (median_ms(lambda: a @ b) * 1e-3)


def paged_cache(num_seqs: int, length: int, device, seed: int = 0):
    """Random caches sized for ``num_seqs`` x ``length`` tokens and block tables over shuffled pages."""
    pages_per_seq = -(-length // BLOCK)
    gen = torch.Generator(device=device).manual_seed(seed)
    shape = (num_seqs * pages_per_seq, BLOCK, KV_HEADS, HEAD_DIM)
    k_cache = torch.randn(shape, dtype=DTYPE, device=device, generator=gen)
    v_cache = torch.randn(shape, dtype=DTYPE, device=device, generator=gen)
    pages = torch.randperm(shape[0], device=device, generator=gen)
    return k_cache, v_cache, pages.view(num_seqs, pages_per_seq).int()


def gather(cache: torch.Tensor, tables: torch.Tensor, length: int) -> torch.Tensor:
    """Paged cache -> dense [num_seqs, KV_HEADS, length, HEAD_DIM] view of one gathered copy."""
    dense = cache[tables.long()].flatten(1, 2)[:, :length]  # [num_seqs, length, KV_HEADS, HEAD_DIM]
    return dense.transpose(1, 2)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """SDPA with GQA; falls back to repeating K/V heads where this torch's backend lacks it."""
    try:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kwargs)
    except torch.cuda.OutOfMemoryError:
        raise
    except (RuntimeError, TypeError):
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)


def free_bytes(device) -> int:
    return torch.cuda.mem_get_info(device)[0] - GIB // 2  # headroom for do_bench's L2-flush buffer


def bench_decode(batch: int, context: int, device, copy_bw: float, knobs: dict) -> dict | None:
    cache_bytes = 2 * batch * context * KV_HEADS * HEAD_DIM * DTYPE.itemsize
    if cache_bytes > free_bytes(device):
        return None
    k_cache, v_cache, tables = paged_cache(batch, context, device)
    q = torch.randn(batch, Q_HEADS, HEAD_DIM, dtype=DTYPE, device=device)
    ctx = torch.full((batch,), context, dtype=torch.int32, device=device)
    out = torch.empty_like(q)

    def run():
        kernels.paged_decode(q, k_cache, v_cache, tables, ctx, out=out, max_context_len=context, **knobs)

    ms = median_ms(run)
    block_n = knobs.get("block_n") or kernels.decode.default_config(HEAD_DIM, DTYPE)["block_n"]
    splits = knobs.get("num_splits") or kernels.choose_num_splits(
        batch, KV_HEADS, context, torch.cuda.get_device_properties(device).multi_processor_count, block_n)
    row = {"batch": batch, "context": context, "num_splits": splits, "kernel_us": ms * 1e3,
           "kv_GBps": cache_bytes / ms * 1e-6, "pct_copy_bw": 100 * cache_bytes / (ms * 1e-3) / copy_bw}
    row.update(_baseline(2 * cache_bytes, device, lambda: sdpa(
        q[:, :, None], gather(k_cache, tables, context), gather(v_cache, tables, context))[:, :, 0], out, ms))
    return row


def bench_prefill(chunk: int, earlier: int, device, mm_flops: float, knobs: dict) -> dict:
    context = earlier + chunk
    k_cache, v_cache, tables = paged_cache(1, context, device)
    q = torch.randn(chunk, Q_HEADS, HEAD_DIM, dtype=DTYPE, device=device)
    cu = torch.tensor([0, chunk], dtype=torch.int32, device=device)
    ctx = torch.tensor([context], dtype=torch.int32, device=device)
    out = torch.empty_like(q)

    def run():
        kernels.paged_prefill(q, k_cache, v_cache, tables, cu, ctx, out=out, max_seqlen_q=chunk,
                              max_context_len=context, **knobs)

    ms = median_ms(run)
    flops = 4 * Q_HEADS * HEAD_DIM * (chunk * earlier + chunk * (chunk + 1) / 2)  # causal QK^T + PV
    row = {"chunk": chunk, "earlier": earlier, "kernel_us": ms * 1e3, "TFLOPs": flops / ms * 1e-9,
           "pct_matmul": 100 * flops / (ms * 1e-3) / mm_flops}
    qt = q.transpose(0, 1)[None]  # [1, Q_HEADS, chunk, HEAD_DIM]
    mask = {"is_causal": True} if earlier == 0 else {"attn_mask": causal_lower_right(chunk, context)}
    row.update(_baseline(3 * k_cache.nbytes, device, lambda: sdpa(
        qt, gather(k_cache, tables, context), gather(v_cache, tables, context), **mask)[0].transpose(0, 1), out, ms))
    return row


def _baseline(need_bytes: int, device, fn, out: torch.Tensor, kernel_ms: float) -> dict:
    """Time the torch baseline and compare its output with the kernel's (already in ``out``)."""
    if need_bytes > free_bytes(device):
        return {"torch_us": "oom", "speedup": "", "max_abs_err": ""}
    try:
        err = (fn().float() - out.float()).abs().max().item()
        ms = median_ms(fn)
    except torch.cuda.OutOfMemoryError:
        return {"torch_us": "oom", "speedup": "", "max_abs_err": ""}
    return {"torch_us": ms * 1e3, "speedup": ms / kernel_ms, "max_abs_err": err}


def print_table(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    if not rows:
        print("  (nothing fit in memory)")
        return
    cols = list(rows[0])

    def fmt(value) -> str:
        return f"{value:.3g}" if isinstance(value, float) else str(value)

    widths = [max(len(c), *(len(fmt(r[c])) for r in rows)) for c in cols]
    print("  ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True)))
    for r in rows:
        print("  ".join(fmt(r[c]).rjust(w) for c, w in zip(cols, widths, strict=True)))


def write_csv(path: Path, rows: list[dict]) -> None:
    if rows:
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench_out"), help="directory for the CSVs")
    parser.add_argument("--only", choices=["decode", "prefill"], help="run one of the two grids")
    parser.add_argument("--quick", action="store_true", help="a few points per grid")
    parser.add_argument("--block-n", type=int, help="override BLOCK_N (both kernels)")
    parser.add_argument("--block-m", type=int, help="override prefill BLOCK_M")
    parser.add_argument("--num-splits", type=int, help="override the decode split count")
    parser.add_argument("--num-warps", type=int, help="override num_warps (both kernels)")
    parser.add_argument("--num-stages", type=int, help="override num_stages (both kernels)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench/kernels.py needs a CUDA GPU and none is visible (torch.cuda.is_available() is False).",
              file=sys.stderr)
        return 2

    device = torch.device("cuda")
    common = {k: v for k, v in [("block_n", args.block_n), ("num_warps", args.num_warps),
                                ("num_stages", args.num_stages)] if v is not None}
    decode_knobs = common | ({"num_splits": args.num_splits} if args.num_splits else {})
    prefill_knobs = common | ({"block_m": args.block_m} if args.block_m else {})
    args.out.mkdir(parents=True, exist_ok=True)
    props = torch.cuda.get_device_properties(device)
    copy_bw, mm_flops = copy_bandwidth(device), matmul_flops(device)
    limits = [{"device": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
               "triton": triton.__version__, "copy_GBps": copy_bw * 1e-9, "bf16_matmul_TFLOPs": mm_flops * 1e-12}]
    print_table("measured device limits", limits)
    write_csv(args.out / "limits.csv", limits)

    if args.only != "prefill":
        batches, contexts = ([1, 32], [2048, 8192]) if args.quick else (DECODE_BATCHES, DECODE_CONTEXTS)
        rows = []
        for batch in batches:
            for context in contexts:
                row = bench_decode(batch, context, device, copy_bw, decode_knobs)
                torch.cuda.empty_cache()
                if row is None:
                    print(f"  skip decode batch={batch} context={context}: cache does not fit", file=sys.stderr)
                else:
                    rows.append(row)
        print_table("decode (KV bandwidth vs measured copy bandwidth)", rows)
        write_csv(args.out / "decode.csv", rows)
        hits = [r["pct_copy_bw"] for r in rows if r["context"] >= 4096 and r["batch"] >= 32]
        if hits:
            print(f"target decode >= 80% of copy bandwidth (context >= 4k, >= 32 seqs): min {min(hits):.0f}% "
                  f"-> {'met' if min(hits) >= 80 else 'NOT met'}")

    if args.only != "decode":
        chunks, earlier = ([2048, 8192], [0]) if args.quick else (PREFILL_CHUNKS, PREFILL_EARLIER)
        rows = []
        for chunk in chunks:
            for prior in earlier:
                rows.append(bench_prefill(chunk, prior, device, mm_flops, prefill_knobs))
                torch.cuda.empty_cache()
        print_table("prefill (attention FLOP/s vs measured bf16 matmul)", rows)
        write_csv(args.out / "prefill.csv", rows)
        hits = [r["pct_matmul"] for r in rows if r["chunk"] >= 8192]
        if hits:
            print(f"target prefill >= 50% of matmul at 8k tokens: min {min(hits):.0f}% "
                  f"-> {'met' if min(hits) >= 50 else 'NOT met'}")
    print(f"\nCSVs in {args.out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
