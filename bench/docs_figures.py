"""docs/planner.md's "Answers for the bundled scenarios": run each command, print its row, check or rewrite.

    python bench/docs_figures.py            # print the rows (runs the five plans: ~1 min on 2 cores)
    python bench/docs_figures.py --check    # exit 1 if docs/planner.md's table differs from them
    python bench/docs_figures.py --write    # rewrite the table in docs/planner.md with them

Every number in a row's answer comes from the plan.json / search.json its command writes (the keys
are named in `plan_answer` and `search_answer`), so the table cannot drift from what `servesim plan`
prints: tests/test_docs_figures.py runs --check's comparison. A row's remark (`NOTES`) is hand-written
and carries no figure the plan prints. Wall times are left out: they are the machine's, not the plan's
(each scenario's header says how long it runs).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "planner.md"
BEGIN, END = "<!-- bundled-answers: begin (bench/docs_figures.py --write) -->", "<!-- bundled-answers: end -->"
COMMANDS = (
    "servesim plan scenarios/chat-llama3-8b-h100.yaml --target-rate 50 --set cost_model=roofline",
    "servesim plan scenarios/quickstart.yaml --target-rate 40",
    "servesim plan scenarios/azure-conv-replay.yaml --target-rate 100 --set cost_model=roofline",
    "servesim plan scenarios/closed-loop-llama3-8b-h100.yaml --target-users 200 --set cost_model=roofline",
    "servesim plan scenarios/plan-llama3-70b-gpus.yaml --gpus h100-sxm,h200,a100-80gb --tp 2,4,8 --target-rate 40",
)
NOTES = {  # hand-written remarks, no figure the plan prints
    COMMANDS[2]: "a deterministic trace replay (1 seed per load); the plan warns that the 120-request trace is short",
    COMMANDS[4]: "every cheaper count of the other candidates misses (above)",
}


def _n(v: float, unit: str) -> str:
    return f"{v:.0f}" if unit == "users" else f"{v:.2f}"


def plan_answer(plan: dict) -> str:
    """One row's answer from plan.json: load_search (answer, estimate), tradeoff (the two curves),
    recommendation, band, cluster, cost, simulations."""
    keys = ("load_search", "recommendation", "tradeoff", "band", "cluster", "cost")
    ls, rec, t, band, cl, cost = (plan[k] for k in keys)
    unit = ls["unit"]
    per = "users" if unit == "users" else unit
    parts = [f"**{_n(ls['answer'], unit)} {per} per replica** with the scenario's setting"]
    est = ls.get("estimate")
    if est and est.get("interval_90"):
        lo, hi = est["interval_90"]
        parts[0] += f", estimate {_n(est['load'], unit)} ({_n(lo, unit)}-{_n(hi, unit)})"
    if ls["knob"] == "workload.time_scale":
        parts[0] += f" (time_scale {ls['answer_setting']:.2f})"
    seqs = ", ".join(f"{x['max_num_seqs']}: {_n(x['sustained'], unit)}" for x in t["max_num_seqs"])
    tokens = ", ".join(f"{x['max_num_batched_tokens']}: {_n(x['sustained'], unit)}"
                       for x in t["max_num_batched_tokens"])
    parts.append(f"curve (max_num_seqs): {seqs}; (max_num_batched_tokens): {tokens}")
    parts.append(f"chosen {rec['max_num_seqs']} / {rec['max_num_batched_tokens']}, "
                 f"**{_n(rec['per_replica_load'], unit)} {per}**")
    parts.append(f"error band {_n(band['steps_slower']['answer'], unit)} {per} if real steps take "
                 f"{band['slower'] - 1:+.1%}, {_n(band['steps_faster']['answer'], unit)} if {band['faster'] - 1:+.1%}")
    p = cl["point"].get("bettable", {}).get("probability")
    parts.append(f"{cl['replicas']} replicas for {_n(cl['target'], unit)} {per}"
                 + (f" (the whole cluster simulated, P ~ {p:.2f} a fresh run meets the SLO)" if p is not None else ""))
    parts.append(f"${cost['usd_per_hour']:.2f}/hour, ${cost['usd_per_million_output_tokens']:.3f} per million "
                 f"output tokens; {plan['simulations']} simulations")
    return "; ".join(parts)


def search_answer(search: dict) -> str:
    """One row's answer from search.json: chosen, the confirmed candidates, simulations."""
    c = search["chosen"]
    head = (f"**{c['gpu']} x {c['gpus']} ({c['replicas']} replicas of TP{c['tensor_parallel_size']}), "
            f"${c['usd_per_hour']:.2f}/hour**")
    others = [f"{x['gpu']} TP{x['tensor_parallel_size']} at {x['replicas']} replicas (${x['usd_per_hour']:.2f}/hour, "
              f"P ~ {x['cluster']['point']['bettable']['probability']:.2f})"
              for x in search["candidates"] if x.get("status") == "confirmed"]
    return f"{head}; confirmed: {', '.join(others)}; {search['simulations']} simulations"


def run(command: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        args = command.split()[2:] + ["--out", str(Path(tmp) / "out"), "-q"]  # (after "servesim plan")
        subprocess.run([sys.executable, str(ROOT / "cli.py"), "plan", *args], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        out = Path(tmp) / "out"
        if (out / "search.json").is_file():
            return search_answer(json.loads((out / "search.json").read_text()))
        return plan_answer(json.loads((out / "plan.json").read_text()))


def table(answers: dict[str, str]) -> str:
    lines = ["| command | answer |", "| --- | --- |"]
    for command in COMMANDS:
        note = NOTES.get(command)
        lines.append(f"| `{command}` | {answers[command]}{'; ' + note if note else ''} |")
    return "\n".join(lines)


def quoted(text: str) -> str | None:
    if BEGIN not in text or END not in text:
        return None
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    new = table({c: run(c) for c in COMMANDS})
    text = DOC.read_text()
    if a.write:
        if quoted(text) is None:
            print(f"{DOC}: no {BEGIN} ... {END} block", file=sys.stderr)
            return 2
        before, rest = text.split(BEGIN, 1)
        DOC.write_text(f"{before}{BEGIN}\n{new}\n{END}{rest.split(END, 1)[1]}")
        print(f"wrote {DOC}")
    elif a.check:
        if quoted(text) != new:
            print(f"{DOC}'s bundled answers are stale: python bench/docs_figures.py --write", file=sys.stderr)
            return 1
        print("docs/planner.md's bundled answers match")
    else:
        print(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
