"""Multi-LoRA serving (vLLM's --enable-lora, --max-loras, --max-lora-rank) as a feature: the adapter
slots each replica's scheduler is handed (sim/features/lora/slots.py), what an iteration pays for
its adapters (sim/features/lora/cost.py), what it needs of the scenario, summary.json's `lora` and
the line `servesim run` prints.

Its knobs are the engine key `engine.lora: {max_loras, max_lora_rank}` (sim/config/lora.py, parsed
with the engine's other knobs); the requests name their adapters in the workload
(`workload.adapters`, or a trace's `adapter` column). The slots' memory comes out of the KV cache
(sim/presets/memory.lora_slot_bytes, in the scenario's memory budget)."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.config.errors import ScenarioError
from sim.features.contract import FeatureBase, Rule, RunView, Wiring
from sim.features.lora.cost import LoRACost
from sim.features.lora.slots import LoRASlots
from sim.schedulers import SCHEDULERS

if TYPE_CHECKING:
    from sim.config.lora import LoRAConfig
    from sim.scenario import EngineConfig, Scenario

NOT_TOGETHER = "LoRA adapters' slots and loads beside it are not modelled"


class LoRA(FeatureBase):
    key = "lora"
    section = "engine"
    at = "engine.lora"
    title = "LoRA adapters served from GPU slots, loaded over the host link on a miss"
    unvalidated = ""  # (the error band names it from the engine knob: sim/cost/error_band.path_of)
    rules: tuple[Rule, ...] = (
        Rule("engine.scheduler: static", lambda s: not SCHEDULERS[s.engine.scheduler].iteration_level,
             "the static scheduler does not admit by adapter slot"),
        Rule("engine.speculative", lambda s: s.engine.speculative is not None, NOT_TOGETHER),
        Rule("engine.disaggregation", lambda s: s.engine.disaggregation is not None, NOT_TOGETHER),
        Rule("engine.kv_offloading_size", lambda s: s.engine.kv_offloading_size is not None, NOT_TOGETHER),
        Rule("engine.pipeline_parallel_size > 1", lambda s: s.engine.pipeline_parallel_size > 1, NOT_TOGETHER),
    )

    def parse(self, raw: EngineConfig, where: str) -> LoRAConfig | None:
        return raw.lora  # (an engine feature is handed the resolved engine: sim/config/lora.py parsed it)

    def check(self, config: LoRAConfig, scenario: Scenario, where: str) -> None:
        """Modelled for a dense model, loading adapters across a known host link."""
        hw, model = scenario.hardware, scenario.model
        if hw.host_bandwidth <= 0:
            raise ScenarioError(f"{where}: {hw.name} has no host link bandwidth (hardware.host_bandwidth, bytes/s per "
                                "direction: what an adapter loaded into a slot crosses); give it in the hardware "
                                "mapping")
        if model.moe is not None:
            raise ScenarioError(f"{where}: LoRA adapters on {model.name}'s experts are not modelled (a dense model's "
                                "are)")

    def notice(self, config: LoRAConfig) -> str | None:
        return ("LoRA adapters' loads and kernels are a stated model (host link and HBM reads, FLOPs at the peak: "
                "sim/features/lora/cost.py), not measured")

    def wrap_cost(self, config: LoRAConfig, cost: Any, scenario: Scenario) -> Any:
        # adapters loaded into slots and run beside the base model
        return LoRACost(cost, scenario.model, scenario.hardware, scenario.engine.tensor_parallel_size,
                        config.max_lora_rank)

    def scheduler_parts(self, config: LoRAConfig, scenario: Scenario, workload: Any) -> Callable[[Any], dict]:
        # which requests may join, what each iteration loads (-1: a request for the base model)
        adapter = workload.adapter if workload.adapter is not None else np.full(len(workload), -1, np.int64)
        return lambda kv: {"lora": LoRASlots(config.max_loras, adapter)}

    def wire(self, config: LoRAConfig, wiring: Wiring) -> list:
        return wiring.schedulers  # (the summary counts each replica's loads)

    def summarize(self, config: LoRAConfig, state: list, view: RunView) -> dict | None:
        slots = [s.lora for s in state if getattr(s, "lora", None) is not None]
        if not slots:
            return None
        # (requests.csv's adapter column: every request offered, -1 for the base model)
        adapter = view.requests["adapter"].to_numpy() if "adapter" in view.requests else None
        return {"max_loras": config.max_loras, "max_lora_rank": config.max_lora_rank,
                "adapters_used": int(len(np.unique(adapter[adapter >= 0]))) if adapter is not None else 0,
                "adapter_loads": sum(x.loads for x in slots)}

    def line(self, section: dict) -> str | None:
        return (f"LoRA: {section['adapters_used']:,} adapters used; {section['adapter_loads']:,} loads into "
                f"{section['max_loras']} slot(s) a replica (rank {section['max_lora_rank']})")


FEATURE = LoRA()
