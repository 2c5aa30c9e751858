"""Chunked-prefill attention over the paged KV cache (varlen, causal with a context offset).

The queries of a batch are ragged (``cu_seqlens_q``, no padding). Sequence ``i`` has
``context_lens[i]`` tokens in the cache, its ``q_len`` query tokens being the last of them, so a
chunk of a longer prompt attends to every earlier token plus itself causally: query ``t`` of the
chunk sits at position ``context_len - q_len + t`` and sees keys ``0..position``. K/V for the chunk
must already be in the cache (``write_kv`` first).

One program handles one tile of ``BLOCK_M`` rows for one (sequence, KV head): ``BLOCK_M // GROUP``
query tokens times the ``GROUP`` query heads that share the KV head, so K/V tiles are read once per
KV head. Keys below the tile's first position are visible to every row and run unmasked; only the
diagonal tiles pay for the causal mask. Programs are issued longest-first (the last query tiles of a
chunk see the most keys) to shorten the tail.
"""

from __future__ import annotations

from itertools import pairwise

import torch
import triton
import triton.language as tl

from ._attn import attend_tiles, normalise
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
    next_pow2,
    require,
)

LOG2E = 1.4426950408889634


@triton.jit
def _prefill_kernel(
    out_ptr,  # [total_q_tokens, num_q_heads, head_dim] output
    q_ptr,  # [total_q_tokens, num_q_heads, head_dim] queries
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    block_tables_ptr,  # [num_seqs, max_blocks] int32 physical page ids
    cu_seqlens_q_ptr,  # [num_seqs + 1] int32 start of each sequence's queries
    context_lens_ptr,  # [num_seqs] int32 tokens in the cache, this chunk included
    qk_scale,  # softmax scale * log2(e)
    stride_qt,  # q stride between tokens
    stride_qh,  # q stride between heads
    stride_qd,  # q stride along head_dim
    stride_ot,  # out stride between tokens
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
    BLOCK_M: tl.constexpr,  # rows per tile: (BLOCK_M // GROUP) tokens x GROUP heads
    BLOCK_N: tl.constexpr,  # keys per tile
    BLOCK_SIZE: tl.constexpr,  # tokens per cache page
    DOT_FP32: tl.constexpr,  # upcast tl.dot operands to fp32 (interpreter)
    PRECISION: tl.constexpr,  # tl.dot input_precision
):
    q_tile = tl.num_programs(0) - 1 - tl.program_id(0)  # longest-first
    seq = tl.program_id(1)
    kv_head = tl.program_id(2)
    BLOCK_Q: tl.constexpr = BLOCK_M // GROUP  # query tokens per tile

    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    first = q_tile * BLOCK_Q  # first query token of this tile, relative to the sequence
    if first >= q_len:
        return
    ctx = tl.load(context_lens_ptr + seq)
    offset = ctx - q_len  # cache position of the chunk's first token

    rows = tl.arange(0, BLOCK_M)
    tokens = first + rows // GROUP  # [BLOCK_M] query token of each row
    heads = kv_head * GROUP + rows % GROUP  # [BLOCK_M] query head of each row
    row_mask = (rows < BLOCK_Q * GROUP) & (tokens < q_len)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    qd_mask = row_mask[:, None] & d_mask[None, :]
    token_ids = (q_start + tokens).to(tl.int64)

    # q: [BLOCK_M, BLOCK_D]
    q = tl.load(q_ptr + token_ids[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                mask=qd_mask, other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)

    last = tl.minimum(first + BLOCK_Q, q_len) - 1  # last query token of this tile
    diag_lo = (offset + first + 1) // BLOCK_N * BLOCK_N  # keys below this are visible to every row
    hi = offset + last + 1  # one past the last key any row sees

    acc = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    q_pos = offset + tokens
    k_head_ptr = k_cache_ptr + kv_head.to(tl.int64) * stride_kh
    v_head_ptr = v_cache_ptr + kv_head.to(tl.int64) * stride_vh
    table_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt
    acc, m_i, l_i = attend_tiles(acc, m_i, l_i, q, q_pos, k_head_ptr, v_head_ptr, table_ptr, 0, diag_lo,
                                 qk_scale, offs_d, d_mask, stride_kb, stride_ks, stride_kd, stride_vb,
                                 stride_vs, stride_vd, BLOCK_SIZE, BLOCK_N, False, DOT_FP32, PRECISION)
    acc, m_i, l_i = attend_tiles(acc, m_i, l_i, q, q_pos, k_head_ptr, v_head_ptr, table_ptr, diag_lo, hi,
                                 qk_scale, offs_d, d_mask, stride_kb, stride_ks, stride_kd, stride_vb,
                                 stride_vs, stride_vd, BLOCK_SIZE, BLOCK_N, True, DOT_FP32, PRECISION)
    result = normalise(acc, l_i)

    o_ptrs = out_ptr + token_ids[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :] * stride_od
    tl.store(o_ptrs, result.to(out_ptr.dtype.element_ty), mask=qd_mask)


def default_config(head_dim: int, dtype: torch.dtype, group: int, max_seqlen_q: int) -> dict:
    """Launch parameters chosen by reasoning, not tuning (see docs/kernels.md).

    BLOCK_M shrinks for short chunks so a handful of query tokens does not fill a 128-row tile.
    """
    wide = head_dim > 128 or dtype == torch.float32
    block_m = 64 if wide else 128
    block_m = min(block_m, max(16, next_pow2(max_seqlen_q * group)))
    block_m = max(block_m, next_pow2(group))  # at least one token per tile
    return {"block_m": block_m, "block_n": 32 if wide else 64,
            "num_warps": 8 if block_m >= 128 else 4, "num_stages": 3}


def _check_ragged(cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor, num_tokens: int) -> tuple[int, int]:
    """Validate the ragged layout against the contexts (one host sync); returns (max q_len, max context)."""
    values = torch.cat([cu_seqlens_q, context_lens]).tolist()
    starts, contexts = values[: len(cu_seqlens_q)], values[len(cu_seqlens_q) :]
    require(starts[0] == 0 and starts[-1] == num_tokens,
            f"cu_seqlens_q must start at 0 and end at total_q_tokens={num_tokens}, got {starts[0]}..{starts[-1]}")
    q_lens = [b - a for a, b in pairwise(starts)]
    require(min(q_lens, default=0) >= 0, "cu_seqlens_q must be non-decreasing")
    for i, (q_len, ctx) in enumerate(zip(q_lens, contexts, strict=True)):
        require(q_len <= ctx, f"sequence {i} has {q_len} query tokens but context_lens[{i}] = {ctx}; "
                              "the chunk must already be in the cache")
    return max(q_lens, default=0), max(contexts, default=0)


def paged_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    *,
    out: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_context_len: int | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """Causal attention of ragged query chunks over their paged KV cache.

    q: [total_q_tokens, num_q_heads, head_dim]; k_cache, v_cache: [num_blocks, block_size,
    num_kv_heads, head_dim]; block_tables: [num_seqs, max_blocks] int32; cu_seqlens_q: [num_seqs + 1]
    int32; context_lens: [num_seqs] int32, total cached tokens per sequence, its queries being the
    last q_len of them. Returns out: [total_q_tokens, num_q_heads, head_dim].

    Passing both ``max_seqlen_q`` and ``max_context_len`` (trusted hints) skips reading the lengths
    back to the host. ``block_m``, ``block_n``, ``num_warps`` and ``num_stages`` override heuristics.
    """
    _, block_size, num_kv_heads, head_dim = check_cache(k_cache, v_cache)
    group = check_query(q, k_cache, num_kv_heads, head_dim)
    check_tensor("block_tables", block_tables, 2, (torch.int32,))
    check_tensor("cu_seqlens_q", cu_seqlens_q, 1, (torch.int32,))
    check_tensor("context_lens", context_lens, 1, (torch.int32,))
    check_devices(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables,
                  cu_seqlens_q=cu_seqlens_q, context_lens=context_lens)
    num_seqs = cu_seqlens_q.shape[0] - 1
    require(num_seqs >= 0, "cu_seqlens_q must have num_seqs + 1 >= 1 entries")
    check_lengths("context_lens", context_lens, num_seqs)
    if max_seqlen_q is None or max_context_len is None:  # no hints: validate the lengths on the host
        max_seqlen_q, max_context_len = _check_ragged(cu_seqlens_q, context_lens, q.shape[0])
    check_block_tables(block_tables, num_seqs, block_size, max_context_len)
    out = check_out(out, q)
    if num_seqs == 0 or q.shape[0] == 0 or max_seqlen_q == 0:
        return out

    config = default_config(head_dim, q.dtype, group, max_seqlen_q)
    block_m = block_m or config["block_m"]
    block_n = block_n or config["block_n"]
    require(block_m >= 16 and block_m == next_pow2(block_m) and block_m >= group,
            f"block_m must be a power of two >= max(16, GQA group {group}), got {block_m}")
    require(block_n >= 16 and block_n == next_pow2(block_n), f"block_n must be a power of two >= 16, got {block_n}")
    scale = head_dim ** -0.5 if scale is None else float(scale)
    tokens_per_tile = block_m // group
    grid = (triton.cdiv(max_seqlen_q, tokens_per_tile), num_seqs, num_kv_heads)
    _prefill_kernel[grid](
        out, q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale * LOG2E,
        *q.stride(), *out.stride(), *k_cache.stride(), *v_cache.stride(), block_tables.stride(0),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_D=head_dim_tile(head_dim), BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_SIZE=block_size, **dot_options(q.dtype),
        num_warps=num_warps or config["num_warps"], num_stages=num_stages or config["num_stages"])
    return out
