"""The registered features, in the order their summary sections are written: one line each.

A new feature is a sub-package with a `FEATURE` object (sim/features/contract.Feature) and one
line here; nothing else in servesim names it (docs/simulator.md, "Adding a feature")."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from sim.config.errors import ScenarioError
from sim.features import energy, faults, kv_offloading, lora
from sim.features.contract import Feature

if TYPE_CHECKING:
    from sim.scenario import EngineConfig, Scenario

FEATURES: dict[str, Feature] = {
    "lora": lora.FEATURE,
    "kv_offloading": kv_offloading.FEATURE,
    "energy": energy.FEATURE,
    "faults": faults.FEATURE,
}


def top_level_keys() -> tuple[str, ...]:
    """The scenario's top-level keys the features own (an engine feature's knobs are engine keys)."""
    return tuple(key for key, f in FEATURES.items() if not f.section)


def parse_sections(raw: dict, engine: EngineConfig, where) -> dict[str, Any]:
    """Each feature's config: from its top-level section of `raw`, or (an engine feature) read off
    the resolved `engine` (`where(path)`: the error prefix)."""
    return {key: f.parse(engine if f.section == "engine" else raw.get(key), where(f.at or key))
            for key, f in FEATURES.items()}


def check_rules(scenario: Scenario, where) -> None:
    """A feature switched on beside something it cannot run with: refused, naming both."""
    for key, f in active(scenario):
        f.check(scenario.features[key], scenario, where(f.at or key))
        for rule in f.rules:
            if rule.clashes(scenario):
                raise ScenarioError(f"{where(f.at or key)}: not modelled together with {rule.other} ({rule.why})")


def notices(sections: dict[str, Any]) -> list[str]:
    """What the active features say about how they are priced (before the Scenario is whole: its
    cost model's notice carries them)."""
    return [said for key, f in FEATURES.items() if f.on(sections.get(key)) and (said := f.notice(sections[key]))]


def wrap_cost(scenario: Scenario, cost: Any) -> Any:
    """The step-cost model with every active feature's additions, in registry order."""
    for key, f in active(scenario):
        cost = f.wrap_cost(scenario.features[key], cost, scenario)
    return cost


def scheduler_parts(scenario: Scenario, workload: Any) -> Callable[[Any], dict] | None:
    """make(kv): every active feature's collaborators for one replica's scheduler over its KV cache
    (None: no feature supplies any)."""
    makers = [m for key, f in active(scenario)
              if (m := f.scheduler_parts(scenario.features[key], scenario, workload))]
    if not makers:
        return None
    return lambda kv: {name: part for make in makers for name, part in make(kv).items()}


def active(scenario: Scenario) -> Iterator[tuple[str, Feature]]:
    """The features that change this run, in registry order."""
    for key, f in FEATURES.items():
        if f.on(scenario.features.get(key)):
            yield key, f


def unvalidated(scenario: Scenario) -> tuple[str, ...]:
    """The features on in `scenario` whose latencies were never compared with real serving (the
    error band widens for them: sim/cost/error_band.py)."""
    return tuple(f.unvalidated for _, f in active(scenario) if f.unvalidated)


def compatibility_markdown() -> str:
    """The features and what each cannot run with, as the table docs/simulator.md prints (a test
    holds the two equal: `python -m sim.features.registry` prints it)."""
    rows = ["| feature | section | cannot run with | why |", "|---|---|---|---|"]
    for key, f in FEATURES.items():
        rules = f.rules or ()
        section = f"`{f.at}`" if f.section else f"`{key}:`"
        if not rules:
            rows.append(f"| {key} | {section} | (nothing) | |")
        for rule in rules:
            rows.append(f"| {key} | {section} | {rule.other} | {rule.why} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(compatibility_markdown(), end="")
