"""`servesim plan`'s options as a library call (sim/planning/plan_request.py): the mini-languages
parsed by hand, every check before any simulation, and a job a notebook can run without the CLI."""
from pathlib import Path

import pytest

from sim.config.errors import ScenarioError
from sim.planning.plan_request import (
    PlanRequest,
    parse_backends,
    parse_int_list,
    parse_offload_list,
    parse_on_off,
    parse_spec_list,
    parse_split_list,
    prepare,
)

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"


def test_the_option_mini_languages_by_hand():
    assert parse_int_list("--tp", "1, 2,8") == (1, 2, 8) and parse_int_list("--tp", None) is None
    assert parse_on_off("--prefix-caching", "on,OFF") == [True, False] and parse_on_off("--x", None) == []
    assert parse_spec_list("off,eagle:3:0.7,draft:4:0.6:llama-3.2-1b") == [
        None, {"method": "eagle", "num_speculative_tokens": 3, "acceptance_rate": 0.7},
        {"method": "draft", "num_speculative_tokens": 4, "acceptance_rate": 0.6, "draft_model": "llama-3.2-1b"}]
    assert parse_split_list("off,1:3, 2:2") == [None, (1, 3), (2, 2)]
    assert parse_offload_list("0, 16,64,16") == [None, 16.0, 64.0] and parse_offload_list(None) == []
    assert parse_backends("deepep_low_latency, allgather_reducescatter") == ["deepep_low_latency",
                                                                              "allgather_reducescatter"]
    for call, message in ((lambda: parse_int_list("--tp", "1,0"), "--tp: '0' is not an integer >= 1"),
                          (lambda: parse_on_off("--prefix-caching", "yes"), "--prefix-caching: 'yes' is not on or off"),
                          (lambda: parse_spec_list("eagle:x"), "--speculative: 'eagle:x' is not off or METHOD"),
                          (lambda: parse_split_list("1:0"), "--disaggregation: '1:0' is not off or P:D"),
                          (lambda: parse_offload_list("-1"), "--kv-offloading-size: '-1' is not a size in GiB"),
                          (lambda: parse_backends("nccl"), "--all2all-backend: 'nccl' is not one of")):
        with pytest.raises(ScenarioError, match=message.replace("(", r"\(")):
            call()


def test_prepare_checks_everything_before_a_simulation(tmp_path):
    ok = PlanRequest(QUICKSTART, slo="ttft_ms=500", out=tmp_path / "p")
    job = prepare(ok)
    assert job.label == "planning" and job.out_dir == tmp_path / "p" and job.slo.ttft_ms == 500
    assert job.options.seeds == 4 and job.options.first_seeds == 2 and job.options.max_seeds == 8
    search = prepare(PlanRequest(QUICKSTART, slo="ttft_ms=500", out=tmp_path / "s", tp="1,2"))
    assert search.label == "searching"
    notes: list[str] = []
    prepare(PlanRequest(QUICKSTART, slo="ttft_ms=500", out=tmp_path / "n"), note=notes.append)
    assert notes == []  # quickstart's measured profile is shipped: nothing guessed
    bad = {"target_rate": -1.0, "confidence": 0.2, "schedulers": "fastest", "disaggregation": "1:x",
           "max_num_seqs": "8,x"}
    messages = {"target_rate": "--target-rate: -1.0 is not a finite number > 0",
                "confidence": "--confidence: 0.2 is not in [0.5, 1)",
                "schedulers": "--schedulers: unknown scheduler 'fastest'",
                "disaggregation": "--disaggregation: '1:x' is not off or P:D",
                "max_num_seqs": "--max-num-seqs: 'x' is not an integer >= 1"}
    for key, value in bad.items():
        with pytest.raises(ScenarioError) as err:
            prepare(PlanRequest(QUICKSTART, slo="ttft_ms=500", out=tmp_path / key, **{key: value}))
        assert str(err.value).startswith(messages[key]), (key, str(err.value))
    # a rate is any number > 0, even given as a whole one (the Python API: target_rate=-1 was "not an integer")
    with pytest.raises(ScenarioError, match=r"^--target-rate: -1 is not a finite number > 0$"):
        prepare(PlanRequest(QUICKSTART, slo="ttft_ms=500", out=tmp_path / "r", target_rate=-1))
    (tmp_path / "file").write_text("x")
    with pytest.raises(ScenarioError, match="exists and is not a directory"):
        prepare(PlanRequest(QUICKSTART, slo="ttft_ms=500", out=tmp_path / "file"))
    assert not any((tmp_path / k).exists() for k in bad)  # nothing written by a refused request


def test_prices_are_the_users_where_given_and_refused_when_ambiguous(tmp_path):
    from sim.planning.plan_request import parse_prices

    assert parse_prices("h100-sxm=2.5, h200=3.4") == {"h100-sxm": 2.5, "h200": 3.4} and parse_prices(None) == {}
    for text, says in (("tpu=1", "unknown GPU 'tpu'"), ("h200=abc", "write NAME=USD"), ("h200", "write NAME=USD"),
                       ("h200=-1", "write NAME=USD"), ("h200=inf", "write NAME=USD"),
                       # one GPU twice (by an alias too): refused, not the last kept
                       ("h100-sxm=2,h100=3", r"h100-sxm is priced twice \(\$2 and \$3\)")):
        with pytest.raises(ScenarioError, match=says):
            parse_prices(text)
    one = prepare(PlanRequest(QUICKSTART, slo="ttft_ms=500", out=tmp_path / "a", gpu_hour_usd=1.0))
    assert one.prices == {"h100-sxm": 1.0}  # quickstart's GPU: the plan's price
    search = prepare(PlanRequest(QUICKSTART, slo="ttft_ms=500", out=tmp_path / "b", gpus="h100-sxm,h200",
                                 price="h200=3.4"))
    assert search.prices == {"h200": 3.4}  # the H100 keeps its preset's price
    with pytest.raises(ScenarioError, match="--gpu-hour-usd: one price for 2 GPU types"):
        prepare(PlanRequest(QUICKSTART, slo="ttft_ms=500", out=tmp_path / "c", gpus="h100-sxm,h200", gpu_hour_usd=1.0))
    with pytest.raises(ScenarioError, match="--price a100-80gb: not a GPU this plan uses"):
        prepare(PlanRequest(QUICKSTART, slo="ttft_ms=500", out=tmp_path / "d", price="a100-80gb=1.2"))


def test_unmet_says_why_a_plan_found_no_load(tmp_path):
    job = prepare(PlanRequest(QUICKSTART, slo="ttft_ms=500", out=tmp_path / "u"))
    assert job.unmet({"load_search": {"answer": 4.0, "next": 4.2}}) == []
    assert job.unmet({"load_search": {"answer": None, "next": 0.5}}) == [
        "no load meets the SLO: one replica fails it even at 0.5 req/s (plan.md says how)"]
    # which target fails there, by how much, at its own percentile (a stopped run: a lower bound)
    point = {"steady": {"binding": "tpot_ms", "mean_ratio": {"tpot_ms": 12.5, "ttft_ms": 0.2}}, "stopped": 0}
    result = {"load_search": {"answer": None, "next": 0.5, "next_point": point},
              "slo": {"ttft_ms": 500, "tpot_ms": 0.5, "percentile": 99}, "slo_percentiles": {"tpot_ms": 90}}
    assert job.unmet(result) == [
        "no load meets the SLO: one replica fails it even at 0.5 req/s, where p90 TPOT is 12.5x its 0.5 ms target "
        "(tpot_ms); at the lowest load tried the requests barely queue, so the target is likely below what one "
        "request alone takes (plan.md says how)"]
    point.update(steady={"binding": "ttft_ms", "mean_ratio": {"ttft_ms": 1.5}}, stopped=2)
    assert "p99 TTFT is 1.5x or more (its runs stopped early, certain to miss) its 500 ms target" in job.unmet(result)[0]


def test_latency_vs_load_draws_every_load_with_its_own_verdict(tmp_path, monkeypatch):
    """Every point of plan.json's curve is in the figure, and a point that failed is drawn as failed
    even where its mean over seeds lies inside the SLO (load 3 here: 450 ms mean, 2 of 3 seeds)."""
    import matplotlib.axes

    from sim.planning.plan_report import _plots

    def point(load, met, mean, lo, hi, seeds, located=False):
        q = {"p50": mean / 3, "p90": mean / 2, "p99": mean, "slo": mean, "slo_range": [lo, hi]}
        return {"load": load, "met": met, "located_only": located, "seeds": seeds, "passes": seeds if met else 0,
                "ttft_ms": q}
    curve = [point(1.0, True, 100, 100, 100, 1, located=True), point(2.0, True, 300, 250, 350, 3),
             point(3.0, False, 450, 300, 620, 3), point(4.0, False, 700, 700, 700, 1, located=True),
             point(5.0, False, 900, 800, 1000, 3)]
    r = {"scenario": "s", "model": "m", "hardware": "h", "slo": {"ttft_ms": 500.0, "percentile": 99.0},
         "load_search": {"curve": curve, "answer": 2.0, "unit": "req/s"}}
    drawn: list[tuple[str, list[float]]] = []
    real = matplotlib.axes.Axes.scatter

    def spy(self, x, y, *args, **kwargs):
        drawn.append((kwargs.get("label", ""), list(x)))
        return real(self, x, y, *args, **kwargs)
    monkeypatch.setattr(matplotlib.axes.Axes, "scatter", spy)
    _plots(r, tmp_path)
    assert sorted(x for _, xs in drawn for x in xs) == [1.0, 2.0, 3.0, 4.0, 5.0]
    failed = sorted(x for label, xs in drawn if label.startswith("failed") for x in xs)
    assert failed == [3.0, 4.0, 5.0]
    assert (tmp_path / "latency_vs_load.png").stat().st_size > 10_000


def test_token_budget_share_by_hand():
    """slo._budget_share: tokens per iteration over max_num_batched_tokens, a row counting `count`
    alike iterations: (100 + 3 x 10) / (4 x 200) = 0.1625; no budget for static batching."""
    from types import SimpleNamespace

    import pandas as pd

    from sim.planning.slo import _budget_share

    steps = pd.DataFrame({"count": [1, 3], "prefill_tokens": [100, 0], "decode_tokens": [0, 10]})
    chunked = SimpleNamespace(engine=SimpleNamespace(scheduler="chunked", max_num_batched_tokens=200))
    static = SimpleNamespace(engine=SimpleNamespace(scheduler="static", max_num_batched_tokens=200))
    assert _budget_share(chunked, steps) == 130 / 800
    assert _budget_share(static, steps) is None
