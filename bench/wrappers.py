"""What a cost-model wrapper costs: the same run priced by a model and by ScaledCost(model, 1.0)
(what `plan --band` and every sliding-window model run through), interleaved in one process.

    python bench/wrappers.py [--rounds 5] [--requests 3000]

Prints, per model, CPU seconds (min / median of the rounds) plain and wrapped, their ratio, and
whether the two runs' requests are identical (they must be: x 1.0 changes no float).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sim.build import cost_model  # noqa: E402
from sim.cost.step_cost import ScaledCost  # noqa: E402
from sim.scenario import load_scenario  # noqa: E402
from sim.simulate import simulate  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=3000)
    args = ap.parse_args()
    print(f"{'cost model':10} {'plain s (min/med)':>18} {'wrapped s (min/med)':>20} {'ratio':>6}  identical")
    for name in ("roofline", "measured"):
        sc = load_scenario(ROOT / "scenarios/chat-llama3-8b-h100.yaml",
                           overrides=[f"cost_model={name}", f"workload.num_requests={args.requests}"])
        plain, wrapped = [], []
        results = {}
        for _ in range(args.rounds):  # interleaved: the machine's noise falls on both alike
            for label, times in (("plain", plain), ("wrapped", wrapped)):
                cost = cost_model(sc)
                cost = cost if label == "plain" else ScaledCost(cost, 1.0)
                t0 = time.process_time()
                r = simulate(sc, cost=cost)
                times.append(time.process_time() - t0)
                results[label] = r.requests
        same = results["plain"].equals(results["wrapped"])
        ratio = statistics.median(wrapped) / statistics.median(plain)
        print(f"{name:10} {min(plain):8.3f} / {statistics.median(plain):6.3f}  "
              f"{min(wrapped):9.3f} / {statistics.median(wrapped):6.3f}  {ratio:6.2f}  {same}")


if __name__ == "__main__":
    main()
