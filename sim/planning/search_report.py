"""The configuration search as files: search.json, search.md and pareto.png.

    write_search_report(result, out_dir) -> list[Path]
    search_headline(result) -> list[tuple[str, str]]   # the short table the CLI prints
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sim.files import plain_text, save_figure, write_file
from sim.planning.plan_report import simulations_text

PARETO_PNG = "pareto.png"

# search.json's p99 TTFT of one replica at its sustained load, named as results.csv names the
# statistic (`ttft_ms.p99`); last release's name is written beside it for one release so scripts that
# read search.json by it keep working (docs/planner.md, "search.json")
TTFT_AT_SUSTAINED = "ttft_ms.p99_at_sustained"
LAST_RELEASES = {TTFT_AT_SUSTAINED: "ttft_p99_ms_at_sustained"}


def ttft_at_sustained(row: dict) -> float | None:
    """A candidate's p99 TTFT (ms) at one replica's sustained load, from this release's search.json
    or the last one's."""
    v = row.get(TTFT_AT_SUSTAINED)
    return row.get(LAST_RELEASES[TTFT_AT_SUSTAINED]) if v is None else v


def bill(row: dict) -> float:
    """A confirmed cluster's USD per hour as the search ranks it: its GPU-hours (`usd_per_hour`) plus,
    where the scenario prices electricity (energy.usd_per_kwh), its modelled facility power at that
    price (`total_usd_per_hour`)."""
    return row.get("total_usd_per_hour", row["usd_per_hour"])


def _dollars(row: dict) -> str:
    """'$108.00/hour' or '$112.10/hour ($108.00 GPUs + $4.10 electricity at the modelled draw)' (the
    facility's kW is servesim's power model: docs/energy.md)."""
    if "electricity_usd_per_hour" not in row:
        return f"${row['usd_per_hour']:,.2f}/hour"
    return (f"${bill(row):,.2f}/hour (${row['usd_per_hour']:,.2f} GPUs + ${row['electricity_usd_per_hour']:,.2f} "
            "electricity at the modelled draw)")


def _f(v: Any, digits: int = 2) -> str:
    return "-" if v is None else f"{v:,.{digits}f}" if isinstance(v, float) else str(v)


def _knobs(setting: dict) -> str:
    """'chunked, prefix caching on, 256 / 8192': the searched knobs of a setting."""
    parts = []
    if "pipeline_parallel_size" in setting:
        parts.append(f"PP{setting['pipeline_parallel_size']}")
    if "data_parallel_size" in setting:
        parts.append(f"DP{setting['data_parallel_size']}")
    if "enable_expert_parallel" in setting:
        parts.append("EP" if setting["enable_expert_parallel"] else "no EP")
    if "all2all_backend" in setting and setting.get("data_parallel_size", 2) > 1:  # (DP1's is the default)
        parts.append(setting["all2all_backend"])
    if "disaggregation" in setting:
        d = setting["disaggregation"]
        parts.append("aggregated" if d is None else f"{d['prefill_replicas']}P:{d['decode_replicas']}D")
    if "speculative" in setting:
        s = setting["speculative"]
        parts.append("no speculation" if s is None else
                     f"{s['method']} k={s['num_speculative_tokens']} a={s['acceptance_rate']}")
    if "scheduler" in setting:
        parts.append(setting["scheduler"])
    if "enable_prefix_caching" in setting:
        c = setting["enable_prefix_caching"]
        parts.append("prefix caching " + ("default" if c is None else "on" if c else "off"))
    if "kv_offloading_size" in setting:
        o = setting["kv_offloading_size"]
        parts.append("no CPU KV tier" if o is None else f"CPU KV tier {o:g} GiB")
    return ", ".join(parts + [f"{setting['max_num_seqs']} / {setting['max_num_batched_tokens']}"])


def _unit(r: dict) -> str:
    """The search's load unit: req/s, users (a closed loop) or sessions/s (agents)."""
    return r.get("unit", "req/s")


def _name(row: dict) -> str:
    return f"{row['gpu']} TP{row['tensor_parallel_size']}"


def tp_groups(setting: dict) -> int:
    """TP groups of GPUs in one 'replica' of a setting: 1, a disaggregated unit's P + D replicas,
    times its pipeline stages and its data-parallel ranks (each a TP group of its own)."""
    d = setting.get("disaggregation")
    return (1 if d is None else d["prefill_replicas"] + d["decode_replicas"]) \
        * setting.get("pipeline_parallel_size", 1) * setting.get("data_parallel_size", 1)


def _per_gpu(setting: dict, tp: int) -> float | None:
    """A setting's coarse sustained load per GPU (a replica or P+D unit: TP x its groups)."""
    if setting.get("sustained") is None:
        return None
    return setting["sustained"] / (tp * tp_groups(setting))


def candidate_point(row: dict, with_target: bool) -> tuple[float, float, str] | None:
    """A candidate on the cost-latency plane, as search.json's pareto and pareto.png read it:
    (cost, p99 TTFT ms, kind). With a target: a confirmed cluster's $/hour and its p99 TTFT at
    the target (kind "confirmed"); a candidate shown dearer, the least it can cost ("at least":
    one replica more than the count that missed the SLO, or its bound at SLACK x flat out) and one
    replica's p99 TTFT at its sustained load; one over --power-cap-kw, its cluster's cost and p99 TTFT
    ("over the power cap"). Without a target: $ per million output tokens at one replica's sustained
    load ("refined", else "coarse"). None: no such numbers (pruned)."""
    if row.get("pruned"):
        return None
    ttft = ttft_at_sustained(row)
    if not with_target:
        cost = row.get("usd_per_million_output_tokens")
        if cost is None or ttft is None:
            return None
        return cost, ttft, "refined" if row.get("status") == "refined" else "coarse"
    if row.get("status") == "confirmed":
        return bill(row), row["cluster"]["point"]["ttft_ms"]["p99"], "confirmed"
    unit_usd = row["tensor_parallel_size"] * row.get("replicas_per_unit", 1) * row["usd_per_gpu_hour"]
    if str(row.get("status", "")).startswith("over the power cap"):  # met the SLO, drew too much: its cluster
        cl = row["cluster"]
        return (cl["replicas"] * unit_usd + row.get("electricity_usd_per_hour", 0.0), cl["point"]["ttft_ms"]["p99"],
                "over the power cap")
    beyond = (row.get("cluster") or {}).get("beyond")
    least = (beyond + 1) if beyond else row.get("replicas_lower_bound")
    if least is None or ttft is None:
        return None
    return least * unit_usd, ttft, "at least"


def _why(r: dict, c: dict) -> str | None:
    """One line on why the chosen configuration wins: its confirmed cluster (or refined load), and
    what became of the next cheapest candidate."""
    row = next((x for x in r["candidates"] if x["gpu"] == c["gpu"]
                and x["tensor_parallel_size"] == c["tensor_parallel_size"]), None)
    if row is None or not row.get("settings"):
        return None
    unit = _unit(r)
    if "replicas" in c:
        bet = (row["cluster"]["point"] or {}).get("bettable") or {}
        parts = [f"{c['replicas']} replicas meet the SLO at {r['target']:g} {unit} as a simulated cluster "
                 f"({row['cluster']['point']['seeds']} seeds; a fresh run meets it with P ~ "
                 f"{bet.get('probability', 0):.2f}), {row['cluster_load_per_replica']:.2f} {unit} per replica "
                 f"against one replica's {row['coarse_load']:.2f} alone"]
    else:
        parts = [f"{row['sustained_per_gpu']:.2f} {unit} per GPU ({row.get('status', 'coarse')}) with {_knobs(row)}"]
    rivals = [x for x in r["candidates"] if x is not row and not x.get("pruned") and x.get("status")]
    if rivals:
        nxt = min(rivals, key=lambda x: (bill(x) if "usd_per_hour" in x else x.get("usd_per_hour_estimate"))
                  or x.get("usd_per_million_output_tokens") or 0.0)
        what = (f"{nxt['replicas']} replicas, {_dollars(nxt)} (confirmed)" if "usd_per_hour" in nxt
                else nxt["status"])
        parts.append(f"the next, {_name(nxt)} ({_knobs(nxt)}): {what}")
    return "; ".join(parts)


def search_headline(r: dict) -> list[tuple[str, str]]:
    rows = [("SLO", r["slo_label"]), ("model", r["model"])]
    if r["target"] is not None:
        rows.append(("target", f"{r['target']:g} {_unit(r)}" + (f" at {r['headroom']:.0%} of sustained load"
                                                            if r["headroom"] < 1 else "")))
    c = r["chosen"]
    if c is None:
        rows.append(("cheapest configuration", "none meets the SLO (see search.md for why each was left out)"))
    else:
        unit = "replicas" if c.get("disaggregation") is None else \
            f"units of {c['disaggregation']['prefill_replicas']}P:{c['disaggregation']['decode_replicas']}D"
        pp, dp = c.get("pipeline_parallel_size") or 1, c.get("data_parallel_size") or 1
        layout = f"TP{c['tensor_parallel_size']}" + (f" x PP{pp}" if pp > 1 else "") + (f" x DP{dp}" if dp > 1 else "")
        what = (f"{c['gpu']} x {c['gpus']} ({c['replicas']} {unit} of {layout}), {_dollars(c)}"
                if "replicas" in c else f"{c['gpu']} {layout}")
        rows += [("cheapest configuration", what)]
        if c.get("band"):  # (this GPU x TP's own path: its tables, its GPU family, its features)
            b = c["band"]
            rows.append(("error band (this path)",
                         f"real vLLM may need {b['replicas'][0]}-{b['replicas'][1]} {unit} "
                         f"(${b['usd_per_hour'][0]:,.2f}-${b['usd_per_hour'][1]:,.2f}/hour in GPUs): step time "
                         f"x{b['faster']:.2f} to x{b['slower']:.2f}, {b['basis']}; {b['rule']}"))
        why = _why(r, c)
        if why:
            rows.append(("why it wins", why))
        rows += [("engine (max_num_seqs / max_num_batched_tokens)", _knobs(c)),
                 ("vllm serve", c["vllm_serve"] or "none (static scheduler)")]
    counts: dict[str, int] = {}
    for row in r["candidates"]:
        key = "pruned" if row.get("pruned") else row.get("status", "?").split(":")[0].split(" (")[0]
        counts[key] = counts.get(key, 0) + 1
    prices = {row["gpu"]: (row["usd_per_gpu_hour"], row.get("price_source", "the hardware preset"))
              for row in r["candidates"]}
    rows.append(("GPU prices (USD per GPU-hour)", ", ".join(f"{g} {usd:.2f} ({source})"
                                                             for g, (usd, source) in prices.items())))
    rows += [("candidates", ", ".join(f"{n} {k}" for k, n in counts.items())),
             ("simulations", simulations_text(r))]
    return rows


def write_search_report(r: dict, out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "search.json", out / "search.md"]
    write_file(paths[0], json.dumps(r, indent=2) + "\n")
    plot = pareto_plot(r, out / PARETO_PNG)
    write_file(paths[1], markdown(r, plot))
    return paths + ([plot] if plot else [])


def markdown(r: dict, plot: Path | None) -> str:
    unit = _unit(r)
    lines = [f"# Configuration search: {r['scenario']}", "", f"`{r['source']}`, {r['model']}; SLO "
             f"{r['slo_label']}" + (f"; target {r['target']:g} {unit}" if r["target"] is not None else "") + ".", ""]
    lines += ["| | |", "| --- | --- |"] + [f"| {a} | {b} |" for a, b in search_headline(r)] + [""]
    w = r.get("workload") or {}
    if w.get("native_rate"):
        lines += [f"The trace `{w['trace']}` ({w['requests']} requests over {w['span_s']:.1f} s, "
                  f"{w['native_rate']:.3f} req/s native: {w['native_rate_definition']}) is replayed faster or "
                  "slower to reach each load: "
                  "workload.time_scale = load / native rate, its requests and their lengths as recorded.", ""]
    with_target = r["target"] is not None
    cols = ["GPU", "TP", "setting (max_num_seqs / max_num_batched_tokens)",
            f"one replica sustains ({unit}; per P+D unit)", f"per GPU ({unit})", "p99 TTFT at it (ms)",
            "$/M output tokens"]
    cols += ["replicas", "GPUs", "$/hour", "from"] if with_target else []
    cols += ["status"]
    rule = ("*One replica sustains*: the highest load one replica meets the SLO at on the coarse grid (5%, "
            "2-4 seeds: the mean percentile over seeds within every target at 90% confidence). ")
    rule += ("*Replicas*: a *confirmed cluster* is the fewest replicas whose whole cluster (the scenario's "
             "router) meets the SLO at the target, a fresh run of it with probability >= the plan's "
             "confidence; every candidate that could be the cheapest is simulated so, in order of estimated "
             "cost, each only up to as many replicas as would still cost less than the cheapest confirmed. "
             "An *estimate* is target / (headroom x one replica's load), rounded up: a cluster often needs "
             "fewer (round-robin smooths each replica's arrivals)." if with_target else
             "*Refined*: searched again on the load search's grid while it could still be the cheapest.")
    lines += ["## Every candidate", "", rule, "",
              "| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
    order = lambda x: (bool(x.get("pruned")), (bill(x) if "usd_per_hour" in x else x.get("usd_per_hour_estimate"))  # noqa: E731
                       or x.get("usd_per_million_output_tokens") or 0)
    for row in sorted(r["candidates"], key=order):
        if row.get("pruned"):
            cells = [row["gpu"], str(row["tensor_parallel_size"])] + ["-"] * (len(cols) - 3) + \
                    [f"pruned: {row['pruned']}"]
        else:
            sustained = row.get("sustained_load") or row.get("coarse_load")
            cells = [row["gpu"], str(row["tensor_parallel_size"]), _knobs(row), _f(sustained),
                     _f(row.get("sustained_per_gpu")),
                     _f(ttft_at_sustained(row), 0), _f(row.get("usd_per_million_output_tokens"), 3)]
            if with_target:
                confirmed = row.get("status") == "confirmed"
                cells += ([str(row["replicas"]), str(row["gpus"]), _f(bill(row)), "confirmed cluster"
                           + (f" (GPUs {_f(row['usd_per_hour'])} + electricity {_f(row['electricity_usd_per_hour'])})"
                              if "electricity_usd_per_hour" in row else "")
                           + (f"; this path's band: {row['band']['replicas'][0]}-{row['band']['replicas'][1]} replicas"
                              if row.get("band") else "")]
                          if confirmed else [str(row.get("replicas_estimate", "-")), str(row.get("gpus_estimate", "-")),
                                             _f(row.get("usd_per_hour_estimate")), "estimate"])
            tie = f"; ties: {'; '.join(_knobs(t) for t in row['ties'])}" if row.get("ties") else ""
            cells.append(row.get("status", "") + tie)
        lines.append("| " + " | ".join(cells) + " |")
    settings = r["settings"]
    if len(settings) > 1:
        lines += ["", f"## Engine settings per candidate (coarse sustained load, {unit})", "",
                  "| GPU | TP | " + " | ".join(_knobs(s) for s in settings) + " |",
                  "|" + " --- |" * (2 + len(settings))]
        for row in r["candidates"]:
            if "settings" in row:
                lines.append(f"| {row['gpu']} | {row['tensor_parallel_size']} | " + " | ".join(
                    _f(s.get("sustained")) if "refused" not in s else "refused" for s in row["settings"]) + " |")
        mixed = [row for row in r["candidates"] if row.get("mixed_cost_models")]
        if mixed:
            lines += [""] + [f"**Different cost models** on {_name(row)} ({row['mixed_cost_models']}): an estimate "
                             "(roofline) beside a measured profile; compare them on one basis with "
                             "`--set cost_model=roofline`." for row in mixed]
    lines += _chosen_section(r)
    if plot:
        lines += ["", f"![{plot.name}]({plot.name})"]
    return "\n".join(lines) + "\n"


def _chosen_section(r: dict) -> list[str]:
    """search.md's "Chosen": the vllm serve line, and the confirmed cluster's runs."""
    lines: list[str] = []
    c = r["chosen"]
    if c is not None:
        lines += ["", "## Chosen", "", "```", c["vllm_serve"] or "(static scheduler: no vllm serve)", "```"]
        if "replicas" in c:
            p = c["cluster_point"]
            bet = p.get("bettable") or {}
            unit = "replicas" if c.get("disaggregation") is None else "units (each the pools above)"
            lines += ["", f"{c['replicas']} {unit} behind the scenario's router, simulated as a whole cluster at the "
                          f"target / headroom: {p['passes']}/{p['seeds']} seeds meet the SLO; a fresh run meets it "
                          f"with probability ~{bet.get('probability', 0):.2f} (the seeds' worst ratio: mean "
                          f"{bet.get('worst_mean', 0):.3f}, sd {bet.get('worst_sd', 0):.3f}; one-sided "
                          f"{bet.get('confidence', 0.9):.0%} prediction bound {bet.get('bound', 0):.3f} <= 1)."]
            row = next(x for x in r["candidates"] if x["gpu"] == c["gpu"]
                       and x["tensor_parallel_size"] == c["tensor_parallel_size"])
            tried = row["cluster"]["tried"]
            if tried:
                lines += ["", "| replicas | seeds meeting the SLO | p99 TTFT (ms) | p99 TPOT (ms) | verdict |",
                          "| --- | --- | --- | --- | --- |"]
                for q in tried:
                    lines.append(f"| {q['replicas']} | {q['passes']}/{q['seeds']} | {_f(q['ttft_ms']['p99'], 0)} | "
                                 f"{_f(q['tpot_ms']['p99'], 1)} | {'meets' if q['met'] else 'misses'} |")
    return lines


def _labels(at: list[tuple[float, float]], texts: list[str]) -> list[tuple[tuple[float, float], str]]:
    """One label per cluster of points drawn on top of each other (within 2% of the axes' spans):
    "TP4, TP8" once, not two labels printed over each other."""
    xs, ys = [p[0] for p in at], [p[1] for p in at]
    dx, dy = 0.02 * ((max(xs) - min(xs)) or 1.0), 0.02 * ((max(ys) - min(ys)) or 1.0)
    merged: list[tuple[tuple[float, float], list[str]]] = []
    for (x, y), text in zip(at, texts):
        near = next((m for m in merged if abs(m[0][0] - x) <= dx and abs(m[0][1] - y) <= dy), None)
        if near is None:
            merged.append(((x, y), [text]))
        elif text not in near[1]:
            near[1].append(text)
    return [(p, ", ".join(sorted(t, key=lambda s: (len(s), s)))) for p, t in merged]


def _cost_label(r: dict, rows: list[dict], with_target: bool) -> str:
    billed = any("electricity_usd_per_hour" in x for x in rows)
    return (f"USD per hour for {r['target']:g} {_unit(r)} (replicas x GPUs x price"
            + (" + electricity, confirmed)" if billed else ")") if with_target
            else "USD per million output tokens at one replica's sustained load")


def _placed(candidates: list[dict], with_target: bool) -> dict[int, tuple[float, float, str]]:
    """Each candidate within the limits that has a place on the cost-latency plane (candidate_point),
    by id."""
    points: dict[int, tuple[float, float, str]] = {}
    for x in candidates:
        p = candidate_point(x, with_target)
        if p is not None and "limits" not in x.get("status", ""):
            points[id(x)] = p
    return points


@plain_text
def pareto_plot(r: dict, path: Path) -> Path | None:
    """Cost vs p99 TTFT at the sustained load, one point per candidate within the limits that meets
    the SLO (filled: confirmed, hollow: coarse; bigger: more GPUs per replica), the frontier of
    those no other is both cheaper and faster than, the chosen one starred."""
    with_target = r["target"] is not None
    points = _placed(r["candidates"], with_target)
    rows = [x for x in r["candidates"] if id(x) in points]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key = "usd_per_hour" if with_target else "usd_per_million_output_tokens"
    xlabel = _cost_label(r, rows, with_target)
    cap = r.get("power_cap_kw") if with_target else None
    powered = [x for x in rows if cap is not None and x.get("facility_kw") is not None
               and points[id(x)][2] in ("confirmed", "over the power cap")]
    # with a cap, a second panel: each simulated cluster's modelled kW against its cost, the cap a line
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2), gridspec_kw={"width_ratios": [1.7, 1]}) if powered \
        else plt.subplots(figsize=(8.5, 5.2))
    ax, kw_ax = (axes[0], axes[1]) if powered else (axes, None)
    colours = {g: f"C{i}" for i, g in enumerate(dict.fromkeys(x["gpu"] for x in rows))}
    marker = {"at least": ">", "over the power cap": "X"}
    for x in rows:
        cost, ttft, kind = points[id(x)]
        filled = kind in ("confirmed", "refined")
        ax.scatter(cost, ttft, s=40 + 25 * x["tensor_parallel_size"], marker=marker.get(kind, "o"),
                   color=colours[x["gpu"]], facecolors=colours[x["gpu"]] if filled else "none",
                   linewidths=1.5, zorder=3)
    for (cost, ttft), text in _labels([points[id(x)][:2] for x in rows],
                                      [f"TP{x['tensor_parallel_size']}" for x in rows]):
        ax.annotate(text, (cost, ttft), textcoords="offset points", xytext=(6, 4), fontsize=7)
    front = sorted(r["pareto"], key=lambda f: f[key])
    if len(front) > 1:
        ttfts = [f.get("ttft_ms.p99", f.get(LAST_RELEASES[TTFT_AT_SUSTAINED])) for f in front]
        ax.plot([f[key] for f in front], ttfts, "k--", lw=1, label="Pareto frontier of the confirmed: cheaper or "
                "faster than every other")
    c = r["chosen"]
    if c is not None:
        row = next(x for x in rows if x["gpu"] == c["gpu"] and x["tensor_parallel_size"] == c["tensor_parallel_size"])
        cost, ttft, _ = points[id(row)]
        ax.scatter(cost, ttft, marker="*", s=400, color="gold", edgecolors="black", zorder=4,
                   label=f"chosen: {_name(row)}")
    for g, col in colours.items():
        ax.scatter([], [], color=col, label=g)
    if with_target:
        ax.scatter([], [], marker=">", facecolors="none", edgecolors="grey",
                   label="dearer: at least this cost (fewer replicas miss the SLO); latency of one replica")
        if any(points[id(x)][2] == "over the power cap" for x in rows):
            ax.scatter([], [], marker="X", facecolors="none", edgecolors="grey",
                       label="meets the SLO, over the power cap" + (f" ({cap:g} kW)" if cap is not None else ""))
    else:
        ax.scatter([], [], facecolors="none", edgecolors="grey", label="coarse (not refined)")
    costs = [points[id(x)][0] for x in rows]
    if min(costs) > 0 and max(costs) / min(costs) > 8:  # far-off candidates would squeeze the rest
        ax.set_xscale("log")
    target = (r.get("slo_targets") or {}).get("ttft_ms")
    if target is not None:  # the TTFT target, where the plot's axis is its percentile
        limit, pct = target
        if pct == 99:
            ax.axhline(limit, color="red", ls="--", lw=1, label=f"SLO p99 TTFT <= {limit:g} ms")
        else:
            ax.plot([], [], " ", label=f"SLO: p{pct:g} TTFT <= {limit:g} ms (another percentile than this axis)")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("p99 TTFT (ms, mean over seeds)\nconfirmed: the cluster's at the target" if with_target
                  else "p99 TTFT at the sustained load (ms, mean over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    ax.set_title(f"{r['scenario']} ({r['model']}): cost vs latency, {r['slo_label']}", fontsize=10)
    if powered:
        assert cap is not None  # (powered only with a cap)
        _power_panel(kw_ax, powered, points, colours, marker, cap, xlabel.split(" (")[0])
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return path


def _power_panel(kw_ax, powered: list[dict], points: dict, colours: dict, marker: dict, cap: float,
                 xlabel: str) -> None:
    """pareto.png's second panel under --power-cap-kw: each simulated cluster's modelled facility kW
    against its cost, the cap a line."""
    for x in powered:
        cost, _, kind = points[id(x)]
        kw_ax.scatter(cost, x["facility_kw"], s=40 + 25 * x["tensor_parallel_size"], marker=marker.get(kind, "o"),
                      color=colours[x["gpu"]], facecolors=colours[x["gpu"]] if kind == "confirmed" else "none",
                      linewidths=1.5, zorder=3)
        kw_ax.annotate(f"{x['gpu']} TP{x['tensor_parallel_size']}", (cost, x["facility_kw"]),
                       textcoords="offset points", xytext=(6, 4), fontsize=7)
    kw_ax.axhline(cap, color="red", ls="--", lw=1, label=f"power cap {cap:g} kW (--power-cap-kw)")
    kw_ax.set_xlabel(xlabel)
    kw_ax.set_ylabel("facility power at the target (kW, modelled)")
    kw_ax.set_title("the simulated clusters' power", fontsize=10)
    kw_ax.set_ylim(bottom=0, top=max(cap, *(x["facility_kw"] for x in powered)) * 1.15)
    kw_ax.margins(x=0.2)  # (room for the labels right of the points)
    kw_ax.grid(alpha=0.3)
    kw_ax.legend(fontsize=8, loc="best")
