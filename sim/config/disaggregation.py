"""engine.disaggregation as data: the pools' sizes and engine knobs, their GPUs and the link that
carries KV between them (what is simulated: sim/runtime/disaggregation.py)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sim.config.checks import MAX_REPLICAS, _int, _num, _section
from sim.config.errors import ScenarioError

# name -> (bytes/s per GPU, latency s). Nominal link rates, one direction:
LINKS = {
    "nvlink": (None, 2e-6),        # the hardware preset's interconnect_bandwidth (H100: 450 GB/s)
    "infiniband": (50e9, 5e-6),    # NDR 400 Gb/s per GPU
    "pcie": (32e9, 10e-6),         # PCIe Gen4 x16 (L40S has no NVLink)
    "ethernet": (12.5e9, 20e-6),   # 100 GbE
}
POOL_KNOBS = ("scheduler", "max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size",
              "gpu_memory_utilization", "num_gpu_blocks", "policy")


@dataclass(frozen=True)
class DisaggregationConfig:
    prefill_replicas: int
    decode_replicas: int
    prefill: Any              # EngineConfig of the prefill pool
    decode: Any               # EngineConfig of the decode pool
    link: str                 # a LINKS name, or "custom"
    link_bandwidth: float | None  # bytes/s per GPU link; None: the hardware's interconnect
    link_latency_s: float
    raw: dict                 # as written (resolved scenarios write it back)
    prefill_hardware: Any = None  # HardwareSpec of that pool; None: the scenario's
    decode_hardware: Any = None

    def as_yaml(self) -> dict:
        return self.raw

    def bandwidth(self, hardware) -> float:
        return self.link_bandwidth or hardware.interconnect_bandwidth

    def transfer_s(self, tokens, kv_bytes_per_token: float, hardware):
        """Seconds to ship `tokens` tokens of KV (works on arrays)."""
        links = min(self.prefill.tensor_parallel_size, self.decode.tensor_parallel_size)
        return self.link_latency_s + tokens * kv_bytes_per_token / (self.bandwidth(hardware) * links)


def parse_disaggregation(v: Any, where, engine_raw: dict, parse_engine, gpus: Mapping[str, Any]) -> \
        DisaggregationConfig | None:
    """engine.disaggregation as written; `parse_engine(mapping, where)` validates each pool's engine
    (the scenario's engine keys with the pool's knobs over them); a pool's `hardware` names one of
    `gpus` (the hardware presets, handed in: config/ imports nothing above it)."""
    if v is None:
        return None
    at = lambda k: where(f"engine.disaggregation.{k}")  # noqa: E731
    m = _section(v, "disaggregation", lambda k: where(f"engine.{k}"),
                 ("prefill_replicas", "decode_replicas", "prefill", "decode", "link"))
    pools = {}
    hardware = {}
    for pool in ("prefill", "decode"):
        knobs = dict(_section(m.get(pool) or {}, pool, lambda k: at(k), (*POOL_KNOBS, "hardware")))
        gpu = knobs.pop("hardware", None)
        if gpu is not None:
            if gpu not in gpus:
                raise ScenarioError(f"{at(pool + '.hardware')}: unknown GPU {gpu!r}; allowed: "
                                    f"{', '.join(gpus)}")
            hardware[pool] = gpus[gpu]
        base = {k: x for k, x in engine_raw.items() if k not in ("disaggregation", "replicas")}
        def pool_where(k: str, pool: str = pool, knobs: dict = knobs) -> str:  # the pool's own knobs: its key path
            return where(k.replace("engine.", f"engine.disaggregation.{pool}.", 1) if k.split(".")[-1] in knobs else k)

        pools[pool] = parse_engine({**base, **knobs}, pool_where)
    link = m.get("link", "nvlink")
    bandwidth: float | None  # bytes/s per GPU link; None: the hardware's interconnect
    if isinstance(link, dict):
        _section(link, "link", lambda k: at(f"link.{k}"), ("bandwidth_gbps", "latency_us"))
        # at least 1 Mbit/s and at most 1,000 s of latency: a transfer must end within the clock's
        # bound (1e-300 Gbit/s made every late request's latencies 0)
        bandwidth = _num(link.get("bandwidth_gbps"), at("link.bandwidth_gbps"), 1e-3, cap=1e6) * 1e9 / 8
        latency = _num(link.get("latency_us", 0.0), at("link.latency_us"), 0, cap=1e9) * 1e-6
        name = "custom"
    elif link in LINKS:
        (bandwidth, latency), name = LINKS[link], link
    else:
        raise ScenarioError(f"{at('link')}: {link!r} is not one of {', '.join(LINKS)} or "
                            "{bandwidth_gbps: G, latency_us: U}")
    return DisaggregationConfig(
        _int(m.get("prefill_replicas"), at("prefill_replicas"), lo=1, hi=MAX_REPLICAS),
        _int(m.get("decode_replicas"), at("decode_replicas"), lo=1, hi=MAX_REPLICAS),
        pools["prefill"], pools["decode"], name, bandwidth, latency, dict(m),
        hardware.get("prefill"), hardware.get("decode"))
