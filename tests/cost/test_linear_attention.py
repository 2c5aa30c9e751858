"""A hybrid model's iteration cost (sim/cost/linear_attention.py, the composer's GDN shapes): the
measured Gated DeltaNet kernels read off the shipped table by hand, the stated roofline by hand, and
which of the two a scenario says it used."""
from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.cost.batch import BatchStats
from sim.cost.composer import SYSTEMS, TABLES, KernelTables, StepComposer
from sim.cost.linear_attention import LinearAttentionCost, MeasuredKernels, RooflineKernels, kernels_for
from sim.cost.step_cost import UnitCost
from sim.presets.hardware import HARDWARE_PRESETS
from sim.presets.memory import linear_state_bytes
from sim.presets.models import MODEL_PRESETS, model_from_hf_config
from sim.scenario import scenario_from_dict

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs"
H100 = HARDWARE_PRESETS["h100-sxm"]
QN = MODEL_PRESETS["qwen3-next-80b-a3b"]


@pytest.fixture(scope="module")
def q35():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (its vision encoder is not counted: said elsewhere)
        return model_from_hf_config(FIXTURES / "Qwen--Qwen3.5-35B-A3B.json", name="qwen3.5-35b-a3b")


@pytest.fixture(scope="module")
def gdn():
    return pd.read_csv(TABLES / SYSTEMS["h100-sxm"] / "gdn.csv")


def _ms(table, kernel, nk, nv, batch, seq_len=1):
    rows = table[(table["kernel"] == kernel) & (table["num_k_heads"] == nk) & (table["num_v_heads"] == nv)
                 & (table["batch_size"] == batch) & (table["seq_len"] == seq_len)]
    assert len(rows) == 1
    return float(rows["latency_ms"].iloc[0])


def test_measured_kernels_are_the_tables_rows(gdn):
    """At TP2 Qwen3-Next runs 8 key / 16 value heads a GPU: 16 decodes cost the conv update and the
    recurrent step measured at batch 16; four 2,048-token chunks the conv and the chunked rule at
    (4, 2048). (The chunked rule's timings are noisy: 50 of its 112 points here sit off a monotone
    surface and are smoothed, as the composer smooths every table; (4, 2048) is not moved.)"""
    k = MeasuredKernels(gdn, QN, 2)
    decode = _ms(gdn, "causal_conv1d_update", 8, 16, 16) + _ms(gdn, "fused_recurrent_gated_delta_rule_packed_decode",
                                                                8, 16, 16)
    prefill = _ms(gdn, "causal_conv1d_fn", 8, 16, 4, 2048) + _ms(gdn, "chunk_gated_delta_rule_flashinfer", 8, 16, 4, 2048)
    assert k.decode_s(16) == pytest.approx(decode / 1e3, rel=1e-12)
    assert k.prefill_s(4, 4 * 2048) == pytest.approx(prefill / 1e3, rel=1e-12)
    # linear in between: 24 decodes halfway from 16 to 32
    mid = (k.decode_s(16) + k.decode_s(32)) / 2
    assert k.decode_s(24) == pytest.approx(mid, rel=1e-12)
    with pytest.raises(ValueError, match="no Gated DeltaNet rows for 3 key / 5 value heads"):
        MeasuredKernels(gdn, replace(QN, linear_attention=replace(QN.linear_attention, num_key_heads=3,
                                                                 num_value_heads=5)), 1)


def test_the_wrapper_adds_every_linear_layer_to_the_inner_step(gdn):
    """On the unit model (1 s an iteration) a step of 16 decodes and two 512-token chunks takes
    1 + 36 x (decode kernels at 16 + prefill kernels at (2, 512))."""
    k = MeasuredKernels(gdn, QN, 2)
    cost = LinearAttentionCost(UnitCost(), k, 36)
    stats = BatchStats(prefill_lens=np.array([512, 512]), prefill_contexts=np.array([0, 4096]),
                       num_decodes=16, decode_context_sum=16 * 900)
    expect = 1.0 + 36 * (k.decode_s(16) + k.prefill_s(2, 1024))
    assert cost.step_time(stats) == pytest.approx(expect, rel=1e-12)
    run = BatchStats(num_decodes=16, decode_context_sum=16 * 900)
    assert cost.step_times(run, 5).tolist() == pytest.approx([1.0 + 36 * k.decode_s(16)] * 5, rel=1e-12)
    assert cost.decode_line(run) is None


def test_the_stated_roofline_by_hand():
    """MI355X (8 TB/s, 2.5 PFLOP/s bf16) at TP1: a decode reads and writes its 1,097,728-byte state
    per layer at 85% of HBM; a prefill token costs max(32 heads x (6 x 128 x 128 + 2 x 64 x 256) FLOPs
    at 70% of the peak, (2 x state / 64 + 8,192 x 2) bytes at 85% of HBM)."""
    mi = HARDWARE_PRESETS["mi355x"]
    k = RooflineKernels(QN, mi, 1)
    assert linear_state_bytes(QN, 1) == 1_097_728
    assert k.decode_s(10) == pytest.approx(10 * 2 * 1_097_728 / (8e12 * 0.85), rel=1e-12)
    flops = 32 * (6 * 128 * 128 + 2 * 64 * 256) / (2.5e15 * 0.7)
    read = (2 * 1_097_728 / 64 + 8192 * 2) / (8e12 * 0.85)
    assert k.prefill_s(3, 3000) == pytest.approx(3000 * max(flops, read), rel=1e-12)
    kernels, why = kernels_for(QN, mi, 1)
    assert isinstance(kernels, RooflineKernels) and "no kernel tables for mi355x" in why
    kernels, why = kernels_for(QN, H100, 2)
    assert isinstance(kernels, MeasuredKernels) and why is None


def test_the_composer_prices_attention_in_the_attention_layers_only(q35):
    """Qwen3.5-35B-A3B at TP2: gated q (8 heads + 8 of gate) and 1 KV head of 256 in 10 layers; the
    30 GDN layers' in_proj_qkvz (2 x 2048 + 2 x 4096) / 2, in_proj_ba 64 / 2, out_proj 4096 / 2 -> 2048."""
    tables = KernelTables.load(TABLES / SYSTEMS["h100-sxm"], H100.hbm_bandwidth)
    c = StepComposer(tables, q35, 2)
    shapes = {s.name: (s.n, s.k, s.layers) for s in c.shapes}
    assert shapes["qkv"] == ((8 + 8 + 2) * 256, 2048, 10) and shapes["o"] == (2048, 8 * 256, 10)
    assert shapes["gdn_qkvz"] == (6144, 2048, 30) and shapes["gdn_ba"] == (32, 2048, 30)
    assert shapes["gdn_out"] == (2048, 2048, 30)
    stats = BatchStats(prefill_lens=np.array([1000]), prefill_contexts=np.array([0]), num_decodes=8,
                       decode_context_sum=8 * 2000)
    t = c.terms(stats)
    assert t["decode_attention"] == pytest.approx(10 * c.decode_attention_ms(8, 8 * 2000), rel=1e-12)
    assert t["prefill_attention"] == pytest.approx(10 * c.prefill_attention_ms([1000], [0]), rel=1e-12)
    assert t["allreduce"] == pytest.approx(2 * 40 * c.allreduce_ms(1008), rel=1e-12)


def test_a_scenario_says_what_priced_its_linear_layers(q35):
    one = {"arrival": {"process": "burst"}, "num_requests": 1, "prompt_tokens": {"dist": "fixed", "value": 8},
           "output_tokens": {"dist": "fixed", "value": 2}}
    raw = {"model": {"hf_config": str(FIXTURES / "Qwen--Qwen3.5-35B-A3B.json")}, "hardware": "h100-sxm",
           "engine": {"tensor_parallel_size": 2}, "workload": one}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sc = scenario_from_dict(raw)
        mi = scenario_from_dict({**raw, "hardware": "mi355x"})
    assert sc.cost_model.name == "measured"  # its experts (2048, 512, top-8 of 256) are measured too
    assert sc.cost_model.notice.startswith("30 Gated DeltaNet layers' kernels measured (vLLM 0.24, AIConfigurator "
                                           "tables, 8 key / 16 value heads per GPU); prefix caching off")
    assert mi.cost_model.name == "roofline" and "30 Gated DeltaNet layers' kernels estimated" in mi.cost_model.notice
    # and the iteration includes them: a decode of one sequence is dearer than the same model
    # priced without its linear layers' kernels
    built = sc.cost_model.build(sc.model, sc.hardware, 2)
    assert isinstance(built, LinearAttentionCost)
    one_decode = BatchStats(num_decodes=1, decode_context_sum=100)
    assert built.step_time(one_decode) - built.inner.step_time(one_decode) == pytest.approx(
        30 * built.kernels.decode_s(1), rel=1e-12)
