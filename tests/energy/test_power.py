"""The energy model (sim/features/energy/power.py) against a run computed by hand."""
from __future__ import annotations

import numpy as np
import pytest

from sim.config.errors import ScenarioError
from sim.presets.models import MODEL_PRESETS
from sim.scenario import scenario_from_dict
from sim.simulate import simulate

TINY = MODEL_PRESETS["tiny"]


def _scenario(energy):
    # one request, 10 prompt tokens, 3 output tokens, every iteration 1 s (unit cost): a prefill
    # iteration (its first token) and two decodes, 3 s in all. The GPU's figures are chosen so that
    # the prefill's compute utilisation is 0.8 and every iteration's memory utilisation 0.5.
    hw = {"name": "custom", "memory_bytes": 80e9, "hbm_bandwidth": 2 * TINY.weight_bytes,
          "bf16_flops": 12.5 * TINY.flops_per_token}
    return scenario_from_dict({
        "name": "e", "model": "tiny", "hardware": hw, "cost_model": "unit",
        "engine": {"scheduler": "chunked", "max_num_seqs": 4, "max_num_batched_tokens": 64, "num_gpu_blocks": 64},
        "workload": {"num_requests": 1, "arrival": {"process": "constant", "rate": 1.0},
                     "prompt_tokens": {"dist": "fixed", "value": 10}, "output_tokens": {"dist": "fixed", "value": 3}},
        "energy": energy})


def test_energy_of_a_run_by_hand():
    run = simulate(_scenario({"tdp_w": 100, "idle_w": 20, "host_w_per_gpu": 10, "pue": 1.5,
                              "usd_per_kwh": 0.2, "gco2_per_kwh": 400}))
    assert run.summary["iterations"] == 3 and run.summary["duration_s"] == 3.0
    e = run.summary["energy"]
    gpu = 1 * (20 + 80 * 0.8) + 2 * (20 + 80 * 0.5)   # J: the prefill at u 0.8, two decodes at 0.5
    host = 10 * 1 * 3.0                                 # W x GPUs x s
    facility = (gpu + host) * 1.5
    assert e["gpu_j"] == pytest.approx(gpu) and e["host_j"] == pytest.approx(host)
    assert e["facility_j"] == pytest.approx(facility) and e["kwh"] == pytest.approx(facility / 3.6e6)
    assert e["gpu_avg_w"] == pytest.approx(gpu / 3) and e["gpu_peak_w"] == pytest.approx(84.0)
    assert e["j_per_output_token"] == pytest.approx(facility / 3) and e["j_per_request"] == pytest.approx(facility)
    assert e["usd"] == pytest.approx(facility / 3.6e6 * 0.2) and e["kgco2"] == pytest.approx(facility / 3.6e6 * 0.4)


def test_an_idle_engine_draws_idle_power():
    """Two requests 10 s apart: between them the GPU idles (unit cost: 3 iterations each)."""
    sc = _scenario({"tdp_w": 100, "idle_w": 20, "host_w_per_gpu": 0, "pue": 1.0})
    from dataclasses import replace

    from sim.workload.generators import Constant
    sc = replace(sc, workload=replace(sc.workload, num_requests=2, arrival=Constant(0.1)))
    run = simulate(sc)
    e = run.summary["energy"]
    busy = 2 * (1 * (20 + 80 * 0.8) + 2 * (20 + 80 * 0.5))
    idle = (run.summary["duration_s"] - 6.0) * 20
    assert run.summary["duration_s"] == 13.0 and e["gpu_j"] == pytest.approx(busy + idle)


def test_bad_energy_settings_name_the_key():
    with pytest.raises(ScenarioError, match=r"energy.pue: 0.5 is under 1"):
        _scenario({"pue": 0.5})
    with pytest.raises(ScenarioError, match=r"energy.idle_w: 200 W is above tdp_w \(100 W\)"):
        _scenario({"idle_w": 200, "tdp_w": 100})
    with pytest.raises(ScenarioError, match=r"energy.kw: unknown key; allowed: pue, host_w_per_gpu"):
        _scenario({"kw": 1})


def test_a_gpu_without_a_board_power_asks_for_one():
    e = simulate(_scenario(None)).summary["energy"]
    assert e == {"source": "not computed: the GPU 'custom' has no preset board power; give energy: {tdp_w: W} "
                           "in the scenario"}


def test_hourly_prices_and_carbon_by_hand():
    """Two requests 3,700 s apart: the first's iterations in hour 0, the second's in hour 1."""
    from dataclasses import replace

    from sim.workload.generators import Constant
    sc = _scenario({"tdp_w": 100, "idle_w": 20, "host_w_per_gpu": 0, "pue": 1.0,
                    "usd_per_kwh": [0.1, 0.3], "gco2_per_kwh": [100, 500, 900]})
    sc = replace(sc, workload=replace(sc.workload, num_requests=2, arrival=Constant(1 / 3700)))
    run = simulate(sc)
    assert run.summary["duration_s"] == pytest.approx(3703.0)
    e = run.summary["energy"]
    per_request = 1 * (20 + 80 * 0.8) + 2 * (20 + 80 * 0.5)
    h0 = (per_request + (3600 - 3) * 20) / 3.6e6   # kWh: its iterations, then idle to the hour's end
    h1 = (per_request + (103 - 3) * 20) / 3.6e6
    assert e["kwh_by_hour"] == pytest.approx([h0, h1])
    assert e["kwh"] == pytest.approx(h0 + h1)
    assert e["usd"] == pytest.approx(0.1 * h0 + 0.3 * h1)
    assert e["kgco2"] == pytest.approx((100 * h0 + 500 * h1) / 1e3)


def test_a_power_cap_that_excludes_the_cheapest_gpu_changes_the_answer(tmp_path):
    """Llama-3-8B at 40 req/s under p99 TTFT 500 ms / TPOT 50 ms, H100 or A100 (priced at $0.50 so
    that it is the cheapest): six A100s ($3/hour, ~2.9 kW modelled) without a cap; under a 1.35 kW cap
    they are left out, said so, and two H100s (~1.3 kW, $6/hour) are the answer."""
    import servesim
    args = dict(slo="ttft_ms=500,tpot_ms=50", gpus=["h100-sxm", "a100-80gb"], tp=[1], target_rate=40, seeds=2,
                price="a100-80gb=0.5")
    free = servesim.plan("scenarios/quickstart.yaml", **args)
    assert free["chosen"]["gpu"] == "a100-80gb"
    a100 = next(r for r in free["candidates"] if r["gpu"] == "a100-80gb")
    assert a100["facility_kw"] > 1.35
    capped = servesim.plan("scenarios/quickstart.yaml", power_cap_kw=1.35, **args)
    assert capped["chosen"]["gpu"] == "h100-sxm" and capped["power_cap_kw"] == 1.35
    rows = {r["gpu"]: r for r in capped["candidates"]}
    assert rows["a100-80gb"]["status"].startswith("over the power cap: ")
    assert rows["h100-sxm"]["facility_kw"] <= 1.35
    # on the figures: the A100s at their simulated cluster's cost and p99 TTFT, marked over the cap
    from sim.planning.search_report import candidate_point, pareto_plot
    a100 = rows["a100-80gb"]
    cost, ttft, kind = candidate_point(a100, True)
    assert (cost, ttft, kind) == (a100["cluster"]["replicas"] * 0.5, a100["cluster"]["point"]["ttft_ms"]["p99"],
                                  "over the power cap")
    assert all(f["gpu"] == "h100-sxm" for f in capped["pareto"])  # (not on the frontier: it is not allowed)
    import matplotlib.image
    with_panel = pareto_plot(capped, tmp_path / "capped.png")
    without = pareto_plot({**capped, "power_cap_kw": None}, tmp_path / "free.png")
    # the cap drawn as a line on a second panel (kW against cost): a wider figure (13 in against 8.5 in)
    assert matplotlib.image.imread(with_panel).shape[1] > 1.4 * matplotlib.image.imread(without).shape[1]


def test_electricity_enters_the_gpu_searchs_ranking_and_can_change_its_answer(tmp_path):
    """The same search with A100s at $0.50/GPU-hour: on GPU-hours alone the A100s are the cheapest;
    with electricity at $3/kWh (energy.usd_per_kwh) each confirmed cluster's bill is its GPU-hours
    plus its modelled facility kW x 3, and the A100s (more GPUs, more kW for the same load) lose to
    the H100s. Every confirmed row's bill is that sum; the chosen is the least bill; the headline and
    search.md print the split."""
    import servesim
    from sim.planning.search_report import search_headline, write_search_report
    args = dict(slo="ttft_ms=500,tpot_ms=50", gpus=["h100-sxm", "a100-80gb"], tp=[1], target_rate=40, seeds=2,
                price="a100-80gb=0.5")
    gpus_only = servesim.plan("scenarios/quickstart.yaml", **args)
    assert gpus_only["chosen"]["gpu"] == "a100-80gb" and "total_usd_per_hour" not in gpus_only["chosen"]
    billed = servesim.plan("scenarios/quickstart.yaml", overrides=["energy.usd_per_kwh=3"], **args)
    confirmed = [r for r in billed["candidates"] if r.get("status") == "confirmed"]
    assert len(confirmed) == 2  # (the A100s' count is sought up to the H100s' whole bill, not their GPU-hours)
    for r in confirmed:
        assert r["electricity_usd_per_hour"] == pytest.approx(r["facility_kw"] * 3.0, rel=1e-12)
        assert r["total_usd_per_hour"] == pytest.approx(r["usd_per_hour"] + r["facility_kw"] * 3.0, rel=1e-12)
    c = billed["chosen"]
    assert c["gpu"] == "h100-sxm" and c["total_usd_per_hour"] == min(r["total_usd_per_hour"] for r in confirmed)
    a100 = next(r for r in confirmed if r["gpu"] == "a100-80gb")
    assert a100["usd_per_hour"] < c["usd_per_hour"]  # cheaper in GPU-hours, dearer in all
    head = dict(search_headline(billed))["cheapest configuration"]
    assert head.endswith(f"${c['total_usd_per_hour']:.2f}/hour (${c['usd_per_hour']:.2f} GPUs + "
                         f"${c['electricity_usd_per_hour']:.2f} electricity at the modelled draw)")
    write_search_report(billed, tmp_path)
    assert f"| {c['total_usd_per_hour']:,.2f} | confirmed cluster (GPUs {c['usd_per_hour']:,.2f} + electricity " \
           in (tmp_path / "search.md").read_text()


def test_power_over_time_by_hand():
    """Two engines over 4 s in 4 stretches of 1 s, idle 100 W: engine 0 runs [0, 2] at 500 W with
    4 requests; engine 1 runs [1.5, 2.5] at 300 W with 2. Stretch 0: (500 + 100) / 2 = 300 W;
    stretch 1: (500 + 0.5 x 300 + 0.5 x 100) / 2 = 350 W; stretch 2: (100 + 0.5 x 300 + 0.5 x 100)
    / 2 = 150 W; stretch 3: 100 W. Batch: 2, 2 + 0.5, 0.5, 0 requests over 2 engines."""
    import pandas as pd

    from sim.features.energy.power import power_over_time

    steps = pd.DataFrame({"replica": [0, 1], "start_s": [0.0, 1.5], "duration_s": [2.0, 1.0], "count": [2, 1],
                          "num_seqs": [4, 2]})
    p = power_over_time(steps, np.array([500.0, 300.0]), 4.0, 2, 100.0, 700.0, bins=4)
    assert p["gpu_w"] == pytest.approx([300.0, 350.0, 150.0, 100.0])
    assert p["batch"] == pytest.approx([2.0, 2.5, 0.5, 0.0])
    assert p["bin_s"] == 1.0 and p["tdp_w"] == 700.0
