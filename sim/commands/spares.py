"""`servesim spares`: the spares (N+k) a fleet needs for an availability target under its faults."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sim.config.options import argument, option


@dataclass(frozen=True)
class SparesRequest:
    scenario: Path = field(metadata=argument("Scenario YAML with a faults: section (docs/faults.md)."))
    availability: float = field(default=0.999, metadata=option(
        "The fraction of windows (faults.minute_s) that must meet the SLO, e.g. 0.999.", metavar="F"))
    seeds: int = field(default=5, metadata=option(
        "Fault seeds per fleet (the fault times vary, the requests do not).", metavar="N", min=1, max=100))
    max_spares: int = field(default=4, metadata=option("Most spares tried.", metavar="K", min=0, max=64))
    overrides: tuple[str, ...] = field(default=(), metadata=option(
        "Override a scenario key, as for [bold]run[/]. Repeatable.", "--set", metavar="KEY=VALUE",
        show_default=False))
    out: Path | None = field(default=None, metadata=option(
        "Also write spares.json here.", "--out", "-o", metavar="DIR", show_default=False))
    quiet: bool = field(default=False, metadata=option("No progress lines.", "--quiet", "-q"))


def spares(r: SparesRequest) -> None:
    """Search N+k, print its lines, and write spares.json when --out is given."""
    from sim.config.checks import check_out_dir
    from sim.files import write_json
    from sim.planning.spares import lines, plan_spares
    from sim.reporting.console import out
    from sim.reporting.progress import Progress
    from sim.scenario import load_scenario
    from sim.simulate import finite

    sc = load_scenario(r.scenario, overrides=r.overrides)
    if r.out is not None:
        check_out_dir(r.out)
    with Progress("spares", "simulations", enabled=not r.quiet) as progress:
        plan = plan_spares(sc, r.availability, r.seeds, r.max_spares, progress=lambda d, t, _eta: progress(d, t))
    for line in lines(plan):
        out(line)
    if r.out is not None:
        r.out.mkdir(parents=True, exist_ok=True)
        write_json(finite(plan), r.out / "spares.json")
        out(f"wrote {r.out / 'spares.json'}")
