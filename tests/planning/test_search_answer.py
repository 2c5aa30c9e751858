"""The configuration search's answer against a known one, computed here by brute force: every
candidate's fewest confirmed replicas at the target, scanned up from one replica. The search must
choose the cheapest of those, and every figure it writes must say the same numbers."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from sim.planning.config_search import search_configs
from sim.planning.evaluator import Evaluator, PlanOptions
from sim.planning.load_search import load_knob
from sim.planning.search_report import candidate_point, search_headline, write_search_report
from sim.scenario import SLOConfig

REPO = Path(__file__).parents[2]
QUICKSTART = REPO / "scenarios" / "quickstart.yaml"
SLO = SLOConfig(ttft_ms=500, tpot_ms=50, percentile=99)
SMALL = PlanOptions(workers=2, horizon_s=30, min_requests=400, max_requests=2000, tail_requests=4, resolution=0.05)
TARGET = 70.0
PRICES = {"a100-80gb": 1.1}  # (cheap enough that the A100s' clusters must be simulated to be ruled out)
CANDIDATES = [("h100-sxm", 1), ("h100-sxm", 2), ("a100-80gb", 1), ("a100-80gb", 2)]


def fewest_confirmed(gpu: str, tp: int) -> int:
    """The fewest replicas whose cluster at TARGET a fresh run meets with P >= 0.9 (Evaluator.confirm),
    scanned from 1: what the search's branch and bound must agree with."""
    ev = Evaluator(QUICKSTART, SLO, (f"hardware={gpu}", f"engine.tensor_parallel_size={tp}"), options=SMALL)
    knob = load_knob(ev.scenario, ev.options)
    for n in range(1, 40):
        if ev.confirm(knob.overrides(TARGET, ev.options, replicas=n) + (f"engine.replicas={n}",), replicas=n)["met"]:
            return n
    raise AssertionError(f"{gpu} TP{tp}: no cluster of fewer than 40 replicas meets the SLO")


def test_the_search_chooses_the_cheapest_confirmed_cluster_and_every_file_agrees(tmp_path):
    r = search_configs(QUICKSTART, SLO, gpus=("h100-sxm", "a100-80gb"), tps=(1, 2), target=TARGET, options=SMALL,
                       prices=PRICES)
    price = {row["gpu"]: row["usd_per_gpu_hour"] for row in r["candidates"]}
    truth = {(g, tp): fewest_confirmed(g, tp) for g, tp in CANDIDATES}
    cost = {c: n * c[1] * price[c[0]] for c, n in truth.items()}
    best = min(cost.values())
    c = r["chosen"]
    assert c is not None and c["usd_per_hour"] == best  # no candidate is cheaper
    assert c["replicas"] == truth[c["gpu"], c["tensor_parallel_size"]]
    for row in r["candidates"]:
        key = (row["gpu"], row["tensor_parallel_size"])
        if row.get("status") == "confirmed":  # every confirmed count is the brute force's
            assert row["replicas"] == truth[key]
        else:  # shown dearer: by the count it ruled out, or its bound
            unit = row["tensor_parallel_size"] * row["usd_per_gpu_hour"]
            least = row["cluster"]["beyond"] + 1 if row.get("cluster") else row["replicas_lower_bound"]
            assert least * unit >= best and truth[key] >= least
    assert any(row.get("status", "").startswith("dearer") for row in r["candidates"])  # (the bound was used)
    # one source of truth: headline, search.json, search.md, the figure's points, --emit's count
    write_search_report(r, tmp_path)
    saved = json.loads((tmp_path / "search.json").read_text())
    assert saved["chosen"]["replicas"] == c["replicas"] and saved["chosen"]["usd_per_hour"] == best
    head = dict(search_headline(saved))["cheapest configuration"]
    assert head == (f"{c['gpu']} x {c['gpus']} ({c['replicas']} replicas of TP{c['tensor_parallel_size']}), "
                    f"${best:.2f}/hour")
    md = (tmp_path / "search.md").read_text()
    assert f"| {head} |" in md
    row = next(x for x in saved["candidates"] if x["gpu"] == c["gpu"] and x["tensor_parallel_size"] == c["tensor_parallel_size"])
    table = next(line for line in md.splitlines() if line.startswith(f"| {c['gpu']} | {c['tensor_parallel_size']} |"))
    band = row["band"]["replicas"]  # (this path's band, to first order: the test below)
    assert f"| {c['replicas']} | {c['gpus']} | {best:,.2f} | confirmed cluster; this path's band: " \
           f"{band[0]}-{band[1]} replicas |" in table
    x, _, kind = candidate_point(row, True)
    assert (x, kind) == (best, "confirmed")
    front = [f for f in saved["pareto"] if (f["gpu"], f["tensor_parallel_size"]) == (c["gpu"], c["tensor_parallel_size"])][0]
    assert front["usd_per_hour"] == best and front["ttft_ms.p99"] == row["cluster"]["point"]["ttft_ms"]["p99"]
    # one vocabulary: results.csv's name for the statistic; last release's key beside it, equal
    assert row["ttft_ms.p99_at_sustained"] == row["ttft_p99_ms_at_sustained"] is not None
    assert front["ttft_p99_ms_at_sustained"] == front["ttft_ms.p99"]
    assert math.isclose(c["cluster_point"]["bettable"]["confidence"], 0.9)
    # --emit deploys the same count (PlanJob.emit, from search.json's chosen)
    import yaml

    from sim.planning.plan_request import PlanRequest, prepare

    job = prepare(PlanRequest(QUICKSTART, slo="ttft_ms=500,tpot_ms=50", gpus="h100-sxm,a100-80gb", tp="1,2",
                              target_rate=TARGET, out=tmp_path / "s", emit=tmp_path / "deploy"))
    files = {p.name: p for p in job.emit(saved)}  # vllm_serve.sh, engine_args.yaml, k8s.yaml
    deployment = next(d for d in yaml.safe_load_all(files["k8s.yaml"].read_text()) if d["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == c["replicas"]
    assert f"--tensor-parallel-size {c['tensor_parallel_size']}" in files["vllm_serve.sh"].read_text()


def test_each_confirmed_cluster_carries_its_own_paths_band():
    """The GPU search's band (config_search._replica_band): this GPU x TP path's step-time factors
    (sim/cost/error_band.step_factors) carried into the confirmed replicas to first order, by hand:
    ceil(n x faster) .. ceil(n x slower). An A100 (tables of another GPU, overheads fitted on H100)
    is bracketed more widely than the validated H100, and the headline says so."""
    import math

    from sim.cost.error_band import step_factors
    from sim.planning.config_search import _replica_band
    from sim.planning.search_report import search_headline
    from sim.scenario import load_scenario

    path = "scenarios/plan-llama3-70b-gpus.yaml"
    h100 = load_scenario(path, ["hardware=h100-sxm", "engine.tensor_parallel_size=4"])
    a100 = load_scenario(path, ["hardware=a100-80gb", "engine.tensor_parallel_size=8"])
    fh, fa = step_factors(h100), step_factors(a100)
    assert fa["slower"] > fh["slower"] >= 1 >= fh["faster"] > fa["faster"]
    b = _replica_band(a100, 17, 14.4)
    lo, hi = math.ceil(17 * fa["faster"]), math.ceil(17 * fa["slower"])
    assert b["replicas"] == [lo, hi] and b["usd_per_hour"] == pytest.approx([lo * 14.4, hi * 14.4])
    assert lo < 17 < hi and "a100-80gb" in b["basis"]
    assert _replica_band(load_scenario(path, ["cost_model=unit"]), 6, 12.0) is None
    r = {"slo_label": "x", "model": "m", "target": 20.0, "headroom": 1.0, "target_unit": "req/s",
         "candidates": [], "simulations": 0,
         "chosen": {"gpu": "a100-80gb", "gpus": 136, "replicas": 17, "tensor_parallel_size": 8, "usd_per_hour": 244.8,
                    "max_num_seqs": 256, "max_num_batched_tokens": 8192, "vllm_serve": "vllm serve m", "band": b}}
    said = dict(search_headline(r))["error band (this path)"]
    assert said.startswith(f"real vLLM may need {lo}-{hi} replicas (${lo * 14.4:,.2f}-${hi * 14.4:,.2f}/hour in GPUs)")
