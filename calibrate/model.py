"""One engine iteration of a Llama-style decoder over a paged KV cache, with random weights.

CONTRACT (owned by the calibration engineer; calibrate/engine.py codes against it):
    SeqChunk(token_ids, context_len, block_table, sample)
    ModelStep(model, *, device="cpu", dtype=None, num_blocks, block_size=16, seed=0, attention=None)
        .run(chunks, timer=None) -> list[int | None]   greedy next token per chunk (None unless
                                                       sample); returns after the device is done
        .logits(chunks, timer=None) -> Tensor [len(chunks), vocab]   float32, chunk order
    batch_stats(chunks) -> sim.cost.batch.BatchStats          what the simulator would charge for
    synthetic_chunks(prefill_lens, prefill_contexts, decode_contexts, ...) -> list[SeqChunk]

One `run` is one ragged, unpadded batch: prefill chunks (possibly after earlier context) and decodes
(chunks of one token), like vLLM v1's flattened batch. Per layer: RMSNorm, fused QKV projection,
rotary positions, `write_kv` of the new K/V into the cache, attention (`paged_decode` for one-token
chunks after context, `paged_prefill` for the rest), output projection, RMSNorm, SwiGLU MLP. Then the final norm
and lm_head on the last token of every chunk (vLLM v1 computes logits for partial prefills too and
drops them), and greedy argmax.

Backends: ``attention="triton"`` (default on CUDA) runs the kernels in kernels/; ``"torch"``
(default on CPU, where Triton does not compile) gathers each sequence's pages and calls
``scaled_dot_product_attention`` (kernels/reference.py's ``gather_kv``). Triton on the CPU runs in
Triton's interpreter: correct but far too slow to time. Default dtype: bfloat16 on CUDA, float32 on
the CPU. One device only: tensor parallelism is out of scope.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch
import torch.nn.functional as F

from sim.cost.batch import BatchStats
from sim.presets.models import ModelSpec

ROPE_THETA = 10000.0  # Llama-2's; Llama-3 uses 500000. Costs the same; only the values differ.
NORM_EPS = 1e-5
ATTENTION_BACKENDS = ("triton", "torch")
_NO_TIMER = contextlib.nullcontext()


@dataclass
class SeqChunk:
    token_ids: list[int]      # the tokens this iteration feeds: a prefill chunk, or 1 for a decode
    context_len: int          # tokens of this sequence already in the KV cache before this chunk
    block_table: list[int]    # physical block ids covering context_len + len(token_ids) tokens
    sample: bool              # True -> return the next token (last prefill chunk, or a decode)


def batch_stats(chunks: list[SeqChunk]) -> BatchStats:
    """The simulator's view of a batch: one-token chunks with context count as decodes (their
    context includes the new token, as in sim/), everything else as prefill chunks."""
    dec = [c.context_len + 1 for c in chunks if _is_decode(c)]
    pre = [c for c in chunks if not _is_decode(c)]
    return BatchStats(prefill_lens=np.array([len(c.token_ids) for c in pre], dtype=np.int64),
                      prefill_contexts=np.array([c.context_len for c in pre], dtype=np.int64),
                      num_decodes=len(dec), decode_context_sum=int(sum(dec)))


def _is_decode(c: SeqChunk) -> bool:
    return len(c.token_ids) == 1 and c.context_len > 0


def blocks_needed(lens_and_contexts: list[tuple[int, int]], block_size: int) -> int:
    """Cache blocks for sequences holding (new tokens, earlier context) each."""
    return sum(-(-(n + ctx) // block_size) for n, ctx in lens_and_contexts)


def synthetic_chunks(prefill_lens: list[int], prefill_contexts: list[int],
                     decode_contexts: list[int], *, vocab_size: int, block_size: int,
                     num_blocks: int, seed: int = 0) -> list[SeqChunk]:
    """A batch of the given shape: prefill chunks (after their earlier context) and decodes (each
    with `context` tokens cached before its new one). Random token ids; each sequence gets its own
    blocks, scattered over the cache like a server's after churn. Raises ValueError if the blocks
    do not fit in `num_blocks`."""
    rng = np.random.default_rng(seed)
    shape = [(n, c) for n, c in zip(prefill_lens, prefill_contexts, strict=True)]
    shape += [(1, c) for c in decode_contexts]
    need = blocks_needed(shape, block_size)
    if need > num_blocks:
        raise ValueError(f"batch needs {need} KV blocks of {block_size} tokens, cache has {num_blocks}")
    pages = rng.permutation(num_blocks)
    chunks, used = [], 0
    for n, ctx in shape:
        nb = -(-(n + ctx) // block_size)
        chunks.append(SeqChunk(token_ids=rng.integers(0, vocab_size, n).tolist(), context_len=ctx,
                               block_table=pages[used:used + nb].tolist(),
                               sample=True))
        used += nb
    return chunks


class ModelStep:
    """A Llama-style decoder with seeded random weights and a paged KV cache of `num_blocks`
    blocks x `block_size` tokens per layer. `run(chunks)` is one engine iteration."""

    def __init__(self, model: ModelSpec, *, device: str = "cpu", dtype=None, num_blocks: int,
                 block_size: int = 16, seed: int = 0, attention: str | None = None):
        self.spec, self.device = model, torch.device(device)
        cuda = self.device.type == "cuda"
        self.dtype = dtype or (torch.bfloat16 if cuda else torch.float32)
        self.attention = attention or ("triton" if cuda else "torch")
        if self.attention not in ATTENTION_BACKENDS:
            raise ValueError(f"attention {self.attention!r}; allowed: {', '.join(ATTENTION_BACKENDS)}")
        # Imported here: `kernels` imports triton, and on a machine without CUDA switches it to
        # its interpreter; the engine imports this module without needing either.
        if self.attention == "triton":
            import kernels
            self._k = kernels
        else:
            from kernels.reference import gather_kv
            self._gather = gather_kv
        self.block_size, self.num_blocks = block_size, num_blocks
        m = model
        self.scale = m.head_dim ** -0.5
        gen = torch.Generator(device=self.device).manual_seed(seed)

        def rand(*shape, std):  # normal(0, std), generated on the device in the model dtype
            return torch.randn(shape, generator=gen, device=self.device, dtype=self.dtype).mul_(std)

        h, qkv_out = m.hidden_size, m.q_dim + 2 * m.kv_dim
        ones = torch.ones(h, device=self.device, dtype=self.dtype)
        # Linear weights are [out, in] (F.linear); std 1/sqrt(in) keeps activations near unit scale.
        self.embed = rand(m.vocab_size, h, std=1.0)                      # [vocab, hidden]
        self.layers = [{
            "norm_in": ones, "norm_post": ones,
            "qkv": rand(qkv_out, h, std=h ** -0.5),                       # [q + k + v, hidden]
            "qkv_bias": rand(qkv_out, std=0.02) if m.attention_bias else None,
            "o": rand(h, m.q_dim, std=m.q_dim ** -0.5),                   # [hidden, q]
            "gate_up": rand(2 * m.intermediate_size, h, std=h ** -0.5),   # [2 x inter, hidden]
            "down": rand(h, m.intermediate_size, std=m.intermediate_size ** -0.5),
        } for _ in range(m.num_layers)]
        self.norm_final = ones
        self.lm_head = self.embed if m.tie_word_embeddings else rand(m.vocab_size, h, std=h ** -0.5)
        half = m.head_dim // 2
        self.inv_freq = ROPE_THETA ** (-torch.arange(half, device=self.device, dtype=torch.float32) / half)
        # Caches: [layers, num_blocks, block_size, kv_heads, head_dim], random so that nothing is
        # timed on zeros (a real server's free blocks hold stale values too).
        cache_shape = (m.num_layers, num_blocks, block_size, m.num_kv_heads, m.head_dim)
        self.k_cache = rand(*cache_shape, std=1.0)
        self.v_cache = rand(*cache_shape, std=1.0)

    # -- public -------------------------------------------------------------------------------
    def run(self, chunks: list[SeqChunk], timer=None) -> list[int | None]:
        """One iteration; returns the greedy next token of each chunk that samples, else None.
        Returns after the device has finished (reading the tokens back synchronises)."""
        if not chunks:
            return []
        tokens = self.logits(chunks, timer).argmax(dim=-1).tolist()
        return [t if c.sample else None for t, c in zip(tokens, chunks, strict=True)]

    @torch.inference_mode()
    def logits(self, chunks: list[SeqChunk], timer=None) -> torch.Tensor:
        """Float32 logits of the last token of each chunk: [len(chunks), vocab], chunk order.
        `timer(name)` (optional) returns a context manager wrapped around the GEMMs ("gemm"),
        the cache writes ("kv_write") and attention ("attn_decode", "attn_prefill")."""
        sec = timer or (lambda name: _NO_TIMER)
        b = self._prepare(chunks)
        m = self.spec
        x = F.embedding(b.token_ids, self.embed)                          # [T, hidden]
        cos, sin = self._rotary(b.positions)
        nd = b.num_decode_tokens
        for i, w in enumerate(self.layers):
            h = _rms_norm(x, w["norm_in"])
            with sec("gemm"):
                qkv = F.linear(h, w["qkv"], w["qkv_bias"])                # [T, q + k + v]
            qk = qkv[:, :m.q_dim + m.kv_dim].unflatten(1, (-1, m.head_dim))
            qk = _rope(qk, cos, sin)                                      # [T, heads + kv_heads, hd]
            q, k = qk[:, :m.num_attention_heads], qk[:, m.num_attention_heads:]
            v = qkv[:, m.q_dim + m.kv_dim:].unflatten(1, (-1, m.head_dim))
            kc, vc = self.k_cache[i], self.v_cache[i]
            with sec("kv_write"):
                self._write_kv(k, v, kc, vc, b.slot_mapping)
            attn = torch.empty_like(q)                                    # [T, heads, hd]
            if nd:
                with sec("attn_decode"):
                    self._decode(q[:nd], kc, vc, b, attn[:nd])
            if nd < q.shape[0]:
                with sec("attn_prefill"):
                    self._prefill(q[nd:], kc, vc, b, attn[nd:])
            with sec("gemm"):
                o = F.linear(attn.flatten(1), w["o"])
            x = x + o
            h = _rms_norm(x, w["norm_post"])
            with sec("gemm"):
                gate, up = F.linear(h, w["gate_up"]).chunk(2, dim=-1)
            act = F.silu(gate) * up
            with sec("gemm"):
                down = F.linear(act, w["down"])
            x = x + down
        h = _rms_norm(x[b.last_token], self.norm_final)                   # [seqs, hidden]
        with sec("gemm"):
            logits = F.linear(h, self.lm_head)                            # [seqs, vocab]
        return logits.float()[b.chunk_of_row]

    # -- internals ----------------------------------------------------------------------------
    def _prepare(self, chunks: list[SeqChunk]) -> _Batch:
        return _Batch(chunks, self.block_size, self.device)

    def _rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]      # [T, hd / 2]
        return freqs.cos().to(self.dtype)[:, None], freqs.sin().to(self.dtype)[:, None]

    def _write_kv(self, k, v, kc, vc, slots) -> None:
        if self.attention == "triton":
            self._k.write_kv(k, v, kc, vc, slots, check_slots=False)
        else:
            kc.view(-1, *kc.shape[2:])[slots] = k
            vc.view(-1, *vc.shape[2:])[slots] = v

    def _decode(self, q, kc, vc, b: _Batch, out) -> None:
        if self.attention == "triton":
            self._k.paged_decode(q, kc, vc, b.dec_tables, b.dec_lens, self.scale, out=out,
                                 max_context_len=b.dec_max_len)
            return
        for s in range(q.shape[0]):  # one query over the whole context: no mask
            out[s] = self._sdpa(q[s:s + 1], kc, vc, b.dec_tables[s], int(b.dec_lens_host[s]), None)[0]

    def _prefill(self, q, kc, vc, b: _Batch, out) -> None:
        if self.attention == "triton":
            self._k.paged_prefill(q, kc, vc, b.pre_tables, b.pre_cu, b.pre_lens, self.scale,
                                  out=out, max_seqlen_q=b.pre_max_q, max_context_len=b.pre_max_len)
            return
        cu, lens = b.pre_cu_host, b.pre_lens_host
        for s in range(len(lens)):
            a, e, total = int(cu[s]), int(cu[s + 1]), int(lens[s])
            # query t of the chunk sits at position total - (e - a) + t and sees keys 0..position
            visible = (torch.arange(total, device=q.device)[None, :]
                       <= torch.arange(total - (e - a), total, device=q.device)[:, None])
            out[a:e] = self._sdpa(q[a:e], kc, vc, b.pre_tables[s], total, visible)

    def _sdpa(self, q, kc, vc, table, length: int, mask) -> torch.Tensor:
        """q: [n, heads, hd] against the first `length` cached tokens of one sequence."""
        k = self._gather(kc, table, length).transpose(0, 1)[None]    # [1, kv_heads, length, hd]
        v = self._gather(vc, table, length).transpose(0, 1)[None]
        out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k, v, attn_mask=mask,
                                             enable_gqa=True)
        return out[0].transpose(0, 1)                                 # [n, heads, hd]


class _Batch:
    """Device-side metadata of one iteration, built on the host (vectorised: a few ms for 256
    sequences of 2k tokens) and copied in two transfers. Rows are reordered: decodes first, then
    prefill chunks (`chunk_of_row` maps them back to chunk order)."""

    def __init__(self, chunks: list[SeqChunk], block_size: int, device: torch.device):
        dec = [i for i, c in enumerate(chunks) if _is_decode(c)]
        order = dec + [i for i, c in enumerate(chunks) if not _is_decode(c)]
        seqs = [chunks[i] for i in order]
        n = np.array([len(c.token_ids) for c in seqs], dtype=np.int64)
        if not n.all():
            raise ValueError(f"chunk {order[int(np.argmin(n))]} has no tokens")
        ctx = np.array([c.context_len for c in seqs], dtype=np.int64)
        total, ends = n + ctx, np.cumsum(n)
        num_tokens, nd = int(ends[-1]), len(dec)
        positions = np.arange(num_tokens) - np.repeat(ends - n - ctx, n)
        need = -(-total // block_size)                               # blocks each sequence uses
        have = np.array([len(c.block_table) for c in seqs])
        short = np.flatnonzero(have < need)
        if len(short):
            r = int(short[0])
            raise ValueError(f"chunk {order[r]}: block_table has {have[r]} blocks, needs "
                             f"{need[r]} for {total[r]} tokens")
        width = int(need.max())
        table = np.zeros((len(seqs), width), dtype=np.int64)         # zero-padded rows
        table[np.arange(width) < need[:, None]] = np.fromiter(
            chain.from_iterable(c.block_table[:k] for c, k in zip(seqs, need.tolist())),
            np.int64, int(need.sum()))
        seq_of_tok = np.repeat(np.arange(len(seqs)), n)
        slots = table[seq_of_tok, positions // block_size] * block_size + positions % block_size
        ids = np.fromiter(chain.from_iterable(c.token_ids for c in seqs), np.int64, num_tokens)
        inverse = np.empty(len(order), dtype=np.int64)
        inverse[order] = np.arange(len(order))
        self.num_decode_tokens = nd
        self.dec_lens_host, self.pre_lens_host = total[:nd], total[nd:]
        self.pre_cu_host = np.concatenate([[0], np.cumsum(n[nd:])])
        self.dec_max_len = int(total[:nd].max()) if nd else 0
        self.pre_max_len = int(total[nd:].max()) if nd < len(seqs) else 0
        self.pre_max_q = int(n[nd:].max()) if nd < len(seqs) else 0
        # int64: token ids, slots, last token of each row, row of each chunk
        i64 = _upload([ids, slots, ends - 1, inverse], torch.int64, device)
        self.token_ids, self.slot_mapping, self.last_token, self.chunk_of_row = i64
        # int32: positions, decode lens, prefill cu_seqlens and lens, block tables
        i32 = _upload([positions, self.dec_lens_host, self.pre_cu_host, self.pre_lens_host,
                       table.ravel()], torch.int32, device)
        self.positions, self.dec_lens, self.pre_cu, self.pre_lens, flat = i32
        tables = flat.view(len(seqs), width)
        self.dec_tables, self.pre_tables = tables[:nd], tables[nd:]


def _upload(arrays: list[np.ndarray], dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
    """Copy host arrays to the device in one transfer; returns views of the pieces. Each piece
    starts on a 16-byte boundary, so Triton's pointer-alignment specialisation (and with it the
    compiled kernel variant) does not change with the batch shape."""
    np_dtype = np.int64 if dtype == torch.int64 else np.int32
    align = 16 // np.dtype(np_dtype).itemsize
    sizes = [np.asarray(a).size for a in arrays]
    starts = np.concatenate([[0], np.cumsum([-(-n // align) * align for n in sizes])])
    host = np.zeros(int(starts[-1]), dtype=np_dtype)
    for a, lo, n in zip(arrays, starts, sizes):
        host[lo:lo + n] = np.asarray(a).ravel()
    flat = torch.from_numpy(host).to(device)
    return [flat[lo:lo + n] for lo, n in zip(starts.tolist(), sizes)]


def _rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + NORM_EPS)).to(x.dtype) * weight


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions, Hugging Face Llama layout (rotate the two halves of head_dim)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

