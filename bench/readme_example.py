"""The README's worked plan: run it, print the excerpt the README quotes, and check or rewrite it.

    python bench/readme_example.py            # print the excerpt (runs the plan: ~15 s)
    python bench/readme_example.py --check    # exit 1 if README.md's block differs from it
    python bench/readme_example.py --write    # rewrite README.md's block with it

Every number in the block comes from the plan.json this writes (keys named below), so the README
cannot drift from what `servesim plan` prints: tests/test_readme.py runs --check's comparison.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
COMMAND = ("servesim plan scenarios/quickstart.yaml --slo ttft_ms=500,tpot_ms=50,percentile=99 "
           "--target-rate 20 --out plans/quickstart")
BEGIN, END = "<!-- worked-plan: begin (bench/readme_example.py --write) -->", "<!-- worked-plan: end -->"


def excerpt(plan: dict) -> str:
    """The README's lines, from plan.json (load_search, recommendation, cluster, band, cost)."""
    unit = plan["load_search"]["unit"]
    rec, cluster, band, cost = plan["recommendation"], plan["cluster"], plan["band"], plan["cost"]
    point = cluster["point"]
    rows = [
        ("SLO", plan["slo_label"]),
        ("sustained load, scenario's setting", f"{plan['load_search']['answer']:.2f} {unit} per replica"),
        ("best engine setting", f"max_num_seqs {rec['max_num_seqs']}, max_num_batched_tokens "
                                f"{rec['max_num_batched_tokens']}: {rec['per_replica_load']:.2f} {unit}"),
        (f"replicas for {cluster['target']:.2f} {unit}",
         f"{cluster['replicas']}, the whole cluster simulated ({point['passes']}/{point['seeds']} seeds meet)"),
        ("cost-model error band", f"{band['steps_slower']['answer']:.2f} {unit} if real steps take "
                                  f"{band['slower'] - 1:+.1%}, {band['steps_faster']['answer']:.2f} if "
                                  f"{band['faster'] - 1:+.1%}"),
        ("cost", f"${cost['usd_per_hour']:.2f}/hour, ${cost['usd_per_million_output_tokens']:.3f} per million "
                 "output tokens"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"$ {COMMAND}", *(f"{k:<{width}}  {v}" for k, v in rows), rec["vllm_serve"]]
    return "\n".join(lines)


def run_plan() -> dict:
    import json

    with tempfile.TemporaryDirectory() as tmp:
        args = COMMAND.split()[2:]  # (after "servesim plan")
        out = args.index("--out")
        args[out + 1] = str(Path(tmp) / "plan")
        subprocess.run([sys.executable, str(ROOT / "cli.py"), "plan", *args, "-q"], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)
        return json.loads((Path(tmp) / "plan" / "plan.json").read_text())


def block(text: str) -> str:
    return f"{BEGIN}\n```text\n{text}\n```\n{END}"


def quoted(readme: str) -> str | None:
    """The excerpt README.md holds now (None: no block)."""
    m = re.search(re.escape(BEGIN) + r"\n```text\n(.*?)\n```\n" + re.escape(END), readme, re.S)
    return m.group(1) if m else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    text = excerpt(run_plan())
    readme = README.read_text()
    if a.write:
        old = quoted(readme)
        if old is None:
            raise SystemExit(f"{README}: no {BEGIN} ... {END} block to rewrite")
        README.write_text(readme.replace(block(old), block(text)))
    elif a.check and quoted(readme) != text:
        print(f"{README}: the worked plan differs from what the plan prints now:\n{text}", file=sys.stderr)
        return 1
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
