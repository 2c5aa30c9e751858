"""engine.lora as data: vLLM's multi-LoRA serving knobs (--enable-lora, --max-loras, --max-lora-rank);
what is simulated: sim/features/lora/slots.py (adapter slots, admission) and sim/features/lora/cost.py (load and
extra kernels)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.config.checks import MAX_COUNT, _int, _section

LORA_RANK_MAX = 512  # vLLM's largest supported max_lora_rank


@dataclass(frozen=True)
class LoRAConfig:
    max_loras: int = 1        # adapters one batch may use at once: the GPU's adapter slots (vLLM's default 1)
    max_lora_rank: int = 16   # every adapter is sized and priced at this rank (vLLM's default 16)

    def as_yaml(self) -> dict:
        return {"max_loras": self.max_loras, "max_lora_rank": self.max_lora_rank}


def parse_lora(v: Any, at) -> LoRAConfig | None:
    """engine.lora: {max_loras, max_lora_rank}; None: no adapters served."""
    if v is None:
        return None
    m = _section(v, "lora", lambda k: at(k), ("max_loras", "max_lora_rank"))
    return LoRAConfig(
        max_loras=_int(m.get("max_loras", LoRAConfig.max_loras), at("lora.max_loras"), lo=1, cap=MAX_COUNT),
        max_lora_rank=_int(m.get("max_lora_rank", LoRAConfig.max_lora_rank), at("lora.max_lora_rank"), lo=1,
                           cap=LORA_RANK_MAX))
