"""Faults (issue 51) as a feature: replica failures (exponential MTBF or given outages), rolling
restarts, spot capacity with preemption notices, and the retries or failures of the requests on a
replica that goes. Config: sim/features/faults/config.py; the run: runtime.py; summary.json's
`faults`: summary.py; N+k spares for an availability target: sim/planning/spares.py; docs/faults.md."""
from __future__ import annotations

from typing import Any

import numpy as np

from sim.config.errors import ScenarioError
from sim.features.contract import FeatureBase, Rule, RunView, Wiring
from sim.features.faults.config import FaultsConfig, parse_faults


def _closed_loop(s) -> bool:
    from sim.workload.generators import Agents, ClosedLoop
    return isinstance(s.workload.arrival, (ClosedLoop, Agents))


class Faults(FeatureBase):
    key = "faults"
    title = "replica failures, outages, rolling restarts, spot preemptions; retries; SLO per minute (docs/faults.md)"
    unvalidated = "faults: retries, restarts, preemptions"
    rules: tuple[Rule, ...] = (
        Rule("engine.disaggregation", lambda s: s.engine.disaggregation is not None,
             "a failed prefill or decode pool member is not modelled"),
        Rule("engine.admission", lambda s: s.engine.admission is not None, "the gateway routes its own admissions"),
        Rule("engine.kv_offloading_size", lambda s: s.engine.kv_offloading_size is not None,
             "a CPU tier's loads in flight on a failed replica"),
        Rule("engine.scheduler: static", lambda s: s.engine.scheduler == "static",
             "the static scheduler cannot hand its batch back"),
        Rule("engine.data_parallel_size > 1", lambda s: s.engine.data_parallel_size > 1,
             "a failed rank of a data-parallel group"),
        Rule("engine.routing.staleness_s", lambda s: s.engine.routing is not None and s.engine.routing.staleness_s > 0,
             "stale routing signals over a changing replica set"),
        Rule("a closed-loop workload", _closed_loop, "users' retries are not modelled; use open-loop arrivals"),
    )

    def parse(self, raw: Any, where: str) -> FaultsConfig | None:
        return parse_faults(raw, where)

    def check(self, config: FaultsConfig, scenario, where: str) -> None:
        a = scenario.engine.autoscaling  # (autoscaled: every replica the fleet may hold can fault)
        n = scenario.engine.replicas if a is None else a.max_replicas
        count = "engine.replicas" if a is None else "engine.autoscaling.max_replicas"
        for i, o in enumerate(config.outages):
            if o.replica >= n:
                raise ScenarioError(f"{where}.outages[{i}].replica: {o.replica} but {count} is {n} "
                                    f"(replicas 0..{n - 1})")
        if config.drains is not None and config.drains.replicas is not None:
            for i, r in enumerate(config.drains.replicas):
                if r >= n:
                    raise ScenarioError(f"{where}.drains.replicas[{i}]: {r} but {count} is {n}")
        if config.spot is not None and config.spot.replicas > n:
            raise ScenarioError(f"{where}.spot.replicas: {config.spot.replicas} but {count} is {n} "
                                "(spot replicas are some of " + ("engine.replicas)" if a is None else
                                                                 "the replicas the fleet may hold)"))
        if config.spot is not None and a is not None:  # (autoscaled: any replica may run on spot)
            for i, o in enumerate(config.spot.notices):
                if o.replica >= n:
                    raise ScenarioError(f"{where}.spot.notices[{i}].replica: {o.replica} but {count} is {n} "
                                        f"(replicas 0..{n - 1})")
        elif config.spot is not None:
            first = n - config.spot.replicas
            for i, o in enumerate(config.spot.notices):
                if not first <= o.replica < n:
                    raise ScenarioError(f"{where}.spot.notices[{i}].replica: {o.replica} is not a spot replica "
                                        f"(the spot ones: {max(first, 0)}..{n - 1})")

    def as_yaml(self, config: FaultsConfig | None) -> dict | None:
        return None if config is None else config.as_yaml()

    def wire(self, config: FaultsConfig, wiring: Wiring) -> Any:
        from sim.features.faults.runtime import Faults as Running
        from sim.runtime.routers import make_router

        if wiring.workload.users is not None:
            raise ScenarioError("faults: not modelled together with a closed-loop workload (users' retries "
                                "are not modelled; use open-loop arrivals)")
        e = wiring.scenario.engine
        spot_from = len(wiring.schedulers) - (0 if config.spot is None else config.spot.replicas)
        # the faults' own generator, spawned from the run's: their draws leave the run's stream as it was
        rng = wiring.rng.spawn(1)[0] if config.seed is None else np.random.default_rng(config.seed)
        price = wiring.scenario.hardware.usd_per_hour
        spot_usd = None if config.spot is None else (
            price if config.spot.usd_per_gpu_hour is None else config.spot.usd_per_gpu_hour)
        running = Running(wiring.env, config, wiring.req, wiring.schedulers,
                          lambda n: make_router(e.router, n, e.routing), False, rng, spot_from, wiring.fleet,
                          spot_usd)
        if wiring.fleet is not None:  # the autoscaler judges the load on the replicas that are up
            wiring.replica_up = lambda i: running.pool.state[i] == "up"
            wiring.loads = running.signals.exact_loads
            wiring.done = lambda: running.done  # (every request finished or failed)
        wiring.inboxes = lambda: running.inboxes
        wiring.replica_class = running.replica_class
        wiring.started.append(running.start)
        return running

    def columns(self, config: FaultsConfig, state: Any) -> dict[str, np.ndarray]:
        return {"attempts": state.attempts, "failed": state.failed}

    def summarize(self, config: FaultsConfig, state: Any, view: RunView) -> dict | None:
        from sim.features.faults.summary import faults_section
        return faults_section(state, config, view.requests, view.scenario, view.summary.get("autoscaling"))

    def line(self, section: dict) -> str | None:
        from sim.features.faults.summary import one_line
        return one_line(section)

    def unfinished(self, section: dict) -> int:
        return int(section.get("requests_failed") or 0)  # lost with no retry left: the model's outcome

    def figures(self, run: Any) -> dict:
        from sim.features.faults.plot import faults_figure
        return {"faults": faults_figure(run)}


FEATURE = Faults()
