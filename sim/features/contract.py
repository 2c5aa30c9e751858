"""The one contract a feature meets (issue 49), like vLLM's KV connector or a scheduler plug-in:
the central files call these hooks for every registered feature and branch on none.

    section                          "" : its own top-level scenario section `key:`; "engine": its
                                     knobs are engine keys (vLLM's flags, parsed with the engine's),
                                     and parse reads them off the resolved EngineConfig
    at                               the scenario key path its errors name ("": its key)
    parse(raw, where) -> config      its own top-level scenario section (None when absent), checked;
                                     an engine feature's: the EngineConfig
    unvalidated                      its name in the error band when on, if no real run checked it
    rules                            what it cannot run with, as data: checked once the scenario is
                                     parsed, printed by docs/features.md (`compatibility`)
    as_yaml(config) -> dict | None   the section the resolved scenario.yaml writes (None: nothing)
    check(config, scenario, where)   cross-checks against the rest of the scenario (a replica index)
    on(config) -> bool               does it change the run (an absent section: no)
    notice(config) -> str | None     what a run says once about how it prices the feature's work
                                     (a stated model, not measured), added to the cost model's notice
    wrap_cost(config, cost, scenario) -> cost
                                     at build time: the step-cost model with what the feature adds
                                     to an iteration (LoRA: adapter loads and kernels)
    scheduler_parts(config, scenario, workload) -> make | None
                                     at build time: make(kv) gives each replica's scheduler its
                                     collaborators over that replica's KV cache (name -> object,
                                     e.g. "connector": a CPU tier), like vLLM's KV connector
    wire(config, wiring) -> state    at build time, before the replicas: may replace the routing of
                                     open-loop arrivals and the replicas' class, and start processes
    observe(config, state, ran)      after the run, before the metrics take the recorder's arrays
    columns(config, state) -> dict   requests.csv columns of its own (name -> array, one per request)
    summarize(config, state, view)   its summary.json section (None: none)
    line(section) -> str | None      the line `servesim run` prints about it
    unfinished(section) -> int       requests its model leaves unfinished by design (faults: failed
                                     with no retry left), which `servesim run` does not count against
                                     the run
    figures(run) -> dict             its own figures for `servesim plot` (name -> matplotlib Figure)
    vllm_flags(config) -> list[str]  what it adds to the `vllm serve` command (deploy files)

`FeatureBase` gives every hook a do-nothing default, so a feature writes only what it needs.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

    from sim.scenario import Scenario


@dataclass(frozen=True)
class Rule:
    """A feature cannot run with what `clashes(scenario)` finds (the scenario key path `other`
    names it); `why` says so in the error and the docs' table."""
    other: str
    clashes: Callable[[Scenario], bool]
    why: str


@dataclass
class Wiring:
    """What a feature may hook at build time (sim/build.py fills the first fields and reads the
    last ones back): `inboxes(router, signals)` replaces how open-loop arrivals reach the
    replicas' inboxes; `replica_class` the replicas' class (sim/runtime/engine.Replica or a
    subclass); `started(replicas)` is called with every replica once they are built."""
    env: Any
    scenario: Scenario
    req: Any                 # sim/workload/request.RequestTable
    workload: Any            # sim/workload/generators.Workload
    schedulers: list
    rng: np.random.Generator
    inboxes: Callable[..., list] | None = None
    replica_class: type | None = None
    started: list[Callable[[list], None]] = field(default_factory=list)
    # engine.autoscaling: the fleet (sim/runtime/autoscaler.Fleet) the build made, and back from a
    # feature which replicas can serve now (the autoscaler judges its load on those only)
    fleet: Any = None
    replica_up: Callable[[int], bool] | None = None
    loads: Callable[[], list] | None = None  # each replica's requests in flight, where `inboxes` are the feature's
    done: Callable[[], bool] | None = None   # nothing more will arrive (a feature holding requests says)


@dataclass(frozen=True)
class Ran:
    """A finished run as the metrics are about to read it: steps.csv's frame and every
    iteration's duration (s, in the recorder's order)."""
    steps: pd.DataFrame
    durations: np.ndarray


@dataclass(frozen=True)
class RunView:
    """What a feature's summary reads: the scenario, requests.csv and steps.csv's frames, the
    summary so far, the engines and GPUs the run held (an autoscaled fleet's mean)."""
    scenario: Scenario
    requests: pd.DataFrame
    steps: pd.DataFrame
    summary: dict
    replicas: float
    gpus: float


class Feature(Protocol):
    key: str                 # its top-level scenario key (and summary.json section)
    section: str             # "" (its own top-level section) or "engine" (its knobs are engine keys)
    at: str                  # the key path its errors name ("": key)
    title: str               # one line for the docs' table
    rules: tuple[Rule, ...]
    unvalidated: str         # what the error band names while it is on ("": it changes no latency)

    def parse(self, raw: Any, where: str) -> Any: ...
    def check(self, config: Any, scenario: Scenario, where: str) -> None: ...
    def notice(self, config: Any) -> str | None: ...
    def wrap_cost(self, config: Any, cost: Any, scenario: Scenario) -> Any: ...
    def scheduler_parts(self, config: Any, scenario: Scenario, workload: Any) -> Callable[[Any], dict] | None: ...
    def as_yaml(self, config: Any) -> dict | None: ...
    def on(self, config: Any) -> bool: ...
    def wire(self, config: Any, wiring: Wiring) -> Any: ...
    def observe(self, config: Any, state: Any, ran: Ran) -> Any: ...
    def columns(self, config: Any, state: Any) -> dict[str, np.ndarray]: ...
    def summarize(self, config: Any, state: Any, view: RunView) -> dict | None: ...
    def line(self, section: dict) -> str | None: ...
    def unfinished(self, section: dict) -> int: ...
    def figures(self, run: Any) -> dict: ...
    def vllm_flags(self, config: Any) -> list[str]: ...


class FeatureBase:
    """Every hook's default: the feature does nothing there."""
    key = ""
    section = ""
    at = ""
    title = ""
    rules: tuple[Rule, ...] = ()
    unvalidated = ""

    def parse(self, raw: Any, where: str) -> Any:
        return raw

    def check(self, config: Any, scenario: Scenario, where: str) -> None:
        return None

    def notice(self, config: Any) -> str | None:
        return None

    def wrap_cost(self, config: Any, cost: Any, scenario: Scenario) -> Any:
        return cost

    def scheduler_parts(self, config: Any, scenario: Scenario, workload: Any) -> Callable[[Any], dict] | None:
        return None

    def as_yaml(self, config: Any) -> dict | None:
        return None

    def on(self, config: Any) -> bool:
        return config is not None

    def wire(self, config: Any, wiring: Wiring) -> Any:
        return None

    def observe(self, config: Any, state: Any, ran: Ran) -> Any:
        return state

    def columns(self, config: Any, state: Any) -> dict[str, np.ndarray]:
        return {}

    def summarize(self, config: Any, state: Any, view: RunView) -> dict | None:
        return None

    def line(self, section: dict) -> str | None:
        return None

    def unfinished(self, section: dict) -> int:
        return 0

    def figures(self, run: Any) -> dict:
        return {}

    def vllm_flags(self, config: Any) -> list[str]:
        return []
