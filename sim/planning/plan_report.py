"""The plan as files: plan.json (the dict sim/planner.plan returns), plan.md and PNG plots.

    write_report(result, out_dir) -> list[Path]    # plan.json, plan.md, latency_vs_load.png, ...
    headline(result) -> list[tuple[str, str]]      # the short table the CLI prints

Loads are shown in their unit (req/s offered, or users); a trace replay's also as its time_scale.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sim.cost.registry import describe
from sim.files import plain_text, save_figure, write_file
from sim.schedulers import SCHEDULERS

LATENCY_PNG = "latency_vs_load.png"
TRADEOFF_PNG = "load_vs_engine.png"


def _f(v: Any, digits: int = 1) -> str:
    if v is None:
        return "-"
    return f"{v:,.{digits}f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v)


def _load(v: Any, unit: str) -> str:
    return f"{int(v)} {unit}" if unit == "users" else f"{v:.2f} {unit}" if v >= 1 else f"{v:.3g} {unit}"


def _native(r: dict) -> float | None:
    """A trace replay's native rate (req/s at time_scale 1); None for a generated workload."""
    return r.get("workload", {}).get("native_rate")


def _loads(r: dict):
    """load -> text: '12.34 req/s', '64 users', or for a trace '12.34 req/s (time_scale 4.69)'."""
    unit, native = r["load_search"]["unit"], _native(r)
    return lambda v: _load(v, unit) + ("" if native is None else f" (time_scale {v / native:.4g})")


def _load_cells(r: dict) -> tuple[list[str], Any]:
    """The first cells of a judged point's row: its load, and a trace's time_scale."""
    if r["load_search"]["unit"] == "users":
        return ["load (users)"], lambda p: [str(int(p["load"]))]
    rate = lambda p: _load(p["load"], "req/s").split()[0]  # noqa: E731  (3 digits below 1 req/s)
    if _native(r) is None:
        return ["load (req/s)"], lambda p: [rate(p)]
    return ["load (req/s)", "time_scale"], lambda p: [rate(p), f"{p['setting']:g}"]


def _setting(r: dict, p: dict) -> str:
    text = f"max_num_seqs {p['max_num_seqs']}"
    kind = SCHEDULERS.get(r["engine"]["scheduler"])
    if kind is not None and kind.token_budget and kind.chunks_prompts:  # the budget was searched
        text += f", max_num_batched_tokens {p['max_num_batched_tokens']}"
    return text


def _seeds(p: dict) -> str:
    return f"{p['passes']}/{p['seeds']}"


def headline(r: dict) -> list[tuple[str, str]]:
    """(label, value) rows: the answer in a few lines."""
    s, load = r["load_search"], _loads(r)
    targets = r.get("slo_label") or _slo_label(r["slo"])
    rows = [("SLO", targets)]
    w = r.get("workload", {})
    if _native(r) is not None:
        rows.append(("trace", f"{w['requests']} requests over {w['span_s']:.1f} s: {w['native_rate']:.3f} req/s "
                              f"native ({w['native_rate_definition']}); load = time_scale x that"))
    if s["answer"] is None:
        rows.append(("sustained load per replica", f"none: the SLO fails even at {load(s['next'])}"))
        return rows
    c = s["confidence"]
    nxt = s.get("next_point") or {}
    noise = " (within the seeds' noise: the mean decides)" if c.get("next_within_noise") else ""
    rows += [("sustained load per replica, scenario's setting", load(s["answer"])),
             (f"next step up (fails{noise})", load(s["next"]) + (f", {_seeds(nxt)} seeds meet the SLO" if nxt else ""))]
    e = s.get("estimate")
    if e is not None:
        lo, hi = e["interval_90"]
        rows.append(("estimate from the seeds", f"{load(e['load'])}, 90% interval {load(lo)} - {load(hi)} "
                                                f"(where the mean p{_pct(r, e['binding'])} {_short(e['binding'])} "
                                                "crosses its target between the two grid loads)"))
    if c["method"] == "deterministic":
        rows.append(("confidence", "deterministic: the workload has no random component, so every seed "
                                   "simulates the same run; 1 seed per load"))
    else:
        fresh = c.get("fresh_run_probability")
        rows.append(("confidence", f"the mean percentile over {c['answer_seeds']} seeds is within every target "
                                   f"at 90% confidence ({_seeds(s['answer_point'])} seeds meet it one by one"
                                   + (f"; a fresh run of {r['run_length']['requests_at_answer']:,} requests "
                                      f"meets it with P ~ {fresh:.2f}" if fresh is not None and
                                      r.get("run_length", {}).get("requests_at_answer") else "") + ")"))
    rec, t = r["recommendation"], r["tradeoff"]
    tie = f"; ties on the grid: {', '.join(_setting(r, x) for x in t['ties'])}" if t.get("ties") else ""
    rows.append(("best engine setting (highest sustained load)", _setting(r, rec) + tie))
    best = t["chosen_search"]
    if any(rec[k] != r["engine"][k] for k in ("max_num_seqs", "max_num_batched_tokens")):
        rows.append(("sustained load per replica, best setting",
                     f"{load(best['answer'])}; {load(best['next'])} fails "
                     f"({_seeds(best['answer_point'])} and {_seeds(best['next_point'])} seeds meet)"))
    if "cluster" in r:
        cl = r["cluster"]
        fewer = cl["one_fewer"]
        check = f"; {rec['replicas'] - 1} miss it ({_seeds(fewer)} seeds meet)" if fewer else ""
        bet = cl["point"].get("bettable") or {}
        rows.append((f"replicas for {load(cl['target'])}",
                     f"{rec['replicas']}, confirmed as a whole cluster: a fresh run of it meets the SLO with "
                     f"P ~ {bet.get('probability', 0):.2f} ({_seeds(cl['point'])} seeds meet){check}"))
    if "band" in r:
        b = r["band"]
        if "steps_slower" not in b:
            rows.append(("cost-model error band", b["note"]))
        else:
            side = lambda k: load(b[k]["answer"]) if b[k]["answer"] is not None else "none"  # noqa: E731
            rows.append(("cost-model error band",
                         f"{side('steps_slower')} if real steps take {b['slower'] - 1:+.1%} against the "
                         f"simulated ones, {side('steps_faster')} if {b['faster'] - 1:+.1%} ({b['basis']})"))
    u = r.get("utilisation") or {}
    if u:
        busy = u.get("busy_fraction_at_sustained")
        text = f"engine busy {busy:.0%} of the time at the sustained load" if busy is not None else ""
        # what fills up as load grows: an engine that is always busy says little, these say which
        # resource the answer runs against (KV blocks, or the token budget)
        kv, budget = u.get("kv_utilization_at_sustained"), u.get("token_budget_utilization_at_sustained")
        if kv is not None:
            text += f"; KV cache {kv:.0%} full on average"
        if budget is not None:
            text += f"; token budget {budget:.0%} used per iteration on average"
        if r.get("headroom", 1.0) < 1.0:
            text += f"; planned at {r['headroom']:.0%} of it ({load(rec['planned_per_replica_load'])} per replica)"
        if "share_of_sustained_at_target" in u:
            text += (f"; at the target each replica carries {load(u['load_per_replica_at_target'])}, "
                     f"{u['share_of_sustained_at_target']:.0%} of its sustained load")
        rows.append(("utilisation", text.lstrip("; ")))
    return rows + _cost_rows(r, rec)


def _cost_rows(r: dict, rec: dict) -> list[tuple[str, str]]:
    """The headline's last rows: GPUs, their cost, power, spares, the vllm serve line, simulations."""
    cost = r["cost"]
    layout = "".join(f" x {k} {rec.get(k) or 1}" for k in ("pipeline_parallel_size", "data_parallel_size")
                     if (rec.get(k) or 1) > 1)
    return [("GPUs", f"{cost['gpus']} (tensor_parallel_size {rec['tensor_parallel_size']}{layout})"),
             ("cost", f"${cost['usd_per_hour']:.2f}/hour at ${cost['usd_per_gpu_hour']:.2f}/GPU-hour"
                      + (f" ({cost['price_source']})" if cost.get("price_source") else "")),
             ("cost per million output tokens", f"${_f(cost['usd_per_million_output_tokens'], 3)} "
                                                f"({_f(cost['output_tokens_per_s'], 0)} output tokens/s)"),
             ("cost per million tokens (prompt + output)", f"${_f(cost['usd_per_million_total_tokens'], 3)}"),
             *_power_rows(cost),
             *_spares_rows(r),
             ("vllm serve", rec.get("vllm_serve") or "none: the static scheduler is Hugging Face generate, "
                                                          "not vLLM"),
             ("simulations", simulations_text(r))]


def _spares_rows(r: dict) -> list[tuple[str, str]]:
    """--availability: the spares the planned cluster needs under the scenario's faults."""
    if "spares" not in r:
        return []
    sp = r["spares"]
    label = "spares under the faults"
    if sp is None:
        return [(label, "none sized: the plan found no cluster")]
    if "refused" in sp:
        return [(label, f"not sized: {sp['refused']}")]
    target = f"the SLO met in {sp['target']:.3%} of {sp['minute_s']:g}-s windows"
    if sp["answer"] is None:
        tried = max(len(o["rows"]) for o in sp["options"].values()) - 1
        return [(label, f"no fleet up to N+{tried} gives {target} (on its worst of {sp['seeds']} fault seeds); "
                        "raise --max-spares or loosen --availability")]
    best = sp["options"][sp["answer"]]["answer"]
    kind = "on spot" if sp["answer"] == "spot" else "on-demand"
    return [(label, f"N+{best['spares']} = {best['replicas']} replicas ({kind}) for {target}: worst of "
                    f"{sp['seeds']} fault seeds {best['availability_min']:.2%}, "
                    f"${best['usd_per_hour']:.2f}/hour ({'+' if sp['extra_usd_per_hour'] >= 0 else '-'}"
                    f"${abs(sp['extra_usd_per_hour']):.2f}/hour against the fault-free "
                    f"{sp['replicas']}, whose own availability without faults is "
                    f"{sp['fault_free']['availability']:.2%})")]


def _power_rows(cost: dict) -> list[tuple[str, str]]:
    """The facility's power and electricity at the planned load (docs/energy.md)."""
    if cost.get("facility_kw") is None:
        return []
    text = (f"{cost['facility_kw']:.2f} kW ({cost.get('power_basis', 'modelled')}, facility), "
            f"{_f(cost['kwh_per_million_output_tokens'], 3)} kWh per million output tokens")
    if cost.get("electricity_usd_per_hour") is not None:
        text += (f"; electricity ${cost['electricity_usd_per_hour']:.2f}/hour beside the GPUs' "
                 f"${cost['usd_per_hour']:.2f}: ${cost['total_usd_per_hour']:.2f}/hour in all")
    return [("power", text)]


def simulations_text(r: dict, unit: str = "") -> str:
    """'182 in 6.6 s', and how many of them an earlier, interrupted run left in the journal."""
    kept = f" ({r['read_back']} read back from simulations.jsonl)" if r.get("read_back") else ""
    took = f" in {r['wall_s']:.1f} s" if "wall_s" in r else ""
    return f"{r['simulations']}{unit}{kept}{took}"


def _nan(v: Any) -> float:
    return float("nan") if v is None else float(v)


def _kind(p: dict) -> str:
    """A judged point's marker: met, failed, or stopped (every seed stopped early: a clear miss)."""
    if p.get("met"):
        return "met"
    return "stopped" if p.get("stopped") and p["stopped"] == p["seeds"] else "failed"


def _short(metric: str) -> str:
    return metric[:-3].upper()


def _pct(r: dict, metric: str) -> str:
    """The percentile a target is judged at (its own, else the SLO's)."""
    return f"{dict(r.get('slo_percentiles') or {}).get(metric, r['slo']['percentile']):g}"


def _slo_label(slo: dict) -> str:
    """An older plan.json without slo_label: its TTFT/TPOT targets at the one percentile."""
    return ", ".join(f"p{slo['percentile']:g} {k[:-3].upper()} <= {slo[k]:g} ms"
                     for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms") if slo.get(k))


def write_report(r: dict, out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "plan.json", out / "plan.md"]
    write_file(paths[0], json.dumps(r, indent=2) + "\n")
    plots = _plots(r, out)
    write_file(paths[1], markdown(r, [p.name for p in plots]))
    return paths + plots


# ---------------------------------------------------------------- plan.md

def _metrics(r: dict) -> list[str]:
    """The SLO's metrics, in vLLM's order (TTFT and TPOT when an older plan names none)."""
    keys = [k for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms") if r["slo"].get(k)]
    return keys or ["ttft_ms", "tpot_ms"]


def _point_row(p: dict, first: list[str], metrics: list[str]) -> str:
    cells = first + [f"{p['passes']}/{p['seeds']}", "yes" if p["met"] else "no"]
    for k in metrics:
        cells += [_f(p[k]["p50"]), _f(p[k]["slo"])]
    cells += [_f(p["goodput_rps"], 2), _f(p["output_throughput"], 0)]
    if p.get("stopped"):  # (the runs stopped early measured only their stopping target: a lower bound)
        cells[-1] += f" ({p['stopped']} of {p['seeds']} stopped early: a clear miss)"
    return "| " + " | ".join(cells) + " |"


def _points_table(points: list[dict], heads: list[str], first, metrics=("ttft_ms", "tpot_ms")) -> list[str]:
    cols = heads + ["seeds met", "meets"]
    for k in metrics:
        cols += [f"{k[:-3].upper()} p50 (ms)", f"{k[:-3].upper()} pSLO (ms)"]
    cols += ["goodput (req/s)", "output tokens/s"]
    return ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)] + [
        _point_row(p, first(p), list(metrics)) for p in points]


def markdown(r: dict, plots: list[str]) -> str:
    s, o = r["load_search"], r["options"]
    unit, trace, load = s["unit"], r.get("workload", {}), _loads(r)
    grid = "integer users" if unit == "users" else f"rates {1 + o['resolution']:g}x apart"
    if _native(r) is not None:
        grid = f"workload.time_scale values {1 + o['resolution']:g}x apart (so are the rates)"
        runs = (f"- Each simulation replays the trace's {trace['requests']} requests (its length fixes the "
                "run: the trace is not repeated), with its arrival times divided by time_scale.")
    else:
        rl = r.get("run_length") or {}
        runs = (f"- Each simulation covers {rl.get('horizon_s', 120):g} s of arrivals at its load, at least "
                f"{max(rl.get('percentile_requests', 0), o['min_requests']):,} requests (the SLO's percentile "
                f"needs {o['tail_requests']} judged requests beyond it per run: {rl.get('percentile_requests', 0):,}"
                f"), at most {o['max_requests']:,}" + (f"; closed loop: {o['requests_per_user']} requests per user"
                                                      if unit == "users" else "") + ".")
        if rl.get("note"):
            runs += f" At the answer: {rl['requests_at_answer']:,} requests ({rl['note'].split(': ', 1)[-1]})."
        if unit == "req/s" and trace.get("time_scale", 1.0) != 1.0:
            runs += (f" Loads are offered rates: workload.arrival.rate x workload.time_scale "
                     f"({trace['time_scale']:g}).")
    if r.get("deterministic"):
        seeds = ("One seed per load: the workload has no random component, so every seed simulates the same "
                 "run (confidence: deterministic). A run")
    else:
        seeds = (f"A load meets the SLO when the mean over seeds of each target's percentile is within the "
                 f"target at 90% confidence (Student's t over the seeds: {o['first_seeds']} seeds, "
                 f"{o['seeds']} when the interval straddles a target, then {o['max_seeds']}; if it still does, "
                 "the mean decides and the point says so), and fails when some target's lower bound is past "
                 f"it. A run that clearly misses (a TTFT or E2EL percentile certain to exceed "
                 f"{o['clear_fail']:g}x its target) is stopped early. A seed")
    cluster_rule = (f"- The replicas for the target are the fewest whose whole cluster (the scenario's router) "
                    f"meets the SLO there, confirmed: a fresh run of that cluster meets it with probability >= "
                    f"{o.get('confidence', 0.9):g}, predicted from {o.get('confirm_first', 4)}-"
                    f"{o.get('confirm_seeds', 12)} seeds (a one-sided Student-t prediction bound on each run's "
                    "worst observed / target); a count the first judge found is confirmed, one replica more at "
                    "a time until one is.")
    lines = [f"# Capacity plan: {r['scenario']}", "",
             f"{r['model']} on {r['hardware']}, scheduler `{r['engine']['scheduler']}`, scenario "
             f"`{r['source']}`" + (f" with `{' '.join(r['overrides'])}`" if r["overrides"] else "") + ".",
             "", f"Step costs: {describe(r.get('cost_model'))}.", "", "| | |", "| --- | --- |"]
    lines += [f"| {a} | {b} |" for a, b in headline(r)]
    lines += ["", "## Method", "",
              f"- Load grid: {grid}; "
              "a doubling bracket, then bisection until the answer and the next grid point up are "
              "adjacent.",
              f"- {seeds} meets it when each target holds ({r.get('slo_label') or _slo_label(r['slo'])}) over "
              f"the requests after the first {o['warmup_fraction']:.0%} (warm-up: they arrive at an empty "
              "engine); ITL over the inter-token gaps after the first of them arrives.",
              runs,
              cluster_rule,
              "- Latencies are means over seeds; pSLO is the SLO percentile. Goodput: requests/s "
              "meeting every target.", ""]
    if r.get("warnings"):
        lines += ["## Warnings", ""] + [f"- {w}" for w in r["warnings"]] + [""]
    lines += ["## Load search (one replica, the scenario's engine setting)", ""]
    lines += _points_table(s["curve"], *_load_cells(r), _metrics(r))
    if "tradeoff" in r:
        lines += _curve_section(r)
    if "cluster" in r:
        cl = r["cluster"]
        lines += ["", f"## Replicas at {load(cl['target'])} (router `{r['engine']['router']}`)", ""]
        lines += _points_table(cl["tried"], ["replicas"], lambda p: [str(p["replicas"])], _metrics(r))
    if r.get("spares") and "refused" not in r["spares"]:
        from sim.planning.spares import lines as spares_lines

        sp = r["spares"]
        lines += ["", f"## Spares under the faults (--availability {sp['target']:g})", "",
                  f"The planned cluster's own run (`{' '.join(sp['overrides'])}`) with the scenario's faults, "
                  f"N+k replicas for k = 0, 1, ..., once per fault seed (0..{sp['seeds'] - 1}); the answer is "
                  "the least k whose worst seed meets the target (sim/planning/spares.py).", ""]
        lines += [f"- {line}" for line in spares_lines(sp)]
    lines += [""] + [f"![{name}]({name})" for name in plots]
    return "\n".join(lines) + "\n"


def _curve_section(r: dict) -> list[str]:
    t, unit, load = r["tradeoff"], r["load_search"]["unit"], _loads(r)
    g, c = t["grid"], t["chosen_search"]
    step = f"{g['resolution']:.0%} steps" + (" (rounded to whole users)" if unit == "users" else "")
    seeds = "1 seed per point (deterministic)" if r.get("deterministic") else \
        f"{g['seeds'][0]} seeds per point ({g['seeds'][1]} while the interval straddles a target)"
    lines = ["", "## Engine curve: each setting's sustained load", "",
             f"Each setting's own highest load meeting the SLO, on a grid of {step} from "
             f"{load(g['base'])} (the scenario setting's answer), {seeds}, each search started at its "
             "neighbour's answer. "
             f"max_num_seqs up to {t['kv_seq_cap']} (sequences of the mean length that fit in the KV cache). "
             "Goodput: requests/s meeting every target at that load. The scenario's own setting shows "
             "its load search (finer grid). Chosen: the highest sustained load (a tie on the grid goes to the "
             "simpler setting), then searched again on the "
             f"load search's grid and seeds: **{_setting(r, t['chosen'])}: {load(c['answer'])}** "
             f"({load(c['next'])} fails).", ""]
    cols = ["max_num_seqs", "max_num_batched_tokens", f"sustained ({unit})", f"next up, fails ({unit})",
            "seeds met", "goodput (req/s)", "TTFT pSLO (ms)", "TPOT pSLO (ms)", "output tokens/s", "loads judged"]
    for part in ("max_num_seqs", "max_num_batched_tokens"):
        if not t[part]:
            continue
        lines += [f"By {part}:", "", "| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
        for e in t[part]:
            p = e["point"] or {}
            chosen = " (chosen)" if _is_chosen(e, t) else ""
            cells = [str(e["max_num_seqs"]), str(e["max_num_batched_tokens"]) + chosen,
                     "none" if e["sustained"] is None else _load(e["sustained"], unit).split()[0],
                     _load(e["next"], unit).split()[0], _seeds(p) if p else "-", _f(e["goodput_rps"], 2),
                     _f(p.get("ttft_ms", {}).get("slo")), _f(p.get("tpot_ms", {}).get("slo")),
                     _f(p.get("output_throughput"), 0), str(len(e["judged"]))]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    if any(t["chosen"][k] != r["engine"][k] for k in t["chosen"]):
        lines += [f"Load search of the chosen setting ({_setting(r, t['chosen'])}):", ""]
        lines += _points_table(c["curve"], *_load_cells(r), _metrics(r))
    return lines


def _is_chosen(entry: dict, t: dict) -> bool:
    return all(entry[k] == v for k, v in t["chosen"].items())


# ---------------------------------------------------------------- plots

def _finish(fig, ax_list, title: str, path: Path, legend_loc: str = "best", legend_outside: bool = False) -> Path:
    """Grid and legend on each axis (below it: `legend_outside`, for a legend too long to sit on the
    data), a title; saved and closed."""
    import matplotlib.pyplot as plt

    for ax in ax_list:
        ax.grid(alpha=0.3)
        if legend_outside:
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
        else:
            ax.legend(fontsize=7, loc=legend_loc)
    fig.suptitle(title)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path


@plain_text
def _plots(r: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s, slo = r["load_search"], r["slo"]
    # every load the search evaluated (plan.json's curve), the locating single-seed ones included
    pts = sorted(s["curve"], key=lambda p: p["load"])
    x = [p["load"] for p in pts]
    metrics = _metrics(r)
    percentiles = r.get("slo_percentiles", {})
    fig, axes = plt.subplots(1, len(metrics), figsize=(max(7.0, 5.5 * len(metrics)), 5.6), squeeze=False)
    axes = axes[0]
    for ax, key in zip(axes, metrics):
        label = key[:-3].upper()
        pct = percentiles.get(key, slo["percentile"])
        for p_key, style in (("p50", "o-"), ("p90", "s-")):
            if p_key == f"p{_f(pct, 0)}":
                continue  # drawn below as the SLO's percentile
            ax.plot(x, [_nan(p[key][p_key]) for p in pts], style, ms=3, lw=1, alpha=0.6, label=f"{label} {p_key}")
        # the SLO's percentile: mean over seeds, a bar from the lowest to the highest seed, and
        # each point's verdict (met: the plan's rule over its seeds), never the mean's; a point
        # whose runs were stopped early (a clear miss) shows the lower bound they were stopped at
        ys = [_nan(p[key]["slo"]) for p in pts]
        spans = [p[key].get("slo_range") or [y, y] for y, p in zip(ys, pts)]
        lo = [max(0.0, y - min(r)) if y == y else 0.0 for y, r in zip(ys, spans)]
        hi = [max(0.0, max(r) - y) if y == y else 0.0 for y, r in zip(ys, spans)]
        ax.errorbar(x, ys, yerr=[lo, hi], fmt="-", color="#555555", lw=1, elinewidth=0.8, capsize=2,
                    label=f"{label} p{_f(pct, 0)} (bar: range over seeds)")
        for kind, colour, marker, face, text in (("met", "#2ca25f", "o", None, "met the SLO"),
                                                 ("failed", "#de2d26", "X", None, "failed"),
                                                 ("stopped", "#de2d26", "^", "none", "failed, stopped early "
                                                  "(at least this)")):
            sel = [i for i, p in enumerate(pts) if _kind(p) == kind and ys[i] == ys[i]]
            if sel:
                ax.scatter([x[i] for i in sel], [ys[i] for i in sel], s=34, facecolors=face or colour,
                           edgecolors=colour, marker=marker, zorder=3, label=f"{text} ({len(sel)})")
        if slo.get(key):
            ax.axhline(slo[key], color="red", ls="--", lw=1, label=f"SLO p{_f(pct, 0)} <= {_f(slo[key], 0)} ms")
        if s["answer"] is not None:
            ax.axvline(s["answer"], color="green", ls=":", lw=1, label=f"sustained {_loads(r)(s['answer'])}")
        if key in ("ttft_ms", "e2el_ms"):  # grow by orders of magnitude past saturation
            ax.set_yscale("log")
        ax.set_xlabel(f"load ({s['unit']})" if _native(r) is None else
                      f"load (req/s = time_scale x {_native(r):.3f} req/s, the trace's native rate)")
        ax.set_ylabel(f"{label} (ms)")
    paths = [_finish(fig, axes, f"{r['scenario']} ({r['model']}, {r['hardware']}): latency vs load\none replica, "
                                f"the scenario's setting, all {len(pts)} loads evaluated (lines: mean over seeds)",
                     out / LATENCY_PNG, legend_outside=True)]
    t = r.get("tradeoff")
    if t:
        panels = [(k, t[k]) for k in ("max_num_seqs", "max_num_batched_tokens") if t[k]]
        fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
        for ax, (key, entries) in zip(axes[0], panels):
            xs = [e[key] for e in entries]
            ys = [e["sustained"] or 0.0 for e in entries]
            unit = r["load_search"]["unit"]
            ax.plot(xs, ys, "o-", color="tab:blue", ms=5, label="sustained load under the SLO")
            for e in filter(lambda e: not e["overrides"], entries):
                ax.plot(e[key], e["sustained"] or 0.0, "s", mfc="none", color="black", ms=11,
                        label="the scenario's setting")
            ax.axvline(t["chosen"][key], color="tab:red", ls=":", lw=1, label=f"chosen {key} {t['chosen'][key]}")
            for e in filter(lambda e: _is_chosen(e, t), entries):
                ax.plot(e[key], e["sustained"] or 0.0, "*", color="tab:red", ms=16,
                        label=f"chosen: {_setting(r, t['chosen'])}")
            ax.set_ylim(0, 1.12 * max(ys) or 1)
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [str(v) for v in xs])
            ax.minorticks_off()
            ax.set_xlabel(key)
            ax.set_ylabel(f"sustained load ({unit}, coarse grid)")
        paths.append(_finish(fig, axes[0], f"{r['scenario']} ({r['model']}, {r['hardware']}): sustained load "
                                           "per engine setting, one replica", out / TRADEOFF_PNG,
                             legend_loc="lower right"))
    return paths

