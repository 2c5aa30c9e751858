"""KV offloading to CPU memory (vLLM's `--kv-offloading-size`, its OffloadingConnector) as a
feature: a CPU tier behind each replica's prefix cache (sim/features/kv_offloading/cpu_tier.py),
what it needs of the scenario, summary.json's `kv_offloading` and the line `servesim run` prints.

Its knobs are engine keys, as vLLM's flags are (engine.kv_offloading_size: GiB of CPU memory over
all TP ranks; engine.kv_offloading_backend: only "native" is modelled), parsed with the engine's
other knobs; this feature reads them off the resolved engine (`section = "engine"`)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.config.errors import ScenarioError
from sim.features.contract import FeatureBase, Rule, RunView, Wiring
from sim.features.kv_offloading.cpu_tier import CpuOffload, OffloadSpec
from sim.presets.memory import kv_bytes_per_token_per_rank
from sim.runtime.metrics import distribution
from sim.schedulers import SCHEDULERS

if TYPE_CHECKING:
    from sim.scenario import EngineConfig, Scenario


@dataclass(frozen=True)
class Offloading:
    """The CPU tier asked for: GiB of CPU memory over all of a replica's TP ranks, and the backend."""
    size_gib: float
    backend: str


class KVOffloading(FeatureBase):
    key = "kv_offloading"
    section = "engine"
    at = "engine.kv_offloading_size"
    title = "KV blocks offloaded to a CPU tier behind the prefix cache and loaded back over the host link"
    unvalidated = ""  # (the error band names it from the engine knob: sim/cost/error_band.path_of)
    rules: tuple[Rule, ...] = (
        Rule("engine.speculative", lambda s: s.engine.speculative is not None,
             "the speculative pool's KV and a CPU tier are not modelled together"),
        Rule("engine.disaggregation", lambda s: s.engine.disaggregation is not None,
             "a CPU tier behind either pool, beside the KV the pools hand on, is not modelled"),
    )

    def parse(self, raw: EngineConfig, where: str) -> Offloading | None:
        # (an engine feature is handed the resolved engine; its knobs' values were checked with the
        # engine's: sim/scenario._check_engine)
        return None if raw.kv_offloading_size is None else Offloading(raw.kv_offloading_size,
                                                                      raw.kv_offloading_backend)

    def check(self, config: Offloading, scenario: Scenario, where: str) -> None:
        """Modelled over vLLM V1's prefix cache (blocks are found by their hashes) on an engine
        that has one, across a known host link, with room for a block."""
        engine, hw = scenario.engine, scenario.hardware
        cls = SCHEDULERS[engine.scheduler]
        if not (cls.iteration_level and cls.prefix_caching) or engine.enable_prefix_caching is False:
            raise ScenarioError(f"{where}: offloading is modelled over prefix caching (blocks are found by their "
                                "hashes), which is off here"
                                + ("" if cls.prefix_caching else f" (the {engine.scheduler} scheduler has none)"))
        if hw.host_bandwidth <= 0:
            raise ScenarioError(f"{where}: {hw.name} has no host link bandwidth (hardware.host_bandwidth, bytes/s "
                                "per direction: what loads from CPU memory cross); give it in the hardware mapping")
        tp = engine.tensor_parallel_size
        block = kv_bytes_per_token_per_rank(scenario.stage_model, tp, engine.kv_cache_dtype) * engine.block_size
        if config.size_gib * 2**30 / tp < block:
            raise ScenarioError(f"{where}: {config.size_gib:g} GiB over {tp} GPU(s) holds no KV block "
                                f"({block:,} bytes per GPU for {scenario.stage_model.name}); give at least "
                                f"{block * tp / 2**30:.3g} GiB")

    def scheduler_parts(self, config: Offloading, scenario: Scenario, workload: Any) -> Callable[[Any], dict]:
        spec = offload_spec(config, scenario)
        # (the scenario's checks put it over prefix caching: each replica's kv is a PrefixKVCache)
        return lambda kv: {"connector": CpuOffload(spec, kv)}

    def wire(self, config: Offloading, wiring: Wiring) -> list:
        return wiring.schedulers  # (the summary reads each replica's tier)

    def summarize(self, config: Offloading, state: list, view: RunView) -> dict | None:
        schedulers = state  # (wire's: every replica's scheduler)
        tiers = [s.connector for s in schedulers if getattr(s, "connector", None) is not None]
        if not tiers:
            return None
        # the CPU tier's share of the lookups (the GPU's: prefix_cache_hit_rate)
        queried = sum(s.kv.queried_tokens for s in schedulers)
        hit = sum(t.hit_tokens for t in tiers)
        return {"cpu_blocks_per_replica": tiers[0].capacity, "cpu_hit_rate": hit / queried if queried else 0.0,
                "cpu_hit_tokens": hit, "loads": sum(t.loads for t in tiers),
                "load_ms": distribution(np.array([x for t in tiers for x in t.load_seconds], dtype=np.float64)),
                "stored_blocks": sum(t.stored_blocks for t in tiers),
                "evicted_blocks": sum(t.evicted_blocks for t in tiers)}

    def line(self, section: dict) -> str | None:
        p99 = (section.get("load_ms") or {}).get("p99")
        return (f"KV offloading: CPU hit rate {section['cpu_hit_rate']:.1%}, {section['loads']:,} loads "
                f"(p99 {'-' if p99 is None else f'{p99:,.1f}'} ms), {section['cpu_blocks_per_replica']:,} CPU "
                "blocks a replica")


def offload_spec(config: Offloading, scenario: Scenario) -> OffloadSpec:
    """The CPU tier each replica gets: its blocks (vLLM's size is GiB over all TP ranks, each rank
    keeping its shard of a block) and a block's load time over the host link."""
    e = scenario.engine
    per_block = kv_bytes_per_token_per_rank(scenario.stage_model, e.tensor_parallel_size,
                                            e.kv_cache_dtype) * e.block_size
    return OffloadSpec.resolve(config.size_gib, per_block, e.tensor_parallel_size, scenario.hardware.host_bandwidth)


FEATURE = KVOffloading()
