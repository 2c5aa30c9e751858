"""Measured board power (issue 50): the import (calibrate/aic_import.py), the busy-power curve
(sim/features/energy/measured.py) and an iteration's energy priced from it, each by hand."""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from calibrate.aic_import import POWER_COLUMNS, Source, _power
from sim.config.errors import ScenarioError
from sim.features.energy.measured import BusyPower, curve, shipped, utilisation
from sim.features.energy.power import EnergyConfig, parse_energy, run_energy
from sim.presets.hardware import HARDWARE_PRESETS
from sim.scenario import load_scenario
from sim.simulate import simulate

ROOT = Path(__file__).resolve().parents[2]
B200 = ROOT / "sim/tables/b200_sxm"


def test_the_imported_rows_read_back_as_measured():
    """Two rows of the wheel's B200 tables (aiconfigurator-core 0.12.0, vLLM 0.22.0), copied here by
    hand from the parquet files, are in power.csv with their latency and power (to the 9 digits
    the CSV keeps); its hash and row count are provenance.yaml's."""
    rows = pd.read_csv(B200 / "power.csv")
    moe = rows[(rows["op"] == "moe") & (rows["dtype"] == "bfloat16") & (rows["num_tokens"] == 4096)
               & (rows["hidden_size"] == 6144) & (rows["inter_size"] == 2048) & (rows["topk"] == 8)
               & (rows["num_experts"] == 256) & (rows["tp"] == 1)]
    assert len(moe) == 1
    assert moe["latency_ms"].iloc[0] == pytest.approx(4.507413, rel=1e-6)
    assert moe["power_w"].iloc[0] == pytest.approx(990.180727, rel=1e-9)
    gen = rows[(rows["op"] == "generation_attention") & (rows["batch_size"] == 32) & (rows["isl"] == 1)
               & (rows["step"] == 32767) & (rows["num_heads"] == 32) & (rows["num_kv_heads"] == 8)
               & (rows["head_dim"] == 64) & (rows["dtype"] == "bfloat16")]
    assert len(gen) == 1
    assert gen["latency_ms"].iloc[0] == pytest.approx(0.30557, rel=1e-5)
    assert gen["power_w"].iloc[0] == pytest.approx(646.528222, rel=1e-9)
    assert rows["latency_ms"].min() >= 0.3 and list(rows.columns) == POWER_COLUMNS
    prov = yaml.safe_load((B200 / "provenance.yaml").read_text())["power"]
    assert prov["rows"] == len(rows) == 9725
    assert hashlib.sha256((B200 / "power.csv").read_bytes()).hexdigest() == prov["csv_sha256"]
    assert [s["framework_version"] for s in prov["sources"]] == ["VLLM 0.22.0"] * 3


def test_the_importer_keeps_long_unwindowed_balanced_kernels(tmp_path):
    """An unpacked wheel of two tables with power: a 0.1-ms kernel, a windowed one and an
    expert-parallel MoE row are left out; what stays is written as measured."""
    data = tmp_path / "aiconfigurator_core/systems/data/b200_sxm"
    attn = data / "attention/vllm/0.22.0"
    attn.mkdir(parents=True)
    base = {"framework": "VLLM", "version": "0.22.0", "device": "NVIDIA B200", "op_name": "context_attention",
            "kernel_source": "k", "batch_size": 2, "isl": 4096, "num_heads": 32, "num_key_value_heads": 8,
            "head_dim": 128, "kv_cache_dtype": "bfloat16", "step": 0, "power_limit": 1000.0}
    pd.DataFrame([{**base, "window_size": 0, "latency": 0.1, "power": 400.0},
                  {**base, "window_size": 128, "latency": 2.0, "power": 800.0},
                  {**base, "window_size": 0, "latency": 2.5, "power": 850.5}]).to_parquet(
        attn / "context_attention_perf.parquet")
    moe = data / "moe/vllm/0.22.0"
    moe.mkdir(parents=True)
    m = {"framework": "VLLM", "version": "0.22.0", "device": "NVIDIA B200", "op_name": "moe",
         "kernel_source": "fused", "moe_dtype": "fp8", "num_tokens": 512, "hidden_size": 4096,
         "inter_size": 1024, "topk": 2, "num_experts": 8, "moe_tp_size": 2, "distribution": "balanced",
         "latency": 0.5, "power_limit": 1000.0}
    pd.DataFrame([{**m, "moe_ep_size": 1, "power": 700.25}, {**m, "moe_ep_size": 2, "power": 600.0}]).to_parquet(
        moe / "moe_perf.parquet")
    rows, paths = _power(Source(tmp_path), "b200_sxm")
    assert len(paths) == 2 and len(rows) == 2
    a, b = rows.to_dict("records")
    assert (a["op"], a["dtype"], a["isl"], a["num_kv_heads"], a["latency_ms"], a["power_w"]) == (
        "context_attention", "bfloat16", 4096, 8, 2.5, 850.5)
    assert (b["op"], b["dtype"], b["num_tokens"], b["tp"], b["latency_ms"], b["power_w"]) == (
        "moe", "fp8", 512, 2, 0.5, 700.25)


def _gen(kv_len: int, watts: float) -> dict:
    # one decode attention kernel of 1 ms reading 2 x kv_len x 128 x 2 bytes (1 KV head, bf16)
    return {"op": "generation_attention", "dtype": "bfloat16", "batch_size": 1, "isl": kv_len, "step": 0,
            "num_heads": 1, "num_kv_heads": 1, "head_dim": 128, "latency_ms": 1.0, "power_w": watts}


def test_the_busy_power_curve_by_hand():
    # at 8e12 B/s a 1-ms kernel moving kv_len x 512 bytes is at u = kv_len x 6.4e-8: 0.1, 0.5, 0.8
    rows = pd.DataFrame([_gen(1_562_500, 500.0)] * 20 + [_gen(7_812_500, w) for w in (900.0, 800.0) * 10]
                        + [_gen(12_500_000, 750.0)] * 20 + [_gen(15_000_000, 999.0)] * 19)
    u = utilisation(rows, 2.25e15, 8e12)
    assert u[0] == pytest.approx(0.1) and u[20] == pytest.approx(0.5) and u[40] == pytest.approx(0.8)
    c = curve(rows, 2.25e15, 8e12, "by hand")
    # bins of 20 rows or more: medians 500, 850, 750; non-decreasing: 850 and 750 pool to 800; the
    # 19 rows at u 0.96 are too few for a bin of their own
    assert c.u == pytest.approx((0.1, 0.5, 0.8)) and c.watts == pytest.approx((500.0, 800.0, 800.0))
    assert c.rows == 60
    assert c(np.array([0.0, 0.3, 0.65, 1.0])) == pytest.approx([500.0, 650.0, 800.0, 800.0])


def test_a_run_priced_on_a_measured_curve_by_hand():
    """Two steps.csv rows on one GPU in a 2-s run (0.5 s idle): 2.5e10 bytes of weights read per
    iteration at 1e11 B/s, no FLOPs counted; the curve (0.1, 500 W) to (0.5, 900 W); idle 100 W."""
    steps = pd.DataFrame({"replica": [0, 0], "start_s": [0.0, 1.0], "duration_s": [1.0, 0.5], "count": [2, 1],
                          "prefill_tokens": [0, 0], "decode_tokens": [0, 0], "num_seqs": [4, 1]})
    hw = HARDWARE_PRESETS["b200"]
    busy = BusyPower((0.1, 0.5), (500.0, 900.0), 40, "by hand")
    e = run_energy(steps, 2.0, 1, 1, 0.0, 2.5e10, 1e15, 1e11, hw,
                   EnergyConfig(pue=1.0, host_w_per_gpu=0.0, idle_w=100.0, tdp_w=1000.0), 3, 1, busy=busy)
    # row 1: 2 iterations x 2.5e10 / (1 s x 1e11) = u 0.5 -> 900 W for 1 s; row 2: 2.5e10 / (0.5 s x 1e11)
    # = 0.5 too; then 0.5 s idle
    assert e["power_source"] == "measured"
    assert e["gpu_j"] == pytest.approx(900.0 * 1.0 + 900.0 * 0.5 + 100.0 * 0.5)
    steps2 = steps.assign(count=[1, 1])  # row 1 now one iteration: u 0.25 -> 500 + 400 x 0.15 / 0.4 = 650 W
    e = run_energy(steps2, 2.0, 1, 1, 0.0, 2.5e10, 1e15, 1e11, hw,
                   EnergyConfig(pue=1.0, host_w_per_gpu=0.0, idle_w=100.0, tdp_w=1000.0), 3, 1, busy=busy)
    assert e["gpu_j"] == pytest.approx(650.0 * 1.0 + 900.0 * 0.5 + 100.0 * 0.5)
    # the stated model on the same rows: idle + 900 W x u
    e = run_energy(steps2, 2.0, 1, 1, 0.0, 2.5e10, 1e15, 1e11, hw,
                   EnergyConfig(pue=1.0, host_w_per_gpu=0.0, idle_w=100.0, tdp_w=1000.0), 3, 1)
    assert e["power_source"] == "modelled"
    assert e["gpu_j"] == pytest.approx((100 + 900 * 0.25) * 1.0 + (100 + 900 * 0.5) * 0.5 + 100.0 * 0.5)


def test_a_b200_run_is_priced_measured_and_others_stated():
    curve_b200 = shipped(HARDWARE_PRESETS["b200"])
    assert curve_b200 is not None and curve_b200.rows > 9000
    assert list(curve_b200.watts) == sorted(curve_b200.watts) and 500 < curve_b200.watts[0] < curve_b200.watts[-1] < 1000
    assert shipped(HARDWARE_PRESETS["h100-sxm"]) is None
    quick = str(ROOT / "scenarios/quickstart.yaml")
    e = simulate(load_scenario(quick, overrides=["hardware=b200", "workload.num_requests=50"])).summary["energy"]
    assert e["power_source"] == "measured" and "power.csv" in e["source"]
    stated = simulate(load_scenario(quick, overrides=["hardware=b200", "workload.num_requests=50",
                                                      "energy.power_model=stated"])).summary["energy"]
    assert stated["power_source"] == "modelled" and stated["gpu_j"] < e["gpu_j"]
    h100 = simulate(load_scenario(quick, overrides=["workload.num_requests=50"])).summary["energy"]
    assert h100["power_source"] == "modelled"


def test_power_model_takes_auto_or_stated():
    assert parse_energy({"power_model": "stated"}, "energy").power_model == "stated"
    with pytest.raises(ScenarioError, match=r"energy.power_model: .*auto.*stated"):
        parse_energy({"power_model": "meter"}, "energy")
