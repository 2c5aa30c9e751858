"""A claim's record: the statement audited, where it was checked, the numbers and a verdict."""
from __future__ import annotations

from dataclasses import dataclass

VERDICTS = ("holds", "holds only under stated conditions", "does not hold")
HOLDS, CONDITIONAL, FAILS = VERDICTS
ESTIMATE = "simulated with the roofline cost model: an estimate from datasheet peaks, not measured on hardware"
UNIT = "simulated with the unit cost model (1 iteration = 1 s): exact iteration counts, no hardware involved"
ARITHMETIC = "arithmetic from the model's published config.json shapes; nothing simulated"


@dataclass(frozen=True)
class Figure:
    """One number of a claim: what was claimed (as printed) and what we got."""
    label: str
    simulated: float
    unit: str = ""                 # "%" (fraction shown x100), "x", "steps", "ms", "tok/s", "GiB", "KiB", ""
    claimed: str = ""              # as printed; "" when the claim states no number for it
    claimed_value: float | None = None  # the claimed number as shown (% as 0-100), for plots; range: midpoint

    @property
    def shown(self) -> float:
        """The simulated number as shown: fractions as percentages."""
        return 100 * self.simulated if self.unit in ("%", "+%") else self.simulated


@dataclass(frozen=True)
class Claim:
    key: str
    claim: str                     # the statement audited
    setting: str                   # model, GPU, cost model, workload, schedulers
    basis: str                     # UNIT, ESTIMATE or ARITHMETIC
    figures: tuple[Figure, ...]
    verdict: str                   # one of VERDICTS
    conditions: str                # what makes it true or false
    headline: str = ""             # the result in one line, for the summary table


def pct(x: float) -> str:
    """A fraction as a percentage with one decimal, for headlines and conditions."""
    return f"{100 * x:.1f}%"
