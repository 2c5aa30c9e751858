"""Tests for kernels/: each Triton kernel against its torch reference, plus input validation.

Without CUDA the kernels run through Triton's CPU interpreter, which must be switched on before any
kernel is defined, hence the environment line above the imports. Shapes stay small because the
interpreter is slow; the GPU-only tests at the end use serving-sized shapes.

Tolerances (|out - ref| <= atol + rtol * |ref|, the reference computed in fp32 then rounded to the
input dtype): fp32 1e-4/1e-4; fp16 2e-3/4e-3 (a couple of fp16 ulps); bf16 1e-2/2e-2 (two bf16 ulps
of values up to ~4, since rounding the fp32 result can land one ulp either side).
"""

import os
import subprocess
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

import kernels  # noqa: E402
from kernels.reference import paged_decode_ref, paged_prefill_ref, write_kv_ref  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-3, 4e-3), torch.bfloat16: (1e-2, 2e-2)}
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def make_cache(num_blocks, block_size, num_kv_heads, head_dim, dtype, seed=0):
    """Random K/V caches: [num_blocks, block_size, num_kv_heads, head_dim]."""
    gen = torch.Generator().manual_seed(seed)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return tuple(torch.randn(shape, generator=gen).to(dtype).to(DEVICE) for _ in range(2))


def make_block_tables(context_lens, block_size, num_blocks, seed=0, spare=2):
    """Each sequence gets distinct, scattered physical pages; ``spare`` unused entries per row."""
    gen = torch.Generator().manual_seed(seed)
    width = max(-(-c // block_size) for c in context_lens) + spare
    pages = torch.randperm(num_blocks, generator=gen)
    need = sum(-(-c // block_size) for c in context_lens)
    assert need <= num_blocks, "test cache too small"
    table = torch.zeros((len(context_lens), width), dtype=torch.int32)
    used = 0
    for i, c in enumerate(context_lens):
        n = -(-c // block_size)
        table[i, :n] = pages[used : used + n]
        used += n
    return table.to(DEVICE)


def rand(shape, dtype, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to(DEVICE)


def poisoned(like):
    return torch.full_like(like, float("nan"))


def assert_close(out, ref):
    assert not out.isnan().any(), "output not fully written (NaN poison left)"
    atol, rtol = TOL[out.dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=rtol)


def decode_case(dtype, group, context_lens, *, num_kv_heads=2, head_dim=64, block_size=16, seed=0):
    num_blocks = sum(-(-c // block_size) for c in context_lens) + 5
    k_cache, v_cache = make_cache(num_blocks, block_size, num_kv_heads, head_dim, dtype, seed)
    tables = make_block_tables(context_lens, block_size, num_blocks, seed)
    q = rand((len(context_lens), num_kv_heads * group, head_dim), dtype, seed + 1)
    ctx = torch.tensor(context_lens, dtype=torch.int32, device=DEVICE)
    return q, k_cache, v_cache, tables, ctx


def prefill_case(dtype, group, q_lens, earlier, *, num_kv_heads=2, head_dim=64, block_size=16, seed=0):
    """Chunks of ``q_lens`` tokens, each after ``earlier`` tokens already cached for its sequence."""
    context_lens = [q + e for q, e in zip(q_lens, earlier, strict=True)]
    num_blocks = sum(-(-c // block_size) for c in context_lens) + 5
    k_cache, v_cache = make_cache(num_blocks, block_size, num_kv_heads, head_dim, dtype, seed)
    tables = make_block_tables(context_lens, block_size, num_blocks, seed)
    q = rand((sum(q_lens), num_kv_heads * group, head_dim), dtype, seed + 1)
    cu = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)
    ctx = torch.tensor(context_lens, dtype=torch.int32, device=DEVICE)
    return q, k_cache, v_cache, tables, cu, ctx


# ---------------------------------------------------------------- write_kv


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_kv_scatters_rows_and_skips_padding(dtype):
    num_blocks, block_size, heads, head_dim = 6, 16, 2, 64
    k_cache, v_cache = make_cache(num_blocks, block_size, heads, head_dim, dtype)
    # k, v as strided views into a fused qkv projection: [num_tokens, 3 * heads, head_dim]
    qkv = rand((7, 3 * heads, head_dim), dtype, seed=3)
    k, v = qkv[:, heads : 2 * heads], qkv[:, 2 * heads :]
    slots = torch.tensor([3, -1, 40, 41, 17, -1, num_blocks * block_size - 1], device=DEVICE)
    k_ref, v_ref = write_kv_ref(k, v, k_cache, v_cache, slots)
    kernels.write_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


# ---------------------------------------------------------------- decode


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_decode_matches_reference(dtype, group, num_splits):
    # a single-token context, contexts off and on a page boundary; with 3 splits some are empty
    q, k_cache, v_cache, tables, ctx = decode_case(dtype, group, [1, 37, 70, 16])
    out = poisoned(q)
    res = kernels.paged_decode(q, k_cache, v_cache, tables, ctx, out=out, num_splits=num_splits, block_n=32)
    assert res is out
    assert_close(out, paged_decode_ref(q, k_cache, v_cache, tables, ctx))


@pytest.mark.parametrize(
    "dtype, group, head_dim, block_size, block_n, num_splits",
    [
        (torch.bfloat16, 4, 128, 32, 16, None),  # key tile smaller than a page, heuristic splits
        (torch.float32, 3, 48, 8, 32, 2),  # padded head_dim, group not a power of two, tile spans pages
        (torch.float16, 8, 64, 5, 16, 4),  # page size not a power of two
    ],
)
def test_paged_decode_tile_and_page_shapes(dtype, group, head_dim, block_size, block_n, num_splits):
    q, k_cache, v_cache, tables, ctx = decode_case(dtype, group, [29, 3], head_dim=head_dim,
                                                   block_size=block_size, seed=7)
    out = poisoned(q)
    kernels.paged_decode(q, k_cache, v_cache, tables, ctx, out=out, num_splits=num_splits, block_n=block_n)
    assert_close(out, paged_decode_ref(q, k_cache, v_cache, tables, ctx))


def test_paged_decode_scale_strides_and_length_hint():
    q, k_cache, v_cache, tables, ctx = decode_case(torch.float32, 4, [50, 9])
    q = torch.cat([q, q], dim=-1)[..., : q.shape[-1]]  # non-contiguous rows
    out = kernels.paged_decode(q, k_cache, v_cache, tables, ctx, 0.3, max_context_len=50)
    assert_close(out, paged_decode_ref(q, k_cache, v_cache, tables, ctx, 0.3))


def test_choose_num_splits_follows_occupancy():
    h100, wave = 132, 2 * 132  # two resident decode programs per SM
    assert kernels.choose_num_splits(1, 8, 32768, h100, 64) > 8  # one sequence: fill the SMs
    assert kernels.choose_num_splits(32, 8, 32768, h100, 64) == 1  # 256 programs: grid already full
    assert kernels.choose_num_splits(1, 8, 200, h100, 64) == 1  # too few key tiles to be worth it
    splits = kernels.choose_num_splits(4, 8, 8192, h100, 64)
    assert 1 < splits and 0.8 * wave <= 4 * 8 * splits <= wave
    assert kernels.choose_num_splits(1, 8, 32768, 1, 64) == 1  # the interpreter: one "SM"


# ---------------------------------------------------------------- prefill


@pytest.mark.parametrize("with_context", [False, True])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_prefill_matches_reference(dtype, group, with_context):
    q_lens = [9, 20, 1]
    earlier = [23, 30, 45] if with_context else [0, 0, 0]  # tokens cached before this chunk
    q, k_cache, v_cache, tables, cu, ctx = prefill_case(dtype, group, q_lens, earlier)
    out = poisoned(q)
    kernels.paged_prefill(q, k_cache, v_cache, tables, cu, ctx, out=out, block_m=32, block_n=16)
    assert_close(out, paged_prefill_ref(q, k_cache, v_cache, tables, cu, ctx))


def test_paged_prefill_odd_shapes_default_tiles():
    # group 3 (tile rows not a multiple of it), padded head_dim, page size 8, an empty sequence
    q, k_cache, v_cache, tables, cu, ctx = prefill_case(torch.float16, 3, [12, 0, 5], [28, 7, 0],
                                                        head_dim=48, block_size=8, seed=5)
    out = poisoned(q)
    kernels.paged_prefill(q, k_cache, v_cache, tables, cu, ctx, out=out, max_seqlen_q=12, max_context_len=40)
    assert_close(out, paged_prefill_ref(q, k_cache, v_cache, tables, cu, ctx))


def test_prefill_of_one_token_equals_decode():
    q, k_cache, v_cache, tables, ctx = decode_case(torch.float32, 4, [33, 1, 64])
    cu = torch.arange(4, dtype=torch.int32, device=DEVICE)
    decode = kernels.paged_decode(q, k_cache, v_cache, tables, ctx, num_splits=2, block_n=16)
    prefill = kernels.paged_prefill(q, k_cache, v_cache, tables, cu, ctx, block_n=16)
    torch.testing.assert_close(prefill, decode, atol=1e-5, rtol=1e-5)


def test_chunked_prefill_through_write_kv_equals_whole_prompt():
    dtype, heads, group, head_dim, block_size, prompt = torch.bfloat16, 2, 4, 64, 16, 45
    k_cache, v_cache = (poisoned(c) for c in make_cache(8, block_size, heads, head_dim, dtype))
    tables = make_block_tables([prompt], block_size, 8, seed=2)
    q, k, v = (rand((prompt, h, head_dim), dtype, seed=s) for s, h in [(1, heads * group), (2, heads), (3, heads)])
    positions = torch.arange(prompt, device=DEVICE)
    slots = tables[0].long()[positions // block_size] * block_size + positions % block_size
    chunks = []
    for lo, hi in [(0, 20), (20, 45)]:  # two chunks: the second attends to the first
        kernels.write_kv(k[lo:hi], v[lo:hi], k_cache, v_cache, slots[lo:hi])
        cu = torch.tensor([0, hi - lo], dtype=torch.int32, device=DEVICE)
        ctx = torch.tensor([hi], dtype=torch.int32, device=DEVICE)
        chunks.append(kernels.paged_prefill(q[lo:hi], k_cache, v_cache, tables, cu, ctx, block_m=16, block_n=16))
    k_full, v_full = write_kv_ref(k, v, torch.zeros_like(k_cache), torch.zeros_like(v_cache), slots)
    cu = torch.tensor([0, prompt], dtype=torch.int32, device=DEVICE)
    ref = paged_prefill_ref(q, k_full, v_full, tables, cu, torch.tensor([prompt], dtype=torch.int32, device=DEVICE))
    assert_close(torch.cat(chunks), ref)


# ---------------------------------------------------------------- validation


def _decode_args(**changes):
    q, k_cache, v_cache, tables, ctx = decode_case(torch.float16, 2, [20, 5])
    args = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "block_tables": tables, "context_lens": ctx}
    args.update({k: f(args) for k, f in changes.items()})
    return args


DECODE_ERRORS = {
    "must match the cache dtype": {"q": lambda a: a["q"].bfloat16()},
    "same shape": {"v_cache": lambda a: a["v_cache"][:, :8]},
    "3 dimensions": {"q": lambda a: a["q"][0]},
    "head_dim": {"q": lambda a: a["q"][..., :32]},
    "multiple of num_kv_heads": {"q": lambda a: a["q"][:, :3]},
    "longer than the block table": {"context_lens": lambda a: a["context_lens"] + 60},
    "dtype int32": {"block_tables": lambda a: a["block_tables"].long()},
    "entries for 2 sequences": {"context_lens": lambda a: a["context_lens"][:1]},
    "must be >= 1": {"context_lens": lambda a: a["context_lens"] * 0},
    "same device": {"block_tables": lambda a: a["block_tables"].to("meta")},
}


@pytest.mark.parametrize("message", DECODE_ERRORS)
def test_paged_decode_rejects_bad_input(message):
    with pytest.raises(ValueError, match=message):
        kernels.paged_decode(**_decode_args(**DECODE_ERRORS[message]))


def test_paged_decode_rejects_bad_knobs_and_out():
    args = _decode_args()
    with pytest.raises(ValueError, match="num_splits"):
        kernels.paged_decode(**args, num_splits=0)
    with pytest.raises(ValueError, match="block_n"):
        kernels.paged_decode(**args, block_n=24)
    with pytest.raises(ValueError, match="out must be"):
        kernels.paged_decode(**args, out=args["q"][:1])


def _prefill_args(**changes):
    q, k_cache, v_cache, tables, cu, ctx = prefill_case(torch.bfloat16, 2, [6, 3], [4, 0])
    args = {"q": q, "k_cache": k_cache, "v_cache": v_cache, "block_tables": tables, "cu_seqlens_q": cu,
            "context_lens": ctx}
    args.update({k: f(args) for k, f in changes.items()})
    return args


PREFILL_ERRORS = {
    "must match the cache dtype": {"q": lambda a: a["q"].float()},
    "multiple of num_kv_heads": {"q": lambda a: a["q"][:, :3]},
    "end at total_q_tokens": {"cu_seqlens_q": lambda a: a["cu_seqlens_q"] - 1},
    "non-decreasing": {"cu_seqlens_q": lambda a: torch.tensor([0, 10, 9], dtype=torch.int32, device=DEVICE)},
    "already be in the cache": {"context_lens": lambda a: a["context_lens"] - 3},
    "longer than the block table": {"context_lens": lambda a: a["context_lens"] + 100},
    "dtype int32": {"cu_seqlens_q": lambda a: a["cu_seqlens_q"].long()},
    "same device": {"cu_seqlens_q": lambda a: a["cu_seqlens_q"].to("meta")},
}


@pytest.mark.parametrize("message", PREFILL_ERRORS)
def test_paged_prefill_rejects_bad_input(message):
    with pytest.raises(ValueError, match=message):
        kernels.paged_prefill(**_prefill_args(**PREFILL_ERRORS[message]))


WRITE_ERRORS = {
    "slot_mapping values": lambda k, v, kc, vc, s: (k, v, kc, vc, s + 200),
    "slot_mapping values must be -1": lambda k, v, kc, vc, s: (k, v, kc, vc, s - 5),
    "dtype int64": lambda k, v, kc, vc, s: (k, v, kc, vc, s.int()),
    "share one dtype": lambda k, v, kc, vc, s: (k.half(), v.half(), kc, vc, s),
    "num_kv_heads=2": lambda k, v, kc, vc, s: (k[:, :1], v[:, :1], kc, vc, s),
    "same shape": lambda k, v, kc, vc, s: (k, v[:2], kc, vc, s),
    "entries for 4 tokens": lambda k, v, kc, vc, s: (k, v, kc, vc, s[:3]),
    "same device": lambda k, v, kc, vc, s: (k, v, kc, vc, s.to("meta")),
}


@pytest.mark.parametrize("message", WRITE_ERRORS)
def test_write_kv_rejects_bad_input(message):
    k_cache, v_cache = make_cache(4, 16, 2, 32, torch.float32)
    k, v = rand((4, 2, 32), torch.float32, 1), rand((4, 2, 32), torch.float32, 2)
    slots = torch.tensor([0, 5, -1, 63], device=DEVICE)
    with pytest.raises(ValueError, match=message):
        kernels.write_kv(*WRITE_ERRORS[message](k, v, k_cache, v_cache, slots))


@pytest.mark.skipif(DEVICE != "cpu", reason="CPU tensors only fail without the interpreter")
def test_cpu_tensors_need_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="need a CUDA"):
        kernels.paged_decode(**_decode_args())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit path")
def test_bench_exits_2_without_a_gpu():
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, "bench/kernels.py", "--quick"], cwd=root, capture_output=True, text=True)
    assert run.returncode == 2 and "needs a CUDA GPU" in run.stderr


# ---------------------------------------------------------------- GPU only: serving-sized shapes


@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_splits", [None, 1, 16])
def test_gpu_paged_decode_large(dtype, num_splits):
    lens = torch.randint(1, 3000, (24,), generator=torch.Generator().manual_seed(0)).tolist()
    q, k_cache, v_cache, tables, ctx = decode_case(dtype, 4, lens, num_kv_heads=8, head_dim=128)
    out = poisoned(q)
    kernels.paged_decode(q, k_cache, v_cache, tables, ctx, out=out, num_splits=num_splits)
    assert_close(out, paged_decode_ref(q, k_cache, v_cache, tables, ctx))


@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_paged_prefill_large(dtype, head_dim):
    q_lens, earlier = [1024, 300, 1, 77], [2048, 0, 900, 5]
    q, k_cache, v_cache, tables, cu, ctx = prefill_case(dtype, 4, q_lens, earlier, num_kv_heads=8, head_dim=head_dim)
    out = poisoned(q)
    kernels.paged_prefill(q, k_cache, v_cache, tables, cu, ctx, out=out)
    assert_close(out, paged_prefill_ref(q, k_cache, v_cache, tables, cu, ctx))


@needs_cuda
def test_gpu_write_kv_large():
    k_cache, v_cache = make_cache(4096, 16, 8, 128, torch.bfloat16)
    slots = torch.randperm(4096 * 16, device=DEVICE)[:8192]
    slots[::7] = -1
    k, v = rand((8192, 8, 128), torch.bfloat16, 1), rand((8192, 8, 128), torch.bfloat16, 2)
    k_ref, v_ref = write_kv_ref(k, v, k_cache, v_cache, slots)
    kernels.write_kv(k, v, k_cache, v_cache, slots)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
