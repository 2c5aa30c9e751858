"""What AIConfigurator 0.12's measured B200 power says, beside servesim's stated power model.

    pip download aiconfigurator-core==0.12.0 --no-deps -d /tmp/aic
    python bench/b200_power.py /tmp/aic/aiconfigurator_core-0.12.0-*.whl

The wheel's only power columns (`power`, `power_limit`, W) are in three B200 tables measured under
vLLM 0.22.0: context attention, generation attention and the fused MoE; no GEMM, no other GPU. This
prints, per table, the rows and the board power's quartiles, and the median by kernel duration
(latency, ms), next to what sim/features/energy/power.py's stated line gives a B200 (TDP 1,000 W, an
idle GPU 10% of it), then the busy-power curve servesim prices a B200's iterations by, from the
rows calibrate/aic_import.py kept (sim/tables/b200_sxm/power.csv; sim/features/energy/measured.py).
It reads the parquet files; it never imports aiconfigurator.
"""
from __future__ import annotations

import io
import sys
import zipfile
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sim.features.energy.measured import shipped  # noqa: E402
from sim.presets.hardware import HARDWARE_PRESETS  # noqa: E402

TABLES = {
    "context attention": "b200_sxm/attention/vllm/0.22.0/context_attention_perf.parquet",
    "generation attention": "b200_sxm/attention/vllm/0.22.0/generation_attention_perf.parquet",
    "fused MoE": "b200_sxm/moe/vllm/0.22.0/moe_perf.parquet",
}
DURATIONS_MS = [0, 0.01, 0.03, 0.1, 0.3, 1, 3, 10, float("inf")]


def main(wheel: str) -> int:
    z = zipfile.ZipFile(wheel)
    prefix = "aiconfigurator_core/systems/data/"
    print("servesim's model for b200: TDP 1000 W (NVIDIA HGX B200), idle 100 W (10% of TDP, an assumption), "
          "an iteration idle + 900 W x max(compute, memory) utilisation")
    for name, path in TABLES.items():
        df = pd.read_parquet(io.BytesIO(z.read(prefix + path)))
        q = df["power"].quantile([0, 0.25, 0.5, 0.75, 1.0])
        limits = ", ".join(f"{v:g}" for v in sorted(df["power_limit"].unique()))
        print(f"\n{name} ({path}): {len(df):,} rows, power_limit {limits} W")
        print("  power W: min {:.0f}, p25 {:.0f}, median {:.0f}, p75 {:.0f}, max {:.0f}".format(*q))
        bins = pd.cut(df["latency"], DURATIONS_MS)
        by = df.groupby(bins, observed=True)["power"].agg(["count", "median"])
        for interval, row in by.iterrows():
            print(f"  kernels of {interval.left:g}-{interval.right:g} ms: {int(row['count']):>6,} rows, "
                  f"median {row['median']:.0f} W")
    curve = shipped(HARDWARE_PRESETS["b200"])
    if curve is None:
        print("\nno sim/tables/b200_sxm/power.csv: python -m calibrate.aic_import WHEEL --gpu b200 writes it")
        return 0
    print(f"\nthe busy-power curve of {curve.source}, against the stated line:")
    for u, w in zip(curve.u, curve.watts):
        print(f"  u {u:.3f}: {w:.0f} W measured, {100 + 900 * u:.0f} W stated")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
