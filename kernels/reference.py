"""Plain-torch references for the kernels: slow, obviously correct, computed in fp32.

Each mirrors the signature of its kernel and returns its result in the input dtype; tests and the
benchmark compare against them.
"""

from __future__ import annotations

import torch


def write_kv_ref(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return copies of the caches with ``k, v: [num_tokens, num_kv_heads, head_dim]`` written."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_out, v_out = k_cache.clone(), v_cache.clone()
    # flat views: [num_blocks * block_size, num_kv_heads, head_dim]
    k_out.view(-1, *k_cache.shape[2:])[slots] = k[keep]
    v_out.view(-1, *v_cache.shape[2:])[slots] = v[keep]
    return k_out, v_out


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` tokens of one sequence as a contiguous [length, num_kv_heads, head_dim]."""
    block_size = cache.shape[1]
    pages = block_table[: -(-length // block_size)].long()
    return cache[pages].reshape(-1, *cache.shape[2:])[:length]


def attention_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor,
                  scale: float) -> torch.Tensor:
    """q: [num_q, num_q_heads, head_dim] at positions q_pos; k, v: [num_k, num_kv_heads, head_dim].

    Query ``i`` sees keys ``0..q_pos[i]``. Returns [num_q, num_q_heads, head_dim] in fp32.
    """
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale  # [num_q_heads, num_q, num_k]
    visible = torch.arange(k.shape[0], device=q.device)[None, :] <= q_pos[:, None]  # [num_q, num_k]
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v)


def paged_decode_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, context_lens: torch.Tensor,
                     scale: float | None = None) -> torch.Tensor:
    """Reference for ``paged_decode``: q [num_seqs, num_q_heads, head_dim] -> same shape."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out = torch.empty_like(q)
    for i, ctx in enumerate(context_lens.tolist()):
        k = gather_kv(k_cache, block_tables[i], ctx)
        v = gather_kv(v_cache, block_tables[i], ctx)
        pos = torch.tensor([ctx - 1], device=q.device)
        out[i] = attention_ref(q[i : i + 1], k, v, pos, scale)[0].to(q.dtype)
    return out


def paged_prefill_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      block_tables: torch.Tensor, cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor,
                      scale: float | None = None) -> torch.Tensor:
    """Reference for ``paged_prefill``: q [total_q_tokens, num_q_heads, head_dim] -> same shape."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out = torch.empty_like(q)
    starts = cu_seqlens_q.tolist()
    for i, ctx in enumerate(context_lens.tolist()):
        a, b = starts[i], starts[i + 1]
        if a == b:
            continue
        k = gather_kv(k_cache, block_tables[i], ctx)
        v = gather_kv(v_cache, block_tables[i], ctx)
        pos = torch.arange(ctx - (b - a), ctx, device=q.device)
        out[a:b] = attention_ref(q[a:b], k, v, pos, scale).to(q.dtype)
    return out
