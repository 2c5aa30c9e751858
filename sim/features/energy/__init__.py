"""Energy and power of a run (issue 50) as a feature: the `energy:` section, summary.json's
`energy`, the line `servesim run` prints. The model itself: sim/features/energy/power.py."""
from __future__ import annotations

import dataclasses
from typing import Any

from sim.features.contract import FeatureBase, Ran, RunView
from sim.features.energy.measured import shipped
from sim.features.energy.power import EnergyConfig, one_line, parse_energy, run_energy, shortest_iterations


class Energy(FeatureBase):
    key = "energy"
    title = "GPU, host and facility power per iteration; kWh, electricity and CO2 by the hour (docs/energy.md)"

    def parse(self, raw: Any, where: str) -> EnergyConfig:
        return parse_energy(raw, where)  # (absent: the defaults; every run has an energy section)

    def as_yaml(self, config: EnergyConfig) -> dict | None:
        if config == EnergyConfig():
            return None
        return {k: v for k, v in dataclasses.asdict(config).items() if v is not None}

    def observe(self, config: EnergyConfig, state: Any, ran: Ran) -> Any:
        # each steps.csv row's shortest iteration, for the peak power (before the gaps take the durations)
        return shortest_iterations(ran.steps["count"].to_numpy(), ran.durations)

    def summarize(self, config: EnergyConfig, state: Any, view: RunView) -> dict | None:
        s = view.summary
        if not s.get("duration_s"):
            return None
        m, hw = view.scenario.model, view.scenario.hardware
        return run_energy(view.steps, s["duration_s"], view.replicas, view.gpus, m.flops_per_token,
                          m.weight_bytes, hw.bf16_flops, hw.hbm_bandwidth, hw, config,
                          float(s["output_throughput"] * s["duration_s"]), s["completed"], state,
                          busy=shipped(hw) if config.power_model == "auto" else None)

    def line(self, section: dict) -> str | None:
        return one_line(section) or None

    def figures(self, run: Any) -> dict:
        p = run.summary["energy"].get("power_over_time")
        if not p or not p.get("gpu_w"):
            return {}  # (no board power known, or an older run folder)
        from sim.features.energy.plot import power_figure
        return {"power": power_figure(run)}


FEATURE = Energy()
