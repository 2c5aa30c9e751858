"""bench/vidur_same_run.py gives Vidur servesim's roofline as Vidur's per-layer profile tables: priced
back the way Vidur prices a batch (operators x layers, ms), they must give the roofline's step."""
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import vidur_same_run as bench  # noqa: E402
from sim.build import cost_model
from sim.cost.batch import BatchStats  # noqa: E402


@pytest.fixture(scope="module")
def tables():
    mlp, att = bench.profiles()
    sc = bench.scenario(10)
    return mlp, att, cost_model(sc), sc.model.num_layers


def test_decode_batches_price_back_to_the_roofline_step(tables):
    mlp, att, cost, layers = tables
    linear = dict(zip(mlp.num_tokens, mlp["time_stats.mlp_up_proj.median"]))
    decode = att[att.prefill_chunk_size == 0].set_index(["batch_size", "kv_cache_size"])
    for b, c in [(1, 0), (8, 1024), (64, 2304), (128, 4096), (128, 7936)]:
        vidur_s = (linear[b] + decode.loc[(b, c), "time_stats.attn_decode.median"]) * layers / 1e3
        want = cost.step_times(BatchStats(num_decodes=b, decode_context_sum=b * c))[0]
        assert vidur_s == pytest.approx(want, rel=1e-12), (b, c)


def test_a_lone_prefill_costs_at_most_127_sequences_more(tables):
    mlp, att, cost, layers = tables
    linear = dict(zip(mlp.num_tokens, mlp["time_stats.mlp_up_proj.median"]))
    prefill = att[att.prefill_chunk_size > 0].set_index(["prefill_chunk_size", "kv_cache_size"])
    # per sequence: 5 us of CPU, and the logits: 2 FLOPs x vocab x hidden at 70% of the H100's
    # 989 TFLOP/s bf16 (Llama-3-8B: 128256 x 4096)
    per_seq = 5e-6 + 2 * 128256 * 4096 / (989e12 * 0.7)
    for p, c in [(32, 0), (512, 1024), (4096, 0), (4096, 4096), (8192, 0)]:
        vidur_s = (linear[p] + prefill.loc[(p, c), "time_stats.attn_prefill.median"]) * layers / 1e3
        want = cost.step_times(BatchStats(prefill_lens=np.array([p]), prefill_contexts=np.array([c])))[0]
        extra = min(p, 128) - 1  # sequences the table counts beyond the prefill's one
        # the CPU term always; the logits term where the GEMMs are compute-bound (weight reads
        # bound a small batch's linear layers, and absorb it)
        assert extra * 5e-6 * (1 - 1e-9) <= vidur_s - want <= extra * per_seq * (1 + 1e-9), (p, c)
        if p >= 4096:
            assert vidur_s - want == pytest.approx(extra * per_seq, rel=1e-6), (p, c)


def test_the_tables_cover_vidurs_columns_and_this_workload(tables):
    mlp, att, _, _ = tables
    assert mlp.num_tokens.max() == bench.MAX_TOKENS == att.prefill_chunk_size.max()
    assert set(att.batch_size) == set(range(1, 129))
    # Vidur filters the rows by the model's shape (its Llama-3-8B: 32 q heads, 8 kv, 4096, 14336)
    assert {tuple(r) for r in mlp[["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size",
                                   "num_tensor_parallel_workers"]].values} == {(32, 8, 4096, 14336, 128256, 1)}
    assert {tuple(r) for r in att[["n_q_head", "n_kv_head", "n_embd", "block_size"]].values} == {(32, 8, 4096, 16)}
    assert not (mlp.filter(like="time_stats") < 0).any().any()
    decode = att[att.prefill_chunk_size == 0]
    assert decode["time_stats.attn_decode.median"].notna().all() and (decode.kv_cache_size < bench.MAX_TOKENS).all()
