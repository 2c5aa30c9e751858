"""KV-cache write: scatter this step's keys and values into their cache pages.

Token ``t`` goes to ``slot_mapping[t] = block_id * block_size + offset``; ``-1`` marks padding and is
skipped. One program copies one token's ``[num_kv_heads, head_dim]`` K and V rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._validate import (
    FLOAT_DTYPES,
    check_cache,
    check_devices,
    check_tensor,
    dtype_name,
    host_range,
    next_pow2,
    require,
)


@triton.jit
def _write_kv_kernel(
    k_ptr,  # [num_tokens, num_kv_heads, head_dim] new keys
    v_ptr,  # [num_tokens, num_kv_heads, head_dim] new values
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping_ptr,  # [num_tokens] int64 destination slot, -1 = skip
    stride_kt,  # k stride between tokens
    stride_kh,  # k stride between heads
    stride_kd,  # k stride along head_dim
    stride_vt,  # v stride between tokens
    stride_vh,  # v stride between heads
    stride_vd,  # v stride along head_dim
    stride_ckb,  # k_cache stride between pages
    stride_cks,  # k_cache stride between slots
    stride_ckh,  # k_cache stride between heads
    stride_ckd,  # k_cache stride along head_dim
    stride_cvb,  # v_cache stride between pages
    stride_cvs,  # v_cache stride between slots
    stride_cvh,  # v_cache stride between heads
    stride_cvd,  # v_cache stride along head_dim
    NUM_HEADS: tl.constexpr,  # num_kv_heads
    HEAD_DIM: tl.constexpr,  # head dimension
    BLOCK_H: tl.constexpr,  # NUM_HEADS padded to a power of two
    BLOCK_D: tl.constexpr,  # HEAD_DIM padded to a power of two
    BLOCK_SIZE: tl.constexpr,  # tokens per cache page
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token)
    if slot < 0:
        return
    page = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h < NUM_HEADS)[:, None] & (offs_d < HEAD_DIM)[None, :]

    # k, v rows: [BLOCK_H, BLOCK_D]
    k = tl.load(k_ptr + token * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :] * stride_kd, mask=mask)
    v = tl.load(v_ptr + token * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :] * stride_vd, mask=mask)
    k_dst = k_cache_ptr + page * stride_ckb + offset * stride_cks
    v_dst = v_cache_ptr + page * stride_cvb + offset * stride_cvs
    tl.store(k_dst + offs_h[:, None] * stride_ckh + offs_d[None, :] * stride_ckd, k, mask=mask)
    tl.store(v_dst + offs_h[:, None] * stride_cvh + offs_d[None, :] * stride_cvd, v, mask=mask)


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    check_slots: bool = True,
    num_warps: int | None = None,
) -> None:
    """Write ``k, v: [num_tokens, num_kv_heads, head_dim]`` into the paged caches in place.

    slot_mapping: [num_tokens] int64, ``block_id * block_size + offset`` or -1 to skip a token.
    ``check_slots=False`` skips the range check on the slots, which reads them back to the host.
    """
    num_blocks, block_size, num_kv_heads, head_dim = check_cache(k_cache, v_cache)
    check_tensor("k", k, 3, FLOAT_DTYPES)
    check_tensor("v", v, 3, FLOAT_DTYPES)
    check_tensor("slot_mapping", slot_mapping, 1, (torch.int64,))
    check_devices(k=k, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    require(k.shape == v.shape, f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape")
    require(k.dtype == v.dtype == k_cache.dtype,
            f"k ({dtype_name(k.dtype)}), v ({dtype_name(v.dtype)}) and the cache "
            f"({dtype_name(k_cache.dtype)}) must share one dtype")
    require(tuple(k.shape[1:]) == (num_kv_heads, head_dim),
            f"k/v rows are [{k.shape[1]}, {k.shape[2]}] but the cache holds [num_kv_heads={num_kv_heads}, "
            f"head_dim={head_dim}]")
    num_tokens = k.shape[0]
    require(slot_mapping.shape[0] == num_tokens,
            f"slot_mapping has {slot_mapping.shape[0]} entries for {num_tokens} tokens")
    if num_tokens == 0:
        return
    if check_slots:
        lo, hi = host_range(slot_mapping)
        num_slots = num_blocks * block_size
        require(lo >= -1 and hi < num_slots,
                f"slot_mapping values must be -1 or in [0, {num_slots}), got min {lo}, max {hi}")
    block_h, block_d = next_pow2(num_kv_heads), next_pow2(head_dim)
    _write_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping, *k.stride(), *v.stride(), *k_cache.stride(), *v_cache.stride(),
        NUM_HEADS=num_kv_heads, HEAD_DIM=head_dim, BLOCK_H=block_h, BLOCK_D=block_d, BLOCK_SIZE=block_size,
        num_warps=num_warps or min(8, max(1, block_h * block_d // 256)))
