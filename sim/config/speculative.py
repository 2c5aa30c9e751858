"""engine.speculative as data: the method, k drafted tokens and their acceptance (the model of
speculative decoding itself: sim/schedulers/speculative.py; its cost: sim/cost/speculative.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sim.config.checks import _int, _num, _section
from sim.config.errors import ScenarioError

METHODS = ("draft", "eagle", "mtp", "ngram")
MAX_SPECULATIVE_TOKENS = 16  # vLLM's proposers run a handful; more is almost surely a typo


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    acceptance: tuple[float, ...]   # per position 1..k
    draft_model: str | None = None  # method draft: a model preset

    @property
    def expected_tokens(self) -> float:
        """Mean tokens a sequence gains per verification: 1 + sum_j prod_{i<=j} a_i."""
        return 1.0 + float(np.cumprod(self.acceptance).sum())

    def as_yaml(self) -> dict:
        a = self.acceptance
        out: dict[str, Any] = {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens,
                               "acceptance_rate": a[0] if len(set(a)) == 1 else list(a)}
        if self.draft_model:
            out["draft_model"] = self.draft_model
        return out


def parse_speculative(v: Any, where: str, model_presets) -> SpeculativeConfig | None:
    """engine.speculative as written -> SpeculativeConfig; `where` is e.g. "chat.yaml: engine.speculative"."""
    if v is None:
        return None
    m = _section(v, "speculative", lambda k: f"{where.rsplit('speculative', 1)[0]}{k}",
                 ("method", "num_speculative_tokens", "acceptance_rate", "draft_model"))
    method = m.get("method")
    if method not in METHODS:
        raise ScenarioError(f"{where}.method: {method!r} is not one of {', '.join(METHODS)}")
    k = _int(m.get("num_speculative_tokens"), f"{where}.num_speculative_tokens", lo=1, hi=MAX_SPECULATIVE_TOKENS)
    rate = m.get("acceptance_rate")
    rates = rate if isinstance(rate, list) else [rate] * k
    if len(rates) != k:
        raise ScenarioError(f"{where}.acceptance_rate: {len(rates)} values for num_speculative_tokens {k}; "
                            "give one rate, or one per position")
    acceptance = tuple(_num(r, f"{where}.acceptance_rate", 0, 1) for r in rates)
    draft = m.get("draft_model")
    if (method == "draft") != (draft is not None):
        raise ScenarioError(f"{where}.draft_model: " + (
            "method draft needs the draft model (a preset, e.g. llama-3.2-1b)" if method == "draft"
            else f"only method draft takes a draft model ({method} drafts with the target's own layers)"))
    if draft is not None and draft not in model_presets:
        raise ScenarioError(f"{where}.draft_model: unknown preset {draft!r}; allowed: {', '.join(model_presets)}")
    return SpeculativeConfig(method, k, acceptance, draft)
