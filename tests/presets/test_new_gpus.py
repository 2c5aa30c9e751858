"""The GPUs the kernel tables cover beyond the first five (B300, GB200, GB300, RTX PRO 6000: measured profiles
through the same importer) and the MI355X by datasheet: what each prices with, their NVLink domains,
and the planner asking for a price where none can be cited."""
from __future__ import annotations

from pathlib import Path

import pytest

from sim.config.errors import ScenarioError
from sim.cost.measured import shipped_profile
from sim.cost.pipeline import hop_link
from sim.cost.registry import default_cost_model
from sim.planning.plan_request import PlanRequest, prepare
from sim.presets.hardware import HARDWARE_PRESETS
from sim.presets.models import MODEL_PRESETS

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
LLAMA3 = MODEL_PRESETS["llama-3-8b"]


@pytest.mark.parametrize("gpu, device", [("b300", "NVIDIA B300"), ("gb200", "NVIDIA GB200"),
                                         ("gb300", "NVIDIA GB300"), ("rtx-pro-6000", "NVIDIA RTX PRO 6000")])
def test_the_new_blackwell_gpus_price_from_their_measured_tables(gpu, device):
    hw = HARDWARE_PRESETS[gpu]
    assert shipped_profile("llama-3-8b", gpu, 1) is not None
    spec = default_cost_model(LLAMA3, hw, 1)
    assert spec.name == "measured" and spec.notice is None
    assert spec.profile.metadata["device"].startswith(device)


def test_gb200_has_no_eight_gpu_all_reduce_measured_and_says_so():
    """AIConfigurator timed GB200's all-reduce on one 4-GPU tray: TP8 falls back to the roofline, named."""
    spec = default_cost_model(LLAMA3, HARDWARE_PRESETS["gb200"], 8)
    assert spec.name == "roofline" and "no all-reduce rows for 8 GPUs" in spec.notice


def test_mi355x_is_a_datasheet_roofline_and_says_so():
    spec = default_cost_model(LLAMA3, HARDWARE_PRESETS["mi355x"], 1)
    assert spec.name == "roofline" and "no kernel tables for mi355x" in spec.notice


def test_a_presets_nvlink_domain_is_the_users_to_set_and_keeps_its_tables():
    from dataclasses import replace

    from sim.presets.hardware import is_preset

    assert is_preset(replace(HARDWARE_PRESETS["h100-sxm"], nvlink_domain=16))
    assert not is_preset(replace(HARDWARE_PRESETS["h100-sxm"], hbm_bandwidth=3e12))


def test_an_nvl72_rack_keeps_a_16_gpu_replica_on_nvlink():
    """16 GPUs: two HGX boards apart (the H100's 50 GB/s network) but one GB200 NVL72 rack (NVLink, 900 GB/s)."""
    assert hop_link(HARDWARE_PRESETS["gb200"], 16) == (900e9, 2e-6)
    assert hop_link(HARDWARE_PRESETS["h100-sxm"], 16) == (50e9, 5e-6)
    assert hop_link(HARDWARE_PRESETS["gb200"], 144)[0] == 100e9


def test_the_planner_asks_for_a_price_it_cannot_cite(tmp_path):
    with pytest.raises(ScenarioError, match=r"--price: b300 has no preset price .* --price b300=USD"):
        prepare(PlanRequest(QUICKSTART, slo="ttft_ms=500", out=tmp_path / "a", gpus="h100-sxm,b300"))
    job = prepare(PlanRequest(QUICKSTART, slo="ttft_ms=500", out=tmp_path / "b", gpus="h100-sxm,b300",
                              price="b300=7.5"))
    assert job.prices == {"b300": 7.5}
    assert not (tmp_path / "a").exists()
