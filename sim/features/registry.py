"""The registered features, in the order their summary sections are written: one line each.

A new feature is a sub-package with a `FEATURE` object (sim/features/contract.Feature) and one
line here; nothing else in servesim names it (docs/simulator.md, "Adding a feature")."""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sim.config.errors import ScenarioError
from sim.features import energy, faults
from sim.features.contract import Feature

if TYPE_CHECKING:
    from sim.config.scenario import Scenario

FEATURES: dict[str, Feature] = {
    "energy": energy.FEATURE,
    "faults": faults.FEATURE,
}


def parse_sections(raw: dict, where) -> dict[str, Any]:
    """Each feature's config from its top-level section of `raw` (`where(key)`: the error prefix)."""
    return {key: f.parse(raw.get(key), where(key)) for key, f in FEATURES.items()}


def check_rules(scenario: Scenario, where) -> None:
    """A feature switched on beside something it cannot run with: refused, naming both."""
    for key, f in active(scenario):
        f.check(scenario.features[key], scenario, where(key))
        for rule in f.rules:
            if rule.clashes(scenario):
                raise ScenarioError(f"{where(key)}: not modelled together with {rule.other} ({rule.why})")


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
        if not rules:
            rows.append(f"| {key} | `{key}:` | (nothing) | |")
        for rule in rules:
            rows.append(f"| {key} | `{key}:` | {rule.other} | {rule.why} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(compatibility_markdown(), end="")
