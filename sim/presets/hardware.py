"""GPU presets: memory, HBM bandwidth, dense bf16 FLOP/s, interconnect.

CONTRACT (owned by the cost-model engineer):
    HardwareSpec fields below; HARDWARE_PRESETS: dict[str, HardwareSpec]
    hardware_from_fields(fields, where) -> HardwareSpec

Numbers are vendor datasheet peaks (decimal units: 1 GB = 1e9 bytes). Memory is the marketed
capacity (80 GB for H100), which is ~6% below what the driver reports (H100: 81,559 MiB =
85.5e9 B): conservative, and it keeps "0.9 x 80 GB = 72.0 GB usable" easy to check by hand.
fp8: dense (the datasheets' "with sparsity" figures halved); A100 has no fp8 tensor cores.
Networks: the NIC per GPU of the vendors' reference 8-GPU systems, one direction: DGX H100, H200
and B200 have eight ConnectX-7 400 Gb/s (50 GB/s a GPU), DGX A100 eight ConnectX-6 200 Gb/s (25 GB/s).
L40S and MI300X servers have no one reference NIC: 0, and a layout spanning nodes is refused there
unless the hardware mapping gives one.
Host links: the datasheets' PCIe figure, which is bidirectional, halved (Gen5 x16: 128 GB/s -> 64
GB/s per direction; Gen4 x16: 64 -> 32): a peak; DMA copies of KV blocks reach less.
Prices are rounded on-demand estimates per GPU-hour from GPU clouds (mid-2025), not quotes;
override `usd_per_hour` in a scenario for your own contract. See docs/cost_models.md. A preset with
no public rate servesim can cite (B300, GB200, GB300, RTX PRO 6000, MI325X, MI355X) has usd_per_hour 0, "unknown": the
planner asks for a price (--price GPU=USD, or hardware.usd_per_hour) rather than rank it as free.
NVLink domains: HGX/DGX boards join 8 GPUs; GB200/GB300 NVL72 racks join 72 over NVLink switches
(`nvlink_domain`), so a replica of up to 72 GPUs there never crosses the slower network.
The B300, GB200 and GB300 figures are those of NVIDIA AIConfigurator's system files
(aiconfigurator-core 0.12.0, Apache-2.0, citing NVIDIA's Blackwell datasheets), whose kernel tables
servesim ships for them (sim/tables/); memory is the marketed capacity as for the others.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from dataclasses import fields as dc_fields

from sim.config.checks import MAX_BYTES, MAX_RATE_PHYSICAL, MAX_USD_PER_HOUR, _int, _num, _text, check_fields
from sim.config.errors import ScenarioError


@dataclass(frozen=True)
class HardwareSpec:
    name: str
    memory_bytes: float        # HBM capacity per GPU, bytes
    hbm_bandwidth: float       # bytes/s
    bf16_flops: float          # dense bf16 FLOP/s (no sparsity)
    interconnect_bandwidth: float = 0.0  # bytes/s per direction per GPU (NVLink), for TP all-reduce
    usd_per_hour: float = 0.0  # on-demand list price, for cost reports
    fp8_flops: float = 0.0     # dense fp8 FLOP/s (0: no fp8 tensor cores; fp8 weights run at bf16)
    # bytes/s per direction per GPU between host memory and the GPU (its PCIe link): what KV blocks
    # offloaded to CPU memory cross when they are loaded back (engine.kv_offloading_size); 0: unknown
    host_bandwidth: float = 0.0
    # bytes/s per direction per GPU to other nodes (its scale-out NIC): what pipeline stages and
    # expert-parallel groups spanning nodes cross (sim/cost/pipeline.hop_link); 0: unknown
    network_bandwidth: float = 0.0
    # GPUs one NVLink (Infinity Fabric) domain joins: a replica of at most this many GPUs crosses
    # only interconnect_bandwidth (8: an HGX board; 72: a GB200/GB300 NVL72 rack)
    nvlink_domain: int = 8


HARDWARE_PRESETS: dict[str, HardwareSpec] = {
    # H100 SXM5 80GB: HBM3 3.35 TB/s, 989 TFLOP/s dense bf16, NVLink4 900 GB/s bidirectional.
    "h100-sxm": HardwareSpec("h100-sxm", 80e9, 3.35e12, 989e12, 450e9, 3.00, fp8_flops=1979e12,
                             host_bandwidth=64e9, network_bandwidth=50e9),
    # H200 SXM 141GB: HBM3e 4.8 TB/s, same compute and NVLink as H100.
    "h200": HardwareSpec("h200", 141e9, 4.8e12, 989e12, 450e9, 3.80, fp8_flops=1979e12, host_bandwidth=64e9,
                         network_bandwidth=50e9),
    # A100 SXM4 80GB: HBM2e 2.039 TB/s, 312 TFLOP/s bf16, NVLink3 600 GB/s bidirectional.
    "a100-80gb": HardwareSpec("a100-80gb", 80e9, 2.039e12, 312e12, 300e9, 1.80, host_bandwidth=32e9,
                              network_bandwidth=25e9),
    # L40S 48GB GDDR6: 864 GB/s, 362 TFLOP/s dense bf16; no NVLink, PCIe Gen4 x16 ~32 GB/s.
    "l40s": HardwareSpec("l40s", 48e9, 0.864e12, 362e12, 32e9, 1.00, fp8_flops=733e12, host_bandwidth=32e9),
    # B200 (HGX/DGX B200, 180 GB HBM3e per GPU): 8 TB/s, 2.25 PFLOP/s dense bf16, NVLink5 1.8 TB/s
    # bidirectional. Price: a rounded on-demand estimate like the others, not a quote.
    "b200": HardwareSpec("b200", 180e9, 8.0e12, 2.25e15, 900e9, 6.00, fp8_flops=4.5e15, host_bandwidth=64e9,
                         network_bandwidth=50e9),
    # AMD Instinct MI300X (CDNA 3, 192 GB HBM3): 5.3 TB/s, ~1.3 PFLOP/s dense bf16 and ~2.6 fp8 (AMD's
    # figures as reported by third parties, rounded as they give them), Infinity Fabric 7 links x
    # 128 GB/s bidirectional = 448 GB/s per direction. No kernel tables: its steps are always the
    # roofline's estimate (NVIDIA-derived efficiencies, not checked on ROCm), and said so. Price: the
    # median on-demand MI300X rate over the providers listed by cliffcenter.com (2026-05), $1.99.
    "mi300x": HardwareSpec("mi300x", 192e9, 5.3e12, 1.3e15, 448e9, 1.99, fp8_flops=2.6e15,
                          host_bandwidth=64e9),
    # B300 (HGX B300, Blackwell Ultra, 288 GB HBM3e): 7.75 TB/s (62 TB/s over 8), 2.25 PFLOP/s dense
    # bf16, 4.5 fp8, NVLink5 900 GB/s a direction, PCIe Gen6 (128 GB/s a direction), one ConnectX-8
    # 800 Gb/s (100 GB/s) a GPU. Measured kernel tables (sim/tables/b300_sxm). Price unknown.
    "b300": HardwareSpec("b300", 288e9, 7.75e12, 2.25e15, 900e9, 0.0, fp8_flops=4.5e15, host_bandwidth=128e9,
                         network_bandwidth=100e9),
    # GB200 (NVL72: 13.4 TB HBM3e over 72 GPUs, 186 GB each): 8 TB/s, 2.5 PFLOP/s dense bf16, 5 fp8,
    # NVLink5 900 GB/s a direction to all 72 GPUs of the rack; the host is a Grace CPU over
    # NVLink-C2C (900 GB/s both ways, shared by its 2 GPUs: 225 GB/s a GPU a direction); 100 GB/s a
    # GPU between racks (ConnectX-8). Measured kernel tables (sim/tables/gb200). Price unknown.
    "gb200": HardwareSpec("gb200", 186e9, 8.0e12, 2.5e15, 900e9, 0.0, fp8_flops=5.0e15, host_bandwidth=225e9,
                          network_bandwidth=100e9, nvlink_domain=72),
    # GB300 (NVL72, Blackwell Ultra, 288 GB HBM3e): 8 TB/s, 2.5 PFLOP/s dense bf16, 5 fp8; links as
    # GB200's. Measured kernel tables (sim/tables/gb300). Price unknown.
    "gb300": HardwareSpec("gb300", 288e9, 8.0e12, 2.5e15, 900e9, 0.0, fp8_flops=5.0e15, host_bandwidth=225e9,
                          network_bandwidth=100e9, nvlink_domain=72),
    # RTX PRO 6000 Blackwell Server Edition (96 GB GDDR7, PCIe card, no NVLink): 1.792 TB/s, 467.8
    # TFLOP/s dense bf16 and 935.6 fp8 (AIConfigurator's figures, scaled to the 2,430 MHz its card ran
    # at), PCIe Gen5 x16 between GPUs and to the host. Measured kernel tables (sim/tables/rtx_pro_6000_server).
    # No reference NIC (0) and no price.
    "rtx-pro-6000": HardwareSpec("rtx-pro-6000", 96e9, 1.792e12, 467.8e12, 64e9, 0.0, fp8_flops=935.6e12,
                                 host_bandwidth=64e9),
    # AMD Instinct MI325X (CDNA 3, 256 GB HBM3E): 6 TB/s, 1.3074 PFLOP/s dense bf16 and 2.6149 fp8
    # (AMD's datasheet, without sparsity), Infinity Fabric as MI300X's (448 GB/s a direction), PCIe
    # Gen5. No kernel tables: the roofline's estimate with NVIDIA-derived efficiencies, said so,
    # flagged "estimated, not validated" with the widest error band (sim/cost/error_band.py).
    # Price unknown.
    "mi325x": HardwareSpec("mi325x", 256e9, 6.0e12, 1.3074e15, 448e9, 0.0, fp8_flops=2.6149e15,
                           host_bandwidth=64e9),
    # AMD Instinct MI355X (CDNA 4, 288 GB HBM3E): 8 TB/s, 5 PFLOP/s dense fp8 (AMD at ISSCC 2026, as
    # reported) and half that in bf16, Infinity Fabric 7 links x 153.6 GB/s both ways = 537.6 GB/s a
    # direction, PCIe Gen5. No kernel tables: the roofline's estimate, said so. Price unknown.
    "mi355x": HardwareSpec("mi355x", 288e9, 8.0e12, 2.5e15, 537.6e9, 0.0, fp8_flops=5.0e15,
                           host_bandwidth=64e9),
}

_FIELDS = tuple(f.name for f in dc_fields(HardwareSpec))
_BOUNDS = {"memory_bytes": MAX_BYTES, "hbm_bandwidth": MAX_RATE_PHYSICAL, "bf16_flops": MAX_RATE_PHYSICAL,
           "interconnect_bandwidth": MAX_RATE_PHYSICAL, "usd_per_hour": MAX_USD_PER_HOUR,
           "fp8_flops": MAX_RATE_PHYSICAL, "host_bandwidth": MAX_RATE_PHYSICAL,
           "network_bandwidth": MAX_RATE_PHYSICAL}
MAX_NVLINK_DOMAIN = 100_000  # GPUs (NVL576 is the largest announced)
_REQUIRED = ("memory_bytes", "hbm_bandwidth", "bf16_flops")
# bytes/s or FLOP/s: a thousand a second is far below any processor (a tiny test model's "GPU" runs at
# ~4e5 bytes/s), and keeps every iteration's time far inside float64 (figures of 1e-300 overflowed it)
MIN_RATE_PHYSICAL = 1e3
_REQUIRED_RATES = ("hbm_bandwidth", "bf16_flops")
_RATES = ("interconnect_bandwidth", "fp8_flops", "host_bandwidth", "network_bandwidth")  # 0: none / unknown


def hardware_from_fields(fields: dict, where: str) -> HardwareSpec:
    """Explicit HardwareSpec mapping (e.g. a scenario's `hardware:` block); units: bytes,
    bytes/s, FLOP/s, USD/hour (host_bandwidth: bytes/s, the PCIe link per direction). `where`
    prefixes messages, e.g. "chat.yaml: hardware"."""
    check_fields(fields, where, _FIELDS, _REQUIRED)
    values: dict[str, float | int] = {k: _num(fields[k], f"{where}.{k}", 0, open_lo=k in _REQUIRED, cap=_BOUNDS[k])
                                      for k in _FIELDS if k not in ("name", "nvlink_domain") and k in fields}
    for k, v in values.items():  # a rate far below any processor's (1e-300 ran to a clock of 1e305 s)
        if v < MIN_RATE_PHYSICAL and (k in _REQUIRED_RATES or (k in _RATES and v > 0)):
            raise ScenarioError(f"{where}.{k}: {v:g} is below {MIN_RATE_PHYSICAL:g} per second, slower than any "
                                "processor that serves a model; the unit is per second (bytes/s or FLOP/s), e.g. "
                                "3.35e12 bytes/s for an H100's HBM" + ("" if k in _REQUIRED_RATES else " (0: none)"))
    if "nvlink_domain" in fields:
        values["nvlink_domain"] = _int(fields["nvlink_domain"], f"{where}.nvlink_domain", lo=1, cap=MAX_NVLINK_DOMAIN)
    return HardwareSpec(name=_text(fields.get("name", "custom"), f"{where}.name"), **values)  # type: ignore[arg-type]


def is_preset(hardware: HardwareSpec) -> bool:
    """Is `hardware` the preset of its name, its price, its links to the host and the network and its
    NVLink domain aside? Those are the user's to set (hardware: {..., usd_per_hour: 2.0,
    host_bandwidth: 40e9}); none changes what a kernel costs, so such a GPU keeps the preset's kernel
    tables and measured profiles."""
    preset = HARDWARE_PRESETS.get(hardware.name)
    return preset is not None and replace(preset, usd_per_hour=hardware.usd_per_hour,
                                          host_bandwidth=hardware.host_bandwidth,
                                          network_bandwidth=hardware.network_bandwidth,
                                          nvlink_domain=hardware.nvlink_domain) == hardware
