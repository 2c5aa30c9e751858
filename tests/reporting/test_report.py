"""`servesim report`: one page per run, sweep, plan or configuration search, interactive figures
(Plotly, its library inlined once), markdown tables as tables, and the data embedded to read back.
The `browser` tests open each page in headless Chromium (apt-get install chromium; pytest -m browser)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import servesim
from cli import app
from sim.reporting.html_report import read_report
from sim.reporting.interactive import MAX_POINTS

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
runner = CliRunner()
PLOTLY_BANNER = re.compile(r"\* plotly\.js v\d")  # the library's own header comment: once per page


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """A run, a sweep, a plan and a configuration search, small, each with its report."""
    base = tmp_path_factory.mktemp("reports")
    small = ["--set", "workload.num_requests=120"]
    plan = ["--slo", "ttft_ms=500,tpot_ms=50,percentile=99", "--horizon-s", "10", "--min-requests", "100",
            "--resolution", "0.2", "--seeds", "1", "--workers", "1", "-q"]
    commands = {
        "run": ["run", str(QUICKSTART), "--out", str(base / "run"), "-q", *small],
        "sweep": ["sweep", str(QUICKSTART), "--grid", "engine.max_num_seqs=16,64", "--grid",
                  "workload.arrival.rate=4,8", "--out", str(base / "sweep"), "--workers", "1", "-q", *small],
        "plan": ["plan", str(QUICKSTART), "--out", str(base / "plan"), *plan],
        "search": ["plan", str(QUICKSTART), "--gpus", "h100-sxm,l40s", "--tp", "1", "--target-rate", "20",
                   "--out", str(base / "search"), *plan],
    }
    for name, args in commands.items():
        done = runner.invoke(app, args)
        assert done.exit_code == 0, (name, done.output)
        report = runner.invoke(app, ["report", str(base / name)])
        assert report.exit_code == 0, (name, report.output)
        assert report.stdout.strip() == str(base / name / "report.html")
    return {name: base / name for name in commands}


@pytest.mark.parametrize("kind, figures", [("run", 3), ("sweep", 1), ("plan", 1), ("search", 1)])
def test_each_page_has_its_interactive_figures_and_the_library_once(folders, kind, figures):
    page = (folders[kind] / "report.html").read_text()
    assert page.count('class="plotly-graph-div"') == figures
    assert len(PLOTLY_BANNER.findall(page)) == 1  # inlined, once: no CDN, nothing to fetch
    assert not re.search(r"<script[^>]+src=", page)
    assert "<details" in page and "data:image/png;base64," in page  # the static figures, folded


def test_plan_and_search_markdown_become_tables_with_their_images_embedded(folders):
    for kind in ("plan", "search"):
        md = (folders[kind] / f"{kind}.md").read_text()
        page = (folders[kind] / "report.html").read_text()
        md_tables = len(re.findall(r"^\|(?:\s*:?-{3,}:?\s*\|)+$", md, re.M))  # one separator row per table
        assert md_tables > 0 and page.count("<table>") >= md_tables + 1  # and the answer's
        section = page.split(f"<h2>{kind}.md</h2>")[1].split("<h2>Scenario</h2>")[0]  # (not the library)
        # no markdown pasted raw (a code block in it renders as <pre><code>)
        assert not re.search(r"<pre>(?!<code>)", section) and "![" not in section and "|---" not in section
        for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md):
            assert (folders[kind] / image).is_file()
        assert section.count('src="data:image/png;base64,') == len(re.findall(r"!\[", md))


def test_the_data_behind_each_page_reads_back(folders):
    run = read_report(folders["run"] / "report.html")
    assert run["kind"] == "run" and run["summary"] == json.loads((folders["run"] / "summary.json").read_text())
    plan = servesim.read_report(folders["plan"] / "report.html")
    assert plan["kind"] == "plan" and plan["result"] == json.loads((folders["plan"] / "plan.json").read_text())
    sweep = read_report(folders["sweep"] / "report.html")
    assert sweep["keys"] == ["engine.max_num_seqs", "workload.arrival.rate"] and len(sweep["rows"]) == 4
    with pytest.raises(servesim.ScenarioError, match="not a servesim report"):
        read_report(folders["run"] / "scenario.yaml")


def test_a_big_run_is_thinned_for_the_page_and_says_so(tmp_path):
    from sim.reporting.analysis import Run
    from sim.reporting.interactive import run_figures

    n = MAX_POINTS * 3 + 7
    result = servesim.run(QUICKSTART, workload__num_requests=n, workload__arrival={"process": "poisson", "rate": 50})
    cdf, ttft, over = run_figures(Run("big", result.requests, result.steps, result.summary))
    assert ttft.layout.title.text == f"TTFT by arrival time ({MAX_POINTS:,} of {n:,} shown)"
    assert len(ttft.data[0].x) == MAX_POINTS
    assert len(result.steps) > MAX_POINTS  # (so the batch/KV figure was thinned too, and says so)
    assert over.layout.title.text.endswith(f"(each replica's series thinned to {MAX_POINTS:,} points)")
    assert all(len(trace.x) <= MAX_POINTS for trace in over.data)
    assert all(len(trace.x) <= MAX_POINTS for trace in cdf.data)
    # the CDF keeps its ends: the fastest and slowest request, at 1/n and 1
    ttft_ms = np.sort(result.requests["ttft_s"].to_numpy()) * 1e3
    assert cdf.data[0].x[0] == ttft_ms[0] and cdf.data[0].x[-1] == ttft_ms[-1] and cdf.data[0].y[-1] == 1.0


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if found is None:
        pytest.fail("no Chromium: apt-get install -y chromium (the browser tests need it)")
    return found


@pytest.mark.browser
@pytest.mark.parametrize("kind, figures", [("run", 3), ("sweep", 1), ("plan", 1), ("search", 1)])
def test_the_page_renders_in_headless_chromium_without_console_errors(folders, tmp_path, kind, figures):
    from matplotlib.image import imread

    url = (folders[kind] / "report.html").as_uri()
    flags = ["--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--virtual-time-budget=8000",
             "--enable-logging=stderr", "--v=0"]
    shot = tmp_path / f"{kind}.png"
    done = subprocess.run([_chromium(), *flags, "--window-size=1280,2000", f"--screenshot={shot}", url],
                          capture_output=True, text=True, timeout=120)
    console = [line for line in done.stderr.splitlines() if "CONSOLE" in line]
    assert not console, console  # any message the page logs: an error, a warning, a deprecation
    pixels = imread(shot)
    assert pixels.shape[:2] == (2000, 1280) and pixels[..., :3].std() > 0.05  # drawn, not blank
    dom = subprocess.run([_chromium(), *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    # Plotly drew each figure: an SVG of class main-svg per figure (plus one for its hover layer)
    assert dom.stdout.count('class="main-svg"') >= figures
    assert len(re.findall(r'<div[^>]+class="[^"]*js-plotly-plot', dom.stdout)) == figures  # (the class Plotly adds)


def test_a_link_planted_as_a_plans_figure_is_not_read_into_the_page(folders, tmp_path):
    """plan.md links its figures by name: a symbolic link planted under one of those names (to a
    file of the user's) must not be embedded in a page made to be shared."""
    plan = tmp_path / "plan"
    shutil.copytree(folders["plan"], plan)
    secret = tmp_path / "secret.png"
    secret.write_bytes(b"\x89PNG\r\n\x1a\n" + b"private bytes" * 100)
    linked = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", (plan / "plan.md").read_text())[0]
    (plan / linked).unlink()
    (plan / linked).symlink_to(secret)
    done = runner.invoke(app, ["report", str(plan)])
    assert done.exit_code == 0, done.output
    import base64

    assert base64.b64encode(secret.read_bytes()).decode()[:200] not in (plan / "report.html").read_text()


def test_a_plans_latency_past_saturation_and_a_far_off_gpu_get_log_axes_and_legends_filled():
    """The plan page's TTFT panel turns log when its loads span decades (a linear axis to 45 s
    flattens the 500 ms target); the search page's cost axis turns log when one GPU is far off;
    a GPU with a confirmed candidate has a filled legend marker (its open ones share the entry)."""
    from sim.reporting.interactive import plan_figures, search_figures

    def point(load, ttft, met):
        return {"load": load, "met": met, "goodput_rps": load, "ttft_ms": {"slo": ttft}, "tpot_ms": {"slo": 20.0}}
    plan = {"slo": {"ttft_ms": 500, "tpot_ms": 50, "percentile": 99},
            "load_search": {"unit": "req/s", "answer": 20.0,
                            "curve": [point(10, 80.0, True), point(20, 300.0, True), point(25, 45000.0, False)]}}
    fig = plan_figures(plan)[0].to_dict()["layout"]
    assert fig["yaxis"]["type"] == "log" and fig["yaxis2"].get("type") in (None, "linear", "-")
    plan["load_search"]["curve"][2]["ttft_ms"]["slo"] = 700.0  # within a decade of 80 ms: linear
    assert plan_figures(plan)[0].to_dict()["layout"]["yaxis"].get("type") in (None, "linear", "-")

    def confirmed(gpu, tp, usd, ttft):  # a simulated cluster: its cost and its p99 TTFT at the target
        return {"gpu": gpu, "tensor_parallel_size": tp, "usd_per_hour": usd, "usd_per_gpu_hour": 3.0,
                "ttft_ms.p99_at_sustained": ttft + 30, "status": "confirmed", "max_num_seqs": 256,
                "max_num_batched_tokens": 8192, "cluster": {"point": {"ttft_ms": {"p99": ttft}}}}

    def dearer(gpu, tp, price, missed, ttft):  # shown at the least it can cost: one replica past the miss
        # (by last release's key name: a search.json an earlier release wrote reads the same)
        return {"gpu": gpu, "tensor_parallel_size": tp, "usd_per_gpu_hour": price, "ttft_p99_ms_at_sustained": ttft,
                "status": f"dearer: {missed} replicas miss", "cluster": {"beyond": missed}}
    search = {"target": 40, "unit": "req/s", "chosen": {"gpu": "h100-sxm", "tensor_parallel_size": 4},
              "candidates": [confirmed("h100-sxm", 4, 108.0, 468.0), dearer("h100-sxm", 8, 3.0, 4, 250.0),
                             dearer("h200", 8, 3.8, 3, 494.5), dearer("a100-80gb", 8, 180.0, 7, 495.2),
                             {"gpu": "a100-80gb", "tensor_parallel_size": 2, "pruned": "too small"}]}
    data = search_figures(search)[0].to_dict()
    assert data["layout"]["xaxis"]["type"] == "log"  # $108 to 8 x 8 x $180 = $11,520
    points = {(t["name"], x, y) for t in data["data"] if t["name"] != "chosen" for x, y in zip(t["x"], t["y"])}
    assert points == {("h100-sxm", 108.0, 468.0), ("h100-sxm", 5 * 8 * 3.0, 250.0),  # (as pareto.png places them)
                      ("h200 (none confirmed)", 4 * 8 * 3.8, 494.5), ("a100-80gb (none confirmed)", 8 * 8 * 180.0, 495.2)}
    legend = [(t["name"], t["marker"]["symbol"][0]) for t in data["data"]
              if t.get("showlegend", True) and t["name"] != "chosen"]
    assert legend == [("h100-sxm", "circle"), ("h200 (none confirmed)", "triangle-right-open"),
                      ("a100-80gb (none confirmed)", "triangle-right-open")]
    star = next(t for t in data["data"] if t["name"] == "chosen")
    assert (star["x"], star["y"]) == ([108.0], [468.0])
    search["candidates"][3]["usd_per_gpu_hour"] = 1.8  # all within a decade: linear
    assert search_figures(search)[0].to_dict()["layout"]["xaxis"].get("type") in (None, "linear", "-")


def test_a_run_page_shows_each_features_line_and_says_an_edited_section(tmp_path):
    """The page's summary table carries what `servesim run` prints of each feature (LoRA, KV
    offloading, energy, faults: sim/features/), which it once left out; a section edited out of
    shape is said, not guessed at, and the page is still written."""
    import html as html_lib

    from sim.features.registry import FEATURES
    out = tmp_path / "lora"
    done = runner.invoke(app, ["run", str(QUICKSTART), "--out", str(out), "-q", "--set", "workload.num_requests=60",
                               "--set", "engine.lora={max_loras: 2}", "--set", "workload.adapters={count: 3, share: 1}"])
    assert done.exit_code == 0, done.output
    assert runner.invoke(app, ["report", str(out)]).exit_code == 0
    page = html_lib.unescape((out / "report.html").read_text())
    summary = json.loads((out / "summary.json").read_text())
    for key in ("lora", "energy"):
        assert FEATURES[key].line(summary[key]) in page, key
    summary["lora"] = {"adapters_used": "x"}  # (kinds of the keys inside a section are not the reader's)
    (out / "summary.json").write_text(json.dumps(summary))
    assert runner.invoke(app, ["report", str(out)]).exit_code == 0
    assert "(the summary's section is not as servesim writes it)" in html_lib.unescape((out / "report.html").read_text())
