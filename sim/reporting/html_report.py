"""One self-contained HTML page for a run, sweep, plan or configuration-search folder, to share:
a summary table, interactive figures (sim/reporting/interactive.py: Plotly, its library embedded
once, so the page works offline and needs no other file), plan.md / search.md rendered with their
tables as tables (markdown-it-py, which rich already brings), the static figures `servesim plot`
draws (PNG, embedded, under a fold), the scenario and where the step costs came from. The data
behind the page is embedded as JSON too (`read_report` gives it back).

    write_report(folder) -> Path   # folder/report.html
    read_report(path) -> dict      # {"kind", "summary" | "result" | "rows", ...} as embedded
"""
from __future__ import annotations

import base64
import html
import json
import re
import tempfile
from pathlib import Path
from typing import Any

from sim.config.checks import json_object
from sim.config.errors import ScenarioError
from sim.files import write_file
from sim.outputs import damaged_summary, read_json
from sim.reporting.analysis import as_written, load_run

STYLE = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;
font-size:14px}th{background:#f3f3f3}img{max-width:100%;border:1px solid #eee;margin:0.5em 0}
pre{background:#f7f7f7;padding:1em;overflow:auto;font-size:13px}h1{font-size:1.6em}
details{margin:1em 0}summary{cursor:pointer;font-weight:600}.figure{margin:1em 0}"""
DATA_ID = "servesim-data"  # the <script type="application/json"> holding the page's data


def _table(rows: list[tuple[str, str]], head: tuple[str, str] | None = None) -> str:
    out = ["<table>"]
    if head:
        out.append("<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>")
    out += [f"<tr><td>{html.escape(str(a))}</td><td>{html.escape(str(b))}</td></tr>" for a, b in rows]
    return "\n".join(out + ["</table>"])


# a sweep's columns as people read them (results.csv keeps the names its tools address)
HEADERS = {"request_throughput": "throughput (req/s)", "ttft_ms.p99": "p99 TTFT (ms)", "tpot_ms.p99": "p99 TPOT (ms)",
           "itl_ms.p99": "p99 ITL (ms)", "goodput.met": "SLO met"}


def _number(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"


def _frame(df) -> str:
    return df.rename(columns=HEADERS).to_html(index=False, float_format=_number, border=0, na_rep="-")


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<figure><img alt="{html.escape(path.name)}" src="data:image/png;base64,{data}"></figure>'


def _run_rows(s: dict) -> list[tuple[str, Any]]:  # (label, value shown as str() gives it)
    rows = [("completed requests", s.get("completed")), ("duration (s)", f"{s.get('duration_s', 0):.2f}"),
            ("request throughput (req/s)", f"{s.get('request_throughput', 0):.3f}"),
            ("output throughput (tokens/s)", f"{s.get('output_throughput', 0):,.0f}"),
            ("preemptions", s.get("preemptions"))]
    for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"), ("e2el_ms", "E2E latency")):
        d = s.get(key) or {}
        if d.get("p50") is not None:
            values = " / ".join(f"{d.get(p) or 0:,.1f}" for p in ("p50", "p90", "p99"))
            rows.append((f"{label} p50 / p90 / p99 (ms)", values))
    g = s.get("goodput")
    if isinstance(g, dict):
        rows.append(("SLO", "met" if g.get("met") else "missed") )
        rows.append(("goodput (req/s meeting the SLO)", f"{g.get('requests_per_s', 0):.3f}"))
    classes = s.get("classes")
    if isinstance(classes, dict):  # workload.classes: each class's requests and its SLO verdict
        for name, c in classes.items():
            if isinstance(c, dict):
                verdict = (c.get("goodput") or {}).get("met")
                ttft = (c.get("ttft_ms") or {}).get("p99")
                rows.append((f"class {name}", f"{c.get('completed', 0):,} of {c.get('requests', 0):,} served; p99 TTFT "
                             + (f"{ttft:,.1f} ms" if ttft is not None else "-")
                             + ("" if verdict is None else f"; SLO {'met' if verdict else 'missed'}")))
    agents = s.get("agents")
    if isinstance(agents, dict):  # agent sessions (docs/workload.md)
        span = agents.get("session_s") or {}
        rows.append(("agent sessions", f"{agents.get('sessions', 0):,}, {agents.get('calls_mean', 0):.2f} calls each; "
                                       f"session p50 / p99 {span.get('p50') or 0:,.1f} / "
                                       f"{span.get('p99') or 0:,.1f} s"))
    admission = s.get("admission")
    if isinstance(admission, dict):  # a gateway turned some away (docs/fleet.md)
        rows.append(("shed by the gateway", f"{admission.get('shed', 0):,} of {admission.get('offered', 0):,}"))
    fleet = s.get("autoscaling")
    if isinstance(fleet, dict):  # an autoscaled fleet
        rows.append(("GPU-hours (autoscaled)", f"{fleet.get('gpu_hours', 0):,.2f} (${fleet.get('usd', 0):,.2f}); "
                                               f"{fleet.get('mean_replicas', 0):.2f} replicas on average, at most "
                                               f"{fleet.get('peak_replicas')}"))
    rows += _feature_rows(s)
    rec = s.get("run") or {}
    rows += [("model / GPU", f"{rec.get('model')} / {rec.get('hardware')}"),
             ("cost model", str((rec.get("cost_model") or {}).get("name"))),
             ("servesim", str(rec.get("servesim_version")))]
    return rows


def _summary_rows(s: dict, folder: Path) -> list[tuple[str, Any]]:
    """_run_rows(s); a section edited out of shape (text where a count is) is one line naming the
    file, not a traceback from a format string."""
    try:
        return _run_rows(s)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise damaged_summary(folder, None, e) from None


def _feature_rows(s: dict) -> list[tuple[str, Any]]:
    """Each feature's own line, as `servesim run` prints it (sim/features/: LoRA, KV offloading,
    energy, faults), under its name. A section edited out of shape is said, not guessed at."""
    from sim.features.registry import FEATURES

    rows: list[tuple[str, Any]] = []
    for key, feature in FEATURES.items():
        section = s.get(key)
        if not isinstance(section, dict) or not section:
            continue
        try:
            said = feature.line(section)
        except (KeyError, TypeError, ValueError, AttributeError):
            said = "(the summary's section is not as servesim writes it)"
        if said:
            rows.append((key, said))
    return rows


def _markdown(path: Path, folder: Path) -> str:
    """A report's markdown (plan.md, search.md) as HTML: tables as tables; an image it links to in
    the folder embedded, any other image link left as its alt text (the page stands alone)."""
    from markdown_it import MarkdownIt

    def image(m: re.Match) -> str:
        target = folder / m.group(2)
        # only the folder's own PNG files: not a link planted there (its target, maybe a file of the
        # user's, would go into a page made to be shared), nor a path out of the folder
        if target.parent == folder and target.suffix == ".png" and target.is_file() and not target.is_symlink():
            return f'<img alt="{html.escape(m.group(1))}" src="data:image/png;base64,' \
                   f'{base64.b64encode(target.read_bytes()).decode()}">'
        return html.escape(m.group(1))
    text = path.read_text(encoding="utf-8", errors="replace")
    # images first, as raw HTML (markdown-it leaves it; user text in the markdown is escaped below)
    parts = re.split(r"(!\[[^\]]*\]\([^)\s]+\))", text)
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    out = []
    for part in parts:
        m = re.fullmatch(r"!\[([^\]]*)\]\(([^)\s]+)\)", part)
        out.append(f"<figure>{image(m)}</figure>" if m else md.render(part))
    return "\n".join(out)


def _figures_html(figures: list) -> list[str]:
    """Each Plotly figure as a div; the library itself only with the first (inline: no CDN)."""
    config = {"displaylogo": False, "responsive": True,
              "toImageButtonOptions": {"format": "png", "scale": 2}}
    return [f'<div class="figure">{fig.to_html(full_html=False, include_plotlyjs=i == 0, config=config)}</div>'
            for i, fig in enumerate(figures)]


def write_report(folder: str | Path) -> Path:
    """folder/report.html for a run (summary.json), sweep (results.csv), plan (plan.json) or
    configuration search (search.json) folder."""
    from sim.reporting import interactive
    from sim.reporting.plots import save_folder_plots, save_plots

    folder = Path(folder)
    body: list[str] = []
    live: list = []  # interactive figures
    after: list[str] = []  # what follows them
    data: dict[str, Any]
    with tempfile.TemporaryDirectory() as tmp:
        if (folder / "summary.json").is_file():
            run = load_run(folder)  # (a damaged folder: one error naming the file)
            s = run.summary
            title = f"servesim run: {s.get('scenario')}"
            body += ["<h2>Summary</h2>", _table(_summary_rows(s, folder))]
            live = interactive.run_figures(run)
            figures = save_plots(folder, out=tmp)
            data = {"kind": "run", "summary": s}
        elif (folder / "results.csv").is_file():
            from sim.planning.sweep import read_results  # (numbers checked: one error naming a bad cell)
            rows = read_results(folder / "results.csv")
            title = f"servesim sweep: {rows['scenario'].iloc[0] if len(rows) else folder.name}"
            keys = list(rows.columns[rows.columns.get_loc("scenario_sha256") + 1: rows.columns.get_loc("repeat")])
            cols = [c for c in (*keys, "repeat", "error", "request_throughput", "ttft_ms.p99", "tpot_ms.p99",
                                "itl_ms.p99", "goodput.met") if c in rows]
            body += [f"<h2>Runs ({len(rows)})</h2>", _frame(rows[cols])]
            live = interactive.sweep_figures(rows, keys)
            figures = save_folder_plots(folder, out=tmp) if len(rows) else []
            data = {"kind": "sweep", "keys": keys, "rows": json.loads(rows[cols].to_json(orient="records"))}
        elif (folder / "plan.json").is_file() or (folder / "search.json").is_file():
            from sim.planning.plan_report import headline
            from sim.planning.search_report import search_headline
            # a plan, or a configuration search: (its files' stem, title, headline rows)
            stem, kind, rows_of = (("plan", "plan", headline) if (folder / "plan.json").is_file()
                                   else ("search", "configuration search", search_headline))
            path = folder / f"{stem}.json"
            r = read_json(path, f"a {kind}")  # (strict: NaN or Infinity is damage)
            if "scenario" not in r:
                raise ScenarioError(f"{path}: not a servesim {kind} (no scenario key)")
            fleet = stem == "plan" and "static" in r and "policy" in r  # a fleet plan (sim/planning/fleet_plan.py)
            if fleet:
                from sim.planning.fleet_report import FLEET_PNG, fleet_headline
                kind, rows_of = "fleet plan", fleet_headline
            title = f"servesim {kind}: {r['scenario']}"
            with as_written(path, f"a {kind}"):
                body += ["<h2>Answer</h2>", _table(rows_of(r))]
                if fleet:  # its one figure, as plan wrote it
                    live, figures = [], [p for p in (folder / FLEET_PNG,) if p.is_file() and not p.is_symlink()]
                else:
                    live = interactive.plan_figures(r) if stem == "plan" else interactive.search_figures(r)
                    figures = save_folder_plots(folder, out=tmp)
            if (folder / f"{stem}.md").is_file():  # (after the figures: the whole report)
                after += [f"<h2>{stem}.md</h2>", _markdown(folder / f"{stem}.md", folder)]
            data = {"kind": "fleet plan" if fleet else stem, "result": r}
        else:
            raise ScenarioError(f"{folder}: not a run, sweep, plan or search folder (no summary.json, results.csv, "
                                "plan.json or search.json)")
        if live:
            body += ["<h2>Figures</h2>", "<p><small>Hover for values, drag to zoom (double-click resets), click "
                     "a legend entry to hide or show its series.</small></p>"] + _figures_html(live)
        if figures:
            body += [f"<details{'' if live else ' open'}><summary>Static figures ({len(figures)}, as "
                     "<code>servesim plot</code> draws them)</summary>"] + [_img(Path(p)) for p in figures] \
                + ["</details>"]
        body += after
    scenario = folder / "scenario.yaml"
    if scenario.is_file():
        body += ["<h2>Scenario</h2>", f"<pre>{html.escape(scenario.read_text())}</pre>"]
    # the data, for read_report: "</" escaped so that no text in it can close the script element
    embedded = json.dumps(data, allow_nan=False, default=str).replace("</", "<\\/")
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>\n" + "\n".join(body)
            + f'\n<script type="application/json" id="{DATA_ID}">{embedded}</script>'
            + f"\n<p><small>{html.escape(str(folder))}</small></p></body></html>\n")
    return write_file(folder / "report.html", page)


def read_report(path: str | Path) -> dict:
    """The data a report.html embeds: {"kind": "run", "summary": ...}, {"kind": "sweep", "keys",
    "rows"}, {"kind": "plan" | "search", "result": ...}. ScenarioError if it holds none."""
    path = Path(path)
    text = path.read_text(encoding="utf-8", errors="replace")
    m = re.search(rf'<script type="application/json" id="{DATA_ID}">(.*?)</script>', text, re.S)
    if m is None:
        raise ScenarioError(f"{path}: not a servesim report (no embedded data; reports before this version "
                            "have none: run servesim report again)")
    return json_object(m.group(1), str(path), "a report's data")
