"""Input checks and launch helpers shared by the kernel wrappers.

Every check raises ``ValueError`` with a message that names the offending argument, so a caller
can tell a bad shape from a bad dtype from a bad device without reading the kernel.
"""

from __future__ import annotations

import math
import os

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256


def interpreting() -> bool:
    """True when Triton runs kernels through its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def require(condition: bool, message: str) -> None:
    """Raise ``ValueError(message)`` unless ``condition`` holds."""
    if not condition:
        raise ValueError(message)


def check_tensor(name: str, t: object, ndim: int, dtypes: tuple[torch.dtype, ...]) -> torch.Tensor:
    """Check that ``t`` is a tensor with ``ndim`` dimensions and one of ``dtypes``."""
    require(isinstance(t, torch.Tensor), f"{name} must be a torch.Tensor, got {type(t).__name__}")
    require(t.dim() == ndim, f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    allowed = " or ".join(dtype_name(d) for d in dtypes)
    require(t.dtype in dtypes, f"{name} must have dtype {allowed}, got {dtype_name(t.dtype)}")
    return t


def check_devices(**tensors: torch.Tensor) -> torch.device:
    """All tensors on one device, and one the kernels can run on; returns that device."""
    devices = {name: t.device for name, t in tensors.items()}
    first_name, device = next(iter(devices.items()))
    for name, other in devices.items():
        require(other == device, f"{name} is on {other} but {first_name} is on {device}; "
                                 "all tensors must be on the same device")
    if not interpreting():
        require(device.type == "cuda", f"tensors are on {device}; the compiled kernels need a CUDA "
                                       "device (set TRITON_INTERPRET=1 to run them on the CPU)")
    else:
        require(device.type in ("cpu", "cuda"), f"tensors are on {device}, which holds no data")
    return device


def check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, int, int, int]:
    """Validate a paged K/V cache pair; returns (num_blocks, block_size, num_kv_heads, head_dim)."""
    check_tensor("k_cache", k_cache, 4, FLOAT_DTYPES)
    check_tensor("v_cache", v_cache, 4, FLOAT_DTYPES)
    require(k_cache.shape == v_cache.shape,
            f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} must have the same "
            "shape [num_blocks, block_size, num_kv_heads, head_dim]")
    require(k_cache.dtype == v_cache.dtype,
            f"k_cache ({dtype_name(k_cache.dtype)}) and v_cache ({dtype_name(v_cache.dtype)}) "
            "must have the same dtype")
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    require(min(num_blocks, block_size, num_kv_heads, head_dim) > 0,
            f"k_cache has an empty dimension: shape {tuple(k_cache.shape)}")
    require(head_dim <= MAX_HEAD_DIM, f"head_dim {head_dim} exceeds the supported maximum {MAX_HEAD_DIM}")
    return num_blocks, block_size, num_kv_heads, head_dim


def check_query(q: torch.Tensor, k_cache: torch.Tensor, num_kv_heads: int, head_dim: int) -> int:
    """Validate ``q: [tokens, num_q_heads, head_dim]`` against the cache; returns the GQA group size."""
    check_tensor("q", q, 3, FLOAT_DTYPES)
    require(q.dtype == k_cache.dtype,
            f"q dtype {dtype_name(q.dtype)} must match the cache dtype {dtype_name(k_cache.dtype)}")
    require(q.shape[2] == head_dim, f"q head_dim {q.shape[2]} must match the cache head_dim {head_dim}")
    num_q_heads = q.shape[1]
    require(num_q_heads > 0 and num_q_heads % num_kv_heads == 0,
            f"num_q_heads ({num_q_heads}) must be a positive multiple of num_kv_heads ({num_kv_heads})")
    return num_q_heads // num_kv_heads


def check_out(out: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """Return ``out`` after checking it matches ``like``, or a fresh tensor shaped like it."""
    if out is None:
        return torch.empty_like(like, memory_format=torch.contiguous_format)
    require(isinstance(out, torch.Tensor) and out.shape == like.shape and out.dtype == like.dtype
            and out.device == like.device,
            f"out must be a {dtype_name(like.dtype)} tensor of shape {tuple(like.shape)} on {like.device}")
    return out


def host_range(t: torch.Tensor) -> tuple[int, int]:
    """(min, max) of a non-empty integer tensor, read back to the host in one transfer."""
    lo, hi = torch.stack(torch.aminmax(t)).tolist()
    return int(lo), int(hi)


def check_lengths(name: str, lengths: torch.Tensor, num_seqs: int) -> None:
    """``lengths: [num_seqs]`` int32, one entry per sequence."""
    check_tensor(name, lengths, 1, (torch.int32,))
    require(lengths.shape[0] == num_seqs, f"{name} has {lengths.shape[0]} entries for {num_seqs} sequences")


def check_block_tables(block_tables: torch.Tensor, num_seqs: int, block_size: int,
                       max_context_len: int) -> None:
    """``block_tables: [num_seqs, max_blocks]`` int32, long enough for the longest context."""
    check_tensor("block_tables", block_tables, 2, (torch.int32,))
    require(block_tables.shape[0] == num_seqs,
            f"block_tables has {block_tables.shape[0]} rows for {num_seqs} sequences")
    capacity = block_tables.shape[1] * block_size
    require(max_context_len <= capacity,
            f"a context of {max_context_len} tokens is longer than the block table holds "
            f"({block_tables.shape[1]} blocks x block_size {block_size} = {capacity} tokens)")


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (and >= 1)."""
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def head_dim_tile(head_dim: int) -> int:
    """Padded head-dim tile: a power of two and >= 16, the smallest K of ``tl.dot``."""
    return max(16, next_pow2(head_dim))


def dot_options(dtype: torch.dtype) -> dict:
    """Constexprs controlling ``tl.dot`` precision.

    The interpreter computes low-precision dots incorrectly, so there operands are upcast to fp32.
    On a GPU, fp32 caches use IEEE dots (not TF32) so fp32 stays an accuracy reference.
    """
    return {"DOT_FP32": interpreting(), "PRECISION": "ieee" if dtype == torch.float32 else "tf32"}


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors on ``device``; 1 under the interpreter, which runs programs serially."""
    if device.type == "cuda" and not interpreting():
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1
