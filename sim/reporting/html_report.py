"""One self-contained HTML page for a run, sweep, plan or configuration-search folder, to share:
a summary table, the figures (PNG embedded as base64: the page needs no other file) and the
scenario.

    write_report(folder) -> Path   # folder/report.html
"""
from __future__ import annotations

import base64
import html
import tempfile
from pathlib import Path
from typing import Any

from sim.config.checks import json_object
from sim.config.errors import ScenarioError
from sim.files import write_file
from sim.reporting.analysis import load_run

STYLE = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left;
font-size:14px}th{background:#f3f3f3}img{max-width:100%;border:1px solid #eee;margin:0.5em 0}
pre{background:#f7f7f7;padding:1em;overflow:auto;font-size:13px}h1{font-size:1.6em}"""


def _table(rows: list[tuple[str, str]], head: tuple[str, str] | None = None) -> str:
    out = ["<table>"]
    if head:
        out.append("<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>")
    out += [f"<tr><td>{html.escape(str(a))}</td><td>{html.escape(str(b))}</td></tr>" for a, b in rows]
    return "\n".join(out + ["</table>"])


def _frame(df) -> str:
    return df.to_html(index=False, float_format=lambda v: f"{v:,.3g}", border=0, na_rep="-")


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
    rec = s.get("run") or {}
    rows += [("model / GPU", f"{rec.get('model')} / {rec.get('hardware')}"),
             ("cost model", str((rec.get("cost_model") or {}).get("name"))),
             ("servesim", str(rec.get("servesim_version")))]
    return rows


def write_report(folder: str | Path) -> Path:
    """folder/report.html for a run (summary.json), sweep (results.csv), plan (plan.json) or
    configuration search (search.json) folder."""
    from sim.reporting.plots import save_folder_plots, save_plots

    folder = Path(folder)
    body: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        if (folder / "summary.json").is_file():
            s = load_run(folder).summary  # (a damaged folder: one error naming the file)
            title = f"servesim run: {s.get('scenario')}"
            body += ["<h2>Summary</h2>", _table(_run_rows(s))]
            figures = save_plots(folder, out=tmp)
        elif (folder / "results.csv").is_file():
            from sim.planning.sweep import read_results  # (numbers checked: one error naming a bad cell)
            rows = read_results(folder / "results.csv")
            title = f"servesim sweep: {rows['scenario'].iloc[0] if len(rows) else folder.name}"
            keys = list(rows.columns[rows.columns.get_loc("scenario_sha256") + 1: rows.columns.get_loc("repeat")])
            cols = [c for c in (*keys, "repeat", "error", "request_throughput", "ttft_ms.p99", "tpot_ms.p99",
                                "itl_ms.p99", "goodput.met") if c in rows]
            body += [f"<h2>Runs ({len(rows)})</h2>", _frame(rows[cols])]
            figures = save_folder_plots(folder, out=tmp) if len(rows) else []
        elif (folder / "plan.json").is_file() or (folder / "search.json").is_file():
            from sim.planning.plan_report import headline
            from sim.planning.search_report import search_headline
            # a plan, or a configuration search: (its files' stem, title, headline rows)
            stem, kind, rows_of = (("plan", "plan", headline) if (folder / "plan.json").is_file()
                                   else ("search", "configuration search", search_headline))
            path = folder / f"{stem}.json"
            r = json_object(path.read_text(encoding="utf-8", errors="replace"), str(path), f"a {kind}")
            if "scenario" not in r:
                raise ScenarioError(f"{path}: not a servesim {kind} (no scenario key)")
            title = f"servesim {kind}: {r['scenario']}"
            body += ["<h2>Answer</h2>", _table(rows_of(r))]
            if (folder / f"{stem}.md").is_file():
                body += [f"<h2>{stem}.md</h2>", f"<pre>{html.escape((folder / f'{stem}.md').read_text())}</pre>"]
            figures = save_folder_plots(folder, out=tmp)
        else:
            raise ScenarioError(f"{folder}: not a run, sweep, plan or search folder (no summary.json, results.csv, "
                                "plan.json or search.json)")
        body += ["<h2>Figures</h2>"] + [_img(Path(p)) for p in figures]
    scenario = folder / "scenario.yaml"
    if scenario.is_file():
        body += ["<h2>Scenario</h2>", f"<pre>{html.escape(scenario.read_text())}</pre>"]
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>\n" + "\n".join(body)
            + f"\n<p><small>{html.escape(str(folder))}</small></p></body></html>\n")
    return write_file(folder / "report.html", page)
