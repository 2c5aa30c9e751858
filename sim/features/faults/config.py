"""The `faults:` section (issue 51), resolved: what fails, when, for how long, and what happens to
the requests on a replica that goes. Times in seconds of simulated time from the run's start.

    faults:
      failures: {mtbf_h: 200, repair_s: 600}     # per replica: exponential times between failures
      outages: [{replica: 0, at_s: 30, down_s: 120}]   # and/or given ones (a trace of outages)
      drains: {start_s: 600, restart_s: 180, timeout_s: 60}   # a rolling restart, one at a time
      spot: {replicas: 2, preemptions_per_h: 0.5, notice_s: 30, replace_s: 300, usd_per_gpu_hour: 1.2}
      on_failure: retry        # or fail: the client gets an error
      retry_delay_s: 1.0       # the client's wait before it sends the request again
      max_retries: 3           # after that many, the request fails
      minute_s: 60             # the window of the availability figure
      seed: 7                  # the fault times' own seed (default: from the scenario's seed)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.config.checks import _choice, _int, _num, check_fields
from sim.config.errors import ScenarioError

MAX_S = 1e9  # s: a sanity bound on every time here (~32 years)
MIN_WINDOW_S = 1e-3  # s: the shortest availability window (1e-300 made ~1e302 windows)


@dataclass(frozen=True)
class Outage:
    replica: int
    at_s: float
    down_s: float


@dataclass(frozen=True)
class Failures:
    mtbf_h: float        # mean time between failures of one replica, hours (exponential)
    repair_s: float      # down after a failure: restart, model load, warm-up


@dataclass(frozen=True)
class Drains:
    start_s: float       # the first replica is drained then; each next one once the last is back
    restart_s: float     # down for the restart itself
    timeout_s: float     # requests still on the replica then are taken off (retried or failed)
    replicas: tuple[int, ...] | None = None  # which, in order (None: every replica, 0 first)


@dataclass(frozen=True)
class Spot:
    replicas: int               # the last `replicas` of engine.replicas run on spot capacity
    preemptions_per_h: float    # per spot replica (exponential times)
    notice_s: float             # the warning before it is taken: drained meanwhile
    replace_s: float            # until a replacement serves (capacity found, model loaded)
    usd_per_gpu_hour: float | None = None  # the spot price (None: the on-demand price)
    notices: tuple[Outage, ...] = ()  # given preemption notices (replica, at_s; down_s unused), replayed


@dataclass(frozen=True)
class FaultsConfig:
    failures: Failures | None = None
    outages: tuple[Outage, ...] = ()
    drains: Drains | None = None
    spot: Spot | None = None
    on_failure: str = "retry"
    retry_delay_s: float = 1.0
    max_retries: int = 3
    minute_s: float = 60.0
    seed: int | None = None  # the fault times' own seed (None: drawn from the run's seed)

    def as_yaml(self) -> dict:
        out: dict[str, Any] = {}
        if self.failures is not None:
            out["failures"] = {"mtbf_h": self.failures.mtbf_h, "repair_s": self.failures.repair_s}
        if self.outages:
            out["outages"] = [{"replica": o.replica, "at_s": o.at_s, "down_s": o.down_s} for o in self.outages]
        if self.drains is not None:
            d = self.drains
            out["drains"] = {"start_s": d.start_s, "restart_s": d.restart_s, "timeout_s": d.timeout_s}
            if d.replicas is not None:
                out["drains"]["replicas"] = list(d.replicas)
        if self.spot is not None:
            s = self.spot
            out["spot"] = {k: v for k, v in (("replicas", s.replicas), ("preemptions_per_h", s.preemptions_per_h),
                                             ("notice_s", s.notice_s), ("replace_s", s.replace_s),
                                             ("usd_per_gpu_hour", s.usd_per_gpu_hour)) if v is not None}
            if s.notices:
                out["spot"]["notices"] = [{"replica": o.replica, "at_s": o.at_s} for o in s.notices]
        out.update(on_failure=self.on_failure, retry_delay_s=self.retry_delay_s, max_retries=self.max_retries,
                   minute_s=self.minute_s)
        if self.seed is not None:
            out["seed"] = self.seed
        return out


MIN_MTBF_H = 1 / 3600  # h: one second; a shorter mean time between failures is a unit slip, not a fleet

KEYS = ("failures", "outages", "drains", "spot", "on_failure", "retry_delay_s", "max_retries", "minute_s", "seed")


def _secs(v: Any, where: str, positive: bool = False) -> float:
    return _num(v, where, 0, open_lo=positive, cap=MAX_S)


def parse_faults(v: Any, where: str) -> FaultsConfig | None:
    """The `faults:` section; None when absent (no faults: the run as without the feature)."""
    if v is None:
        return None
    check_fields(v, where, KEYS, ())
    failures = outages = drains = spot = None
    if v.get("failures") is not None:
        f, at = v["failures"], f"{where}.failures"
        check_fields(f, at, ("mtbf_h", "repair_s"), ("mtbf_h", "repair_s"))
        mtbf_h = _num(f["mtbf_h"], f"{at}.mtbf_h", 0, open_lo=True, cap=1e7)
        if mtbf_h < MIN_MTBF_H:  # (1e-300 h ran to a day of nothing but failures, every request lost)
            raise ScenarioError(f"{at}.mtbf_h: {mtbf_h:g} h is under one second between failures of a replica, "
                                "no server's; the unit is hours (48 is two days)")
        failures = Failures(mtbf_h, _secs(f["repair_s"], f"{at}.repair_s"))
    if v.get("outages") is not None:
        if not isinstance(v["outages"], list) or not v["outages"]:
            raise ScenarioError(f"{where}.outages: must be a non-empty list of {{replica, at_s, down_s}}")
        items = []
        for i, o in enumerate(v["outages"]):
            at = f"{where}.outages[{i}]"
            check_fields(o, at, ("replica", "at_s", "down_s"), ("replica", "at_s", "down_s"))
            items.append(Outage(_int(o["replica"], f"{at}.replica", 0), _secs(o["at_s"], f"{at}.at_s"),
                                _secs(o["down_s"], f"{at}.down_s")))
        outages = tuple(sorted(items, key=lambda o: (o.at_s, o.replica)))
    if v.get("drains") is not None:
        d, at = v["drains"], f"{where}.drains"
        check_fields(d, at, ("start_s", "restart_s", "timeout_s", "replicas"), ("start_s", "restart_s"))
        order = None
        if d.get("replicas") is not None:
            if not isinstance(d["replicas"], list) or not d["replicas"]:
                raise ScenarioError(f"{at}.replicas: must be a non-empty list of replica indices")
            order = tuple(_int(r, f"{at}.replicas[{i}]", 0) for i, r in enumerate(d["replicas"]))
        drains = Drains(_secs(d["start_s"], f"{at}.start_s"), _secs(d["restart_s"], f"{at}.restart_s"),
                        _secs(d.get("timeout_s", 300.0), f"{at}.timeout_s"), order)
    if v.get("spot") is not None:
        s, at = v["spot"], f"{where}.spot"
        check_fields(s, at, ("replicas", "preemptions_per_h", "notice_s", "replace_s", "usd_per_gpu_hour", "notices"),
                     ("replicas",))
        if s.get("preemptions_per_h") is None and not s.get("notices"):
            raise ScenarioError(f"{at}: give preemptions_per_h (exponential times) or notices (given times)")
        notices = []
        for i, o in enumerate(s.get("notices") or ()):
            check_fields(o, f"{at}.notices[{i}]", ("replica", "at_s"), ("replica", "at_s"))
            notices.append(Outage(_int(o["replica"], f"{at}.notices[{i}].replica", 0),
                                  _secs(o["at_s"], f"{at}.notices[{i}].at_s"), 0.0))
        price = s.get("usd_per_gpu_hour")
        spot = Spot(_int(s["replicas"], f"{at}.replicas", 1),
                    _num(s.get("preemptions_per_h", 0.0), f"{at}.preemptions_per_h", 0, cap=1e4),
                    _secs(s.get("notice_s", 30.0), f"{at}.notice_s"),
                    _secs(s.get("replace_s", 300.0), f"{at}.replace_s"),
                    None if price is None else _num(price, f"{at}.usd_per_gpu_hour", 0, cap=1e4),
                    tuple(sorted(notices, key=lambda o: (o.at_s, o.replica))))
    policy = _choice(v.get("on_failure", "retry"), f"{where}.on_failure", ("retry", "fail"))
    cfg = FaultsConfig(failures, outages or (), drains, spot, policy,
                       _secs(v.get("retry_delay_s", 1.0), f"{where}.retry_delay_s"),
                       _int(v.get("max_retries", 3), f"{where}.max_retries", 0, cap=100),
                       _secs(v.get("minute_s", 60.0), f"{where}.minute_s", positive=True),
                       None if v.get("seed") is None else _int(v["seed"], f"{where}.seed", 0))
    if cfg.minute_s < MIN_WINDOW_S:
        raise ScenarioError(f"{where}.minute_s: {cfg.minute_s:g} s is under {MIN_WINDOW_S:g} s; a window must "
                            "hold requests to judge the SLO on (e.g. 60)")
    if failures is None and not cfg.outages and drains is None and spot is None:
        raise ScenarioError(f"{where}: names no fault; give failures, outages, drains or spot "
                            "(or remove the section)")
    return cfg
