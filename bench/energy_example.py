"""docs/energy.md's worked example: Llama-3-70B at 40 req/s under the bundled SLO on H100, H200 and B200.

    python bench/energy_example.py        # three GPU searches (TP 2, 4, 8 each), ~1 min on 2 cores

For each GPU type alone, `servesim plan scenarios/plan-llama3-70b-gpus.yaml --gpus GPU --tp 2,4,8
--target-rate 40 --set energy.usd_per_kwh=0.12` confirms its cheapest cluster; this prints, from each
search.json's `chosen` and its confirmed cluster's point: TP, replicas, GPUs, the facility's modelled
kW (sim/features/energy/power.py), J per output token (kW / output tokens per s), USD per hour (GPUs
+ electricity at $0.12/kWh) and USD per million output tokens. Every figure is the simulation's
(measured kernel tables, modelled power); none was measured on these GPUs.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = "scenarios/plan-llama3-70b-gpus.yaml"
GPUS = ("h100-sxm", "h200", "b200")
USD_PER_KWH = 0.12


def search(gpu: str, out: Path) -> dict:
    subprocess.run([sys.executable, str(ROOT / "cli.py"), "plan", SCENARIO, "--gpus", gpu, "--tp", "2,4,8",
                    "--target-rate", "40", "--set", f"energy.usd_per_kwh={USD_PER_KWH}", "--out", str(out), "-q"],
                   cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads((out / "search.json").read_text())


def row(s: dict) -> list[str]:
    c = s["chosen"]
    if c is None:
        return ["-"] * 7
    point = next(x for x in s["candidates"] if x["gpu"] == c["gpu"]
                 and x["tensor_parallel_size"] == c["tensor_parallel_size"])["cluster"]["point"]
    tps = point["output_throughput"]
    total = c.get("total_usd_per_hour", c["usd_per_hour"])
    return [f"TP{c['tensor_parallel_size']}", str(c["replicas"]), str(c["gpus"]), f"{c['facility_kw']:.1f}",
            f"{c['facility_kw'] * 1e3 / tps:.2f}", f"${c['usd_per_hour']:.2f} + ${c['electricity_usd_per_hour']:.2f}",
            f"${total / (tps * 3600) * 1e6:.3f}"]


def main() -> int:
    head = ["GPU", "TP", "replicas", "GPUs", "facility kW", "J / output token", "USD/hour (GPUs + electricity)",
            "USD / M output tokens"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    with tempfile.TemporaryDirectory() as tmp:
        for gpu in GPUS:
            lines.append("| " + " | ".join([gpu, *row(search(gpu, Path(tmp) / gpu))]) + " |")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
