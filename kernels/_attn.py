"""Shared Triton building blocks for attention over a paged KV cache.

Both the decode and the prefill kernel hold a tile of query rows (``BLOCK_M`` rows: GQA heads that
share one KV head, times one or more tokens) and stream the keys of one sequence through
``attend_tiles`` with an online (flash) softmax. Keys are visited in tiles of ``BLOCK_N`` tokens,
independent of the cache's page size: every key position is mapped through the block table to
``(physical block, offset)``, so a tile may span several pages or a fraction of one.

Scores live in the log2 domain (``qk_scale`` already includes log2(e)) so the kernels use ``exp2``.

The kernels call only Triton builtins and ``@triton.jit`` functions of this package, never the
``@jit`` helpers of ``triton.language.standard`` (``tl.max``, ``tl.sum``, ``tl.zeros``, ``tl.cdiv``):
those are bound to compiled or interpreted mode when ``triton`` is first imported, so a process that
imported triton before ``kernels`` turned the interpreter on would otherwise fail on a CPU.
``row_max`` / ``row_sum`` are the same ``tl.reduce`` calls that ``tl.max`` / ``tl.sum`` make.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _max_combine(a, b):
    return tl.maximum(a, b)


@triton.jit
def _sum_combine(a, b):
    return a + b


# The combine functions behind tl.max / tl.sum where this triton has them: the interpreter recognises
# them and reduces with numpy instead of calling the combine function element by element.
_MAX_COMBINE = getattr(tl.standard, "_elementwise_max", _max_combine)
_SUM_COMBINE = getattr(tl.standard, "_sum_combine", _sum_combine)


@triton.jit
def row_max(
    x,  # fp32 tile
    AXIS: tl.constexpr,  # axis to reduce
):
    return tl.reduce(x, AXIS, _MAX_COMBINE)


@triton.jit
def row_sum(
    x,  # fp32 tile
    AXIS: tl.constexpr,  # axis to reduce
):
    return tl.reduce(x, AXIS, _SUM_COMBINE)


@triton.jit
def attend_tiles(
    acc,  # [BLOCK_M, BLOCK_D] fp32 running, unnormalised output
    m_i,  # [BLOCK_M] fp32 running row maximum of the scaled scores (log2 domain)
    l_i,  # [BLOCK_M] fp32 running row sum of exp2(score - m_i)
    q,  # [BLOCK_M, BLOCK_D] query tile (fp32 when DOT_FP32)
    q_pos,  # [BLOCK_M] int32 position of each row's token: it sees keys n <= q_pos
    k_head_ptr,  # k_cache pointer advanced to this KV head
    v_head_ptr,  # v_cache pointer advanced to this KV head
    table_ptr,  # this sequence's row of block_tables
    lo,  # first key position to visit (a multiple of BLOCK_N)
    hi,  # one past the last key position to visit
    qk_scale,  # softmax scale * log2(e)
    offs_d,  # [BLOCK_D] head-dim offsets
    d_mask,  # [BLOCK_D] offs_d < head_dim
    stride_kb,  # k_cache stride between pages
    stride_ks,  # k_cache stride between slots of a page
    stride_kd,  # k_cache stride along head_dim
    stride_vb,  # v_cache stride between pages
    stride_vs,  # v_cache stride between slots of a page
    stride_vd,  # v_cache stride along head_dim
    BLOCK_SIZE: tl.constexpr,  # tokens per cache page
    BLOCK_N: tl.constexpr,  # keys per tile
    MASKED: tl.constexpr,  # apply the causal / range mask to the scores
    DOT_FP32: tl.constexpr,  # upcast K/V to fp32 before tl.dot (interpreter)
    PRECISION: tl.constexpr,  # tl.dot input_precision
):
    for start in range(lo, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)  # [BLOCK_N] key positions
        n_mask = offs_n < hi
        page = tl.load(table_ptr + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
        slot = (offs_n % BLOCK_SIZE).to(tl.int64)
        # k: [BLOCK_D, BLOCK_N], loaded transposed so that q @ k needs no tl.trans
        k = tl.load(k_head_ptr + (page * stride_kb + slot * stride_ks)[None, :] + offs_d[:, None] * stride_kd,
                    mask=n_mask[None, :] & d_mask[:, None], other=0.0)
        # v: [BLOCK_N, BLOCK_D]
        v = tl.load(v_head_ptr + (page * stride_vb + slot * stride_vs)[:, None] + offs_d[None, :] * stride_vd,
                    mask=n_mask[:, None] & d_mask[None, :], other=0.0)
        if DOT_FP32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, k, input_precision=PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
        if MASKED:
            visible = (offs_n[None, :] <= q_pos[:, None]) & n_mask[None, :]
            s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, row_max(s, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
        alpha = tl.exp2(m_i - m_ref)
        p = tl.exp2(s - m_ref[:, None])
        l_i = l_i * alpha + row_sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def normalise(
    acc,  # [BLOCK_M, BLOCK_D] fp32 unnormalised output
    l_i,  # [BLOCK_M] fp32 softmax denominators
):
    """acc / l_i, with rows that saw no key (l_i == 0) left at zero instead of NaN."""
    return acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
