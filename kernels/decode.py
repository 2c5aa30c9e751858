"""Paged-attention decode: one new query token per sequence against its paged KV cache.

One program handles one (sequence, KV head, split): the ``GROUP`` query heads that share the KV head
are packed into the rows of one tile (padded to >= 16 rows, the smallest ``tl.dot`` M), so each K/V
tile is read once per KV head rather than once per query head. Keys stream in ``BLOCK_N``-token
tiles chosen independently of the page size.

For small batches with long contexts the grid is too small to fill the GPU, so the keys of each
sequence are divided into ``num_splits`` ranges (flash-decoding). Each split writes a normalised
partial output and its log2-sum-exp; a second kernel combines them.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._attn import attend_tiles, normalise, row_max, row_sum
from ._validate import (
    check_block_tables,
    check_cache,
    check_devices,
    check_lengths,
    check_out,
    check_query,
    check_tensor,
    dot_options,
    head_dim_tile,
    host_range,
    next_pow2,
    num_sms,
    require,
)

LOG2E = 1.4426950408889634
MAX_SPLITS = 64  # caps the partial-output buffer and the reduce tile
MIN_TILES_PER_SPLIT = 4  # keeps the partial write + reduce a few % of a split's K/V traffic


@triton.jit
def _decode_kernel(
    out_ptr,  # [num_seqs, num_q_heads, head_dim] output, written unless SPLIT_KV
    part_out_ptr,  # [num_seqs, num_q_heads, num_splits, HEAD_DIM] fp32 partial outputs (SPLIT_KV)
    part_lse_ptr,  # [num_seqs, num_q_heads, num_splits] fp32 partial log2-sum-exp (SPLIT_KV)
    q_ptr,  # [num_seqs, num_q_heads, head_dim] queries
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables_ptr,  # [num_seqs, max_blocks] int32 physical page ids
    context_lens_ptr,  # [num_seqs] int32 tokens in the cache, the current one included
    qk_scale,  # softmax scale * log2(e)
    num_splits,  # key ranges per sequence (the grid's third axis)
    stride_qs,  # q stride between sequences
    stride_qh,  # q stride between heads
    stride_qd,  # q stride along head_dim
    stride_os,  # out stride between sequences
    stride_oh,  # out stride between heads
    stride_od,  # out stride along head_dim
    stride_kb,  # k_cache stride between pages
    stride_ks,  # k_cache stride between slots
    stride_kh,  # k_cache stride between heads
    stride_kd,  # k_cache stride along head_dim
    stride_vb,  # v_cache stride between pages
    stride_vs,  # v_cache stride between slots
    stride_vh,  # v_cache stride between heads
    stride_vd,  # v_cache stride along head_dim
    stride_bt,  # block_tables stride between sequences
    GROUP: tl.constexpr,  # query heads per KV head
    HEAD_DIM: tl.constexpr,  # true head dimension
    BLOCK_D: tl.constexpr,  # head_dim padded to a power of two >= 16
    BLOCK_M: tl.constexpr,  # query rows per tile: GROUP padded to a power of two >= 16
    BLOCK_N: tl.constexpr,  # keys per tile
    BLOCK_SIZE: tl.constexpr,  # tokens per cache page
    SPLIT_KV: tl.constexpr,  # num_splits > 1: write partial results for the reduce kernel
    DOT_FP32: tl.constexpr,  # upcast tl.dot operands to fp32 (interpreter)
    PRECISION: tl.constexpr,  # tl.dot input_precision
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_q_heads = tl.num_programs(1) * GROUP

    ctx = tl.load(context_lens_ptr + seq)
    rows = tl.arange(0, BLOCK_M)
    heads = kv_head * GROUP + rows  # [BLOCK_M] query head of each row
    row_mask = rows < GROUP
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    qd_mask = row_mask[:, None] & d_mask[None, :]

    # q: [BLOCK_M, BLOCK_D]
    q = tl.load(q_ptr + seq.to(tl.int64) * stride_qs + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                mask=qd_mask, other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)

    if SPLIT_KV:  # equal, BLOCK_N-aligned key ranges; trailing splits of a short context may be empty
        split_len = ((ctx + num_splits - 1) // num_splits + BLOCK_N - 1) // BLOCK_N * BLOCK_N
        lo = tl.minimum(split * split_len, ctx)
        hi = tl.minimum(lo + split_len, ctx)
    else:
        lo = 0
        hi = ctx
    full_hi = lo + (hi - lo) // BLOCK_N * BLOCK_N  # keys in [lo, full_hi) need no mask

    acc = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    q_pos = tl.full([BLOCK_M], 0, tl.int32) + ctx - 1
    k_head_ptr = k_cache_ptr + kv_head.to(tl.int64) * stride_kh
    v_head_ptr = v_cache_ptr + kv_head.to(tl.int64) * stride_vh
    table_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt
    acc, m_i, l_i = attend_tiles(acc, m_i, l_i, q, q_pos, k_head_ptr, v_head_ptr, table_ptr, lo, full_hi,
                                 qk_scale, offs_d, d_mask, stride_kb, stride_ks, stride_kd, stride_vb,
                                 stride_vs, stride_vd, BLOCK_SIZE, BLOCK_N, False, DOT_FP32, PRECISION)
    acc, m_i, l_i = attend_tiles(acc, m_i, l_i, q, q_pos, k_head_ptr, v_head_ptr, table_ptr, full_hi, hi,
                                 qk_scale, offs_d, d_mask, stride_kb, stride_ks, stride_kd, stride_vb,
                                 stride_vs, stride_vd, BLOCK_SIZE, BLOCK_N, True, DOT_FP32, PRECISION)
    result = normalise(acc, l_i)

    if SPLIT_KV:
        part = (seq.to(tl.int64) * num_q_heads + heads) * num_splits + split  # [BLOCK_M]
        tl.store(part_out_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], result, mask=qd_mask)
        lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log2(tl.where(l_i == 0.0, 1.0, l_i)))
        tl.store(part_lse_ptr + part, lse, mask=row_mask)
    else:
        o_ptrs = out_ptr + seq.to(tl.int64) * stride_os + heads[:, None] * stride_oh + offs_d[None, :] * stride_od
        tl.store(o_ptrs, result.to(out_ptr.dtype.element_ty), mask=qd_mask)


@triton.jit
def _decode_reduce_kernel(
    out_ptr,  # [num_seqs, num_q_heads, head_dim] output
    part_out_ptr,  # [num_seqs, num_q_heads, num_splits, HEAD_DIM] fp32 partial outputs
    part_lse_ptr,  # [num_seqs, num_q_heads, num_splits] fp32 partial log2-sum-exp
    num_splits,  # partial results per (sequence, head)
    stride_os,  # out stride between sequences
    stride_oh,  # out stride between heads
    stride_od,  # out stride along head_dim
    HEAD_DIM: tl.constexpr,  # true head dimension
    BLOCK_D: tl.constexpr,  # head_dim padded to a power of two
    BLOCK_S: tl.constexpr,  # num_splits padded to a power of two
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    row = seq.to(tl.int64) * tl.num_programs(1) + head
    offs_s = tl.arange(0, BLOCK_S)
    s_mask = offs_s < num_splits
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM

    lse = tl.load(part_lse_ptr + row * num_splits + offs_s, mask=s_mask, other=float("-inf"))  # [BLOCK_S]
    m = row_max(lse, 0)
    weights = tl.exp2(lse - tl.where(m == float("-inf"), 0.0, m))  # empty splits weigh 0
    # parts: [BLOCK_S, BLOCK_D]
    parts = tl.load(part_out_ptr + (row * num_splits + offs_s)[:, None] * HEAD_DIM + offs_d[None, :],
                    mask=s_mask[:, None] & d_mask[None, :], other=0.0)
    total = row_sum(weights, 0)
    result = row_sum(parts * weights[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    o_ptrs = out_ptr + seq.to(tl.int64) * stride_os + head * stride_oh + offs_d * stride_od
    tl.store(o_ptrs, result.to(out_ptr.dtype.element_ty), mask=d_mask)


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_context_len: int, num_sms: int,
                      block_n: int, *, ctas_per_sm: int = 2, max_splits: int = MAX_SPLITS) -> int:
    """Split count for flash-decoding, after FlashAttention-2's ``num_splits_heuristic``.

    A wave is ``num_sms * ctas_per_sm`` programs (two resident decode programs per SM keep enough
    loads in flight to cover DRAM latency). No split once the grid fills ~80% of a wave. Otherwise
    take the smallest split count whose wave efficiency (programs / slots in the waves it occupies)
    is within 85% of the best, skipping counts that give the same keys per split as one fewer, and
    keeping >= MIN_TILES_PER_SPLIT key tiles per split.
    """
    programs = num_seqs * num_kv_heads
    slots = num_sms * ctas_per_sm
    tiles = math.ceil(max_context_len / block_n)
    limit = min(max_splits, slots, tiles // MIN_TILES_PER_SPLIT)
    if programs >= 0.8 * slots or limit < 2:
        return 1
    efficiency = [programs * s / slots / math.ceil(programs * s / slots) for s in range(1, limit + 1)]
    best = max(efficiency)
    for s in range(1, limit + 1):
        if s > 1 and math.ceil(tiles / s) == math.ceil(tiles / (s - 1)):
            continue
        if efficiency[s - 1] >= 0.85 * best:
            return s
    return 1


def default_config(head_dim: int, dtype: torch.dtype) -> dict:
    """Launch parameters chosen by reasoning, not tuning (see docs/kernels.md)."""
    small = head_dim <= 128 and dtype != torch.float32
    return {"block_n": 64 if small else 32, "num_warps": 4, "num_stages": 3}


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    *,
    out: torch.Tensor | None = None,
    max_context_len: int | None = None,
    num_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """Attention of one query token per sequence over its paged KV cache.

    q: [num_seqs, num_q_heads, head_dim]; k_cache, v_cache: [num_blocks, block_size, num_kv_heads,
    head_dim]; block_tables: [num_seqs, max_blocks] int32; context_lens: [num_seqs] int32, tokens in
    the cache including the current one (>= 1). Returns out: [num_seqs, num_q_heads, head_dim].

    ``max_context_len`` is a trusted hint that skips reading ``context_lens`` back to the host (no
    sync). ``num_splits``, ``block_n``, ``num_warps`` and ``num_stages`` override the heuristics.
    """
    _, block_size, num_kv_heads, head_dim = check_cache(k_cache, v_cache)
    group = check_query(q, k_cache, num_kv_heads, head_dim)
    check_tensor("block_tables", block_tables, 2, (torch.int32,))
    check_tensor("context_lens", context_lens, 1, (torch.int32,))
    device = check_devices(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables,
                           context_lens=context_lens)
    num_seqs, num_q_heads, _ = q.shape
    check_lengths("context_lens", context_lens, num_seqs)
    max_ctx = max_context_len
    if max_ctx is None and num_seqs > 0:  # no hint: read the lengths back (one host sync)
        min_ctx, max_ctx = host_range(context_lens)
        require(min_ctx >= 1, f"context_lens must be >= 1 (the current token is in the cache), got {min_ctx}")
    check_block_tables(block_tables, num_seqs, block_size, max_ctx or 0)
    out = check_out(out, q)
    if num_seqs == 0:
        return out

    config = default_config(head_dim, q.dtype)
    block_n = block_n or config["block_n"]
    require(block_n >= 16 and block_n == next_pow2(block_n), f"block_n must be a power of two >= 16, got {block_n}")
    if num_splits is None:
        num_splits = choose_num_splits(num_seqs, num_kv_heads, max_ctx, num_sms(device), block_n)
    require(1 <= num_splits <= MAX_SPLITS, f"num_splits must be in [1, {MAX_SPLITS}], got {num_splits}")
    scale = head_dim ** -0.5 if scale is None else float(scale)
    block_d = head_dim_tile(head_dim)
    launch = {"num_warps": num_warps or config["num_warps"], "num_stages": num_stages or config["num_stages"]}

    part_out = part_lse = out  # placeholders: unused by the kernel when there is a single split
    if num_splits > 1:
        part_out = torch.empty((num_seqs, num_q_heads, num_splits, head_dim), dtype=torch.float32, device=device)
        part_lse = torch.empty((num_seqs, num_q_heads, num_splits), dtype=torch.float32, device=device)
    _decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        out, part_out, part_lse, q, k_cache, v_cache, block_tables, context_lens, scale * LOG2E, num_splits,
        *q.stride(), *out.stride(), *k_cache.stride(), *v_cache.stride(), block_tables.stride(0),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=max(16, next_pow2(group)),
        BLOCK_N=block_n, BLOCK_SIZE=block_size, SPLIT_KV=num_splits > 1, **dot_options(q.dtype), **launch)
    if num_splits > 1:
        _decode_reduce_kernel[(num_seqs, num_q_heads)](
            out, part_out, part_lse, num_splits, *out.stride(), HEAD_DIM=head_dim, BLOCK_D=block_d,
            BLOCK_S=next_pow2(num_splits), num_warps=4)
    return out
