"""Byte-identical outputs across a change (issue 49's check): every bundled scenario (generated
load capped at 400 requests, a trace at its first 400) and eight feature runs built on
scenarios/quickstart.yaml (windowed, hybrid, LoRA, offload, PP2, disaggregated, speculative,
autoscaled), each run's requests.csv, steps.csv and summary.json hashed (summary.json without
run.servesim_version).

    PYTHONPATH=/path/to/old/tree python bench/identical.py --write /tmp/old.json
    python bench/identical.py --write /tmp/new.json --against /tmp/old.json

`--ignore KEY` (both runs) leaves a summary.json key added on purpose out, e.g. energy.power_over_time.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CAP = 400
QUICK = "scenarios/quickstart.yaml"
# (name, scenario, --set overrides)
VARIANTS = [
    ("windowed", QUICK, ["model=mistral-7b"]),
    ("hybrid", QUICK, ["model=qwen3-next-80b-a3b", "hardware=h200", "engine.tensor_parallel_size=4"]),
    ("lora", QUICK, ["engine.lora={max_loras: 2, max_lora_rank: 16}",
                     "workload.adapters={count: 4, share: 0.5}"]),
    ("offload", QUICK, ["engine.kv_offloading_size=8"]),
    ("pp2", QUICK, ["engine.pipeline_parallel_size=2"]),
    ("disaggregated", QUICK, ["engine.disaggregation={prefill_replicas: 1, decode_replicas: 1}"]),
    ("speculative", QUICK, ["engine.speculative={method: ngram, num_speculative_tokens: 2, acceptance_rate: 0.7}"]),
    ("autoscaled", QUICK, ["engine.autoscaling={max_replicas: 3, target_in_flight: 8, interval_s: 2, "
                           "cold_start_s: 3}"]),
]


def cases():
    for path in sorted((ROOT / "scenarios").glob("*.yaml")):
        yield path.stem, str(path), []
    for name, path, sets in VARIANTS:
        yield name, str(ROOT / path), sets


def digest(out: Path, ignore: tuple[str, ...] | list[str] = ()) -> dict:
    got = {}
    for name in ("requests.csv", "steps.csv", "summary.json"):
        data = (out / name).read_bytes()
        if name == "summary.json":  # (paths inside the tree, e.g. a profile's: the tree's root named alike)
            data = data.replace(str(ROOT).encode(), b"<root>")
            summary = json.loads(data)
            summary.get("run", {}).pop("servesim_version", None)
            for key in ignore:  # --ignore a.b: a key added on purpose since the revision compared with
                *parents, last = key.split(".")
                node = summary
                for part in parents:
                    node = node.get(part, {}) if isinstance(node, dict) else {}
                if isinstance(node, dict):
                    node.pop(last, None)
            data = json.dumps(summary, sort_keys=True).encode()
        got[name] = hashlib.sha256(data).hexdigest()
    return got


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--write", required=True)
    p.add_argument("--against")
    p.add_argument("--ignore", action="append", default=[], metavar="KEY",
                   help="a summary.json key (dotted) left out of the comparison, e.g. energy.power_over_time")
    args = p.parse_args()
    import sim
    from sim.config.errors import ScenarioError
    if (Path(sim.__file__).parent / "scenario.py").exists():
        from sim.scenario import load_scenario
    else:  # (PYTHONPATH at a tree from before the scenario left sim/config/)
        from sim.config.scenario import load_scenario
    from sim.simulate import simulate, write_outputs

    results = {}
    for name, path, sets in cases():
        try:
            sc = load_scenario(path, overrides=sets)
            n = sc.workload.num_requests
            if n is None or n > CAP:
                key = "workload.num_requests" if n is not None else "workload.trace.max_requests"
                try:
                    sc = load_scenario(path, overrides=[*sets, f"{key}={CAP}"])
                except ScenarioError:
                    pass
            with tempfile.TemporaryDirectory() as tmp:
                write_outputs(simulate(sc), Path(tmp))
                results[name] = digest(Path(tmp), args.ignore)
        except ScenarioError as err:
            results[name] = {"error": str(err)}
        print(name, "error" if "error" in results[name] else "ok", flush=True)
    Path(args.write).write_text(json.dumps(results, indent=1, sort_keys=True))
    if args.against:
        old = json.loads(Path(args.against).read_text())
        differ = [n for n in sorted(set(old) | set(results)) if old.get(n) != results.get(n)]
        print(f"{len(results)} runs; {len(results) - len(differ)} byte-identical; differ: {differ or 'none'}")
        return 1 if differ else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
