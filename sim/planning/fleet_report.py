"""A fleet plan as files: plan.json (the dict sim/planning/fleet_plan.plan_fleet returns), plan.md
and fleet_plan.png (load, replicas and the SLO per window: the policy against the static fleet).

    write_fleet_report(result, out_dir) -> list[Path]
    fleet_headline(result) -> list[tuple[str, str]]    # the short table the CLI prints
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np

from sim.files import plain_text, save_figure, write_file
from sim.planning.plan_report import simulations_text
from sim.runtime.autoscaler import held_steps

FLEET_PNG = "fleet_plan.png"


def _clock(seconds: float) -> str:
    return f"{seconds / 3600:,.1f} h" if seconds >= 7200 else f"{seconds:,.0f} s"


def _policy_text(p: dict) -> str:
    return (f"{p['min_replicas']}-{p['max_replicas']} replicas, target_in_flight {p['target_in_flight']:.3g} "
            f"(cold start {p['cold_start_s']:g} s)")


def _schedule_text(schedule: list) -> str:
    return ", ".join(f"{int(n)} from {_clock(t)}" for t, n in schedule)


def _scheduled_rows(r: dict) -> list[tuple[str, str]]:
    """The scheduled floor's rows (a workload with a rate profile), and which of the two is cheaper."""
    sch = r.get("scheduled")
    if not sch:
        return []
    q, p = sch["policy"], r["policy"]
    if q is None:
        return [("scheduled floor + policy", f"floor {_schedule_text(sch['schedule'])}: none meets the SLO")]
    cheaper = ("cheaper than the plain policy" if p is None or q["usd"] < p["usd"] else
               "no cheaper than the plain policy")
    return [("scheduled floor + policy", f"floor {_schedule_text(sch['schedule'])}; target_in_flight "
                                         f"{q['target_in_flight']:.3g}"),
            ("its cost", f"{q['gpu_hours']:,.1f} GPU-hours (${q['usd']:,.2f}), saving {sch['saving']['fraction']:.1%} "
                         f"on the static fleet: {cheaper}")]


def fleet_headline(r: dict) -> list[tuple[str, str]]:
    s, p = r["static"], r["policy"]
    rows = [("SLO", f"{r['slo']}, in every {_clock(r['window_s'])} of arrivals"),
            ("static fleet for the peak", f"{s['replicas']} x TP{r['tensor_parallel_size']} {r['hardware']}: "
                                          f"{s['gpu_hours']:,.1f} GPU-hours (${s['usd']:,.2f})")]
    cap = r.get("power_cap")
    if cap is not None:  # --power-cap-kw: the most the fleet the peak needs can draw, against the cap
        rows.append(("power cap", f"{cap['kw']:g} kW: the peak's {cap['replicas_at_peak']} replicas draw at most "
                                  f"{cap['peak_kw_at_most']:,.1f} kW ({cap['basis']}), "
                                  + ("within it" if cap["within"] else
                                     "over it: no fleet within the cap meets the SLO")))
    if p is None:
        if cap is not None and not cap["within"]:
            return rows + [("simulations", simulations_text(r, " runs"))]
        return rows + [("autoscaled policy", "none meets the SLO in every window below the static fleet")] \
            + _scheduled_rows(r) + [("simulations", simulations_text(r, " runs"))]
    sv = r["saving"]
    return rows + [("autoscaled policy", _policy_text(p)), *_faults_rows(r),
                   ("its cost", f"{p['gpu_hours']:,.1f} GPU-hours (${p['usd']:,.2f}); {p['mean_replicas']:.2f} "
                                f"replicas held on average, at most {p['peak_replicas']}"),
                   ("saving", f"{sv['fraction']:.1%}: {sv['gpu_hours']:,.1f} GPU-hours (${sv['usd']:,.2f}) over "
                              f"{_clock(p['end_s'])}"),
                   *_scheduled_rows(r),
                   ("simulations", simulations_text(r, " runs"))]


def _faults_rows(r: dict) -> list[tuple[str, str]]:
    """The policy under the scenario's faults (sim/planning/fleet_faults.py), where it has them."""
    f = r.get("faults")
    if f is None:
        return []
    label = "under the faults"
    if "refused" in f:
        return [(label, f"not judged: {f['refused']}")]
    first = f["rows"][0]
    text = (f"the SLO met in {first['availability_min']:.2%} of {first['minute_s']:g}-s windows (worst of "
            f"{f['seeds']} fault seeds; median {first['availability_median']:.2%}), {first['requests_lost']} "
            "requests lost to faults over the seeds")
    if f["target"] is not None:
        a = f["answer"]
        text += (f"; for {f['target']:.3%}: " + (
            f"min_replicas {a['min_replicas']} ({a['availability_min']:.2%} on its worst seed), "
            f"{a['gpu_hours']:,.2f} GPU-hours (${a['usd']:,.2f}) under the faults, against the policy's "
            f"{r['policy']['gpu_hours']:,.2f} without them" if a is not None else
            f"no min_replicas up to {f['rows'][-1]['min_replicas']} meets it"))
    rows = [(label, text)]
    if "on_demand" in f:  # faults.spot: the fleet on spot first, against all on demand
        def cost(a: dict | None) -> str:
            return ("meets it nowhere" if a is None else
                    f"min_replicas {a['min_replicas']}, ${a['usd']:,.2f} ({a['availability_min']:.2%} on its worst "
                    f"seed; {a.get('spot_gpu_hours', 0.0):,.2f} of {a['gpu_hours']:,.2f} GPU-hours on spot)")
        rows.append(("spot or on demand", f"spot first: {cost(f['spot_first'])}; all on demand: "
                     f"{cost(f['on_demand']['answer'])}: spot capacity "
                     + ("lowers the bill" if f["spot_lowers_bill"] else "does not lower the bill")))
    return rows


def _energy_cells(s: dict, p: dict | None) -> list[tuple[str, str, str]]:
    """kWh, electricity cost and CO2 of each (modelled, facility: sim/features/energy/power.py), where known."""
    def cell(row: dict | None, key: str, fmt: str) -> str:
        v = (row or {}).get("energy", {}).get(key)
        return "-" if v is None else fmt.format(v)
    rows = []
    for key, label, fmt in (("kwh", "energy (kWh, modelled)", "{:,.1f}"), ("usd", "electricity (USD)", "{:,.2f}"),
                            ("kgco2", "CO2 (kg)", "{:,.1f}")):
        if cell(s, key, fmt) != "-" or cell(p, key, fmt) != "-":
            rows.append((label, cell(s, key, fmt), cell(p, key, fmt)))
    return rows


def _observed(row: dict) -> str:
    return ", ".join(f"{k[:-3].upper()} {v:,.0f} ms" for k, v in row["observed"].items()
                     if v is not None and np.isfinite(v))


def _window_table(r: dict) -> list[str]:
    """Every window: its requests, and for the static fleet and the policy whether it met the SLO,
    its worst observed / target and the share of requests meeting their targets (per class, with
    workload classes)."""
    s, p = r["static"], r["policy"]
    if not s["windows"]:
        return []
    names = list(s["windows"][0].get("classes", {}))
    head = ["window", "requests", "static: met, worst", "policy: met, worst"]
    head += [f"policy: {n} meeting" for n in names] or ["policy: meeting"]
    lines = ["## Every window", "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    hours = s["end_s"] > 7200
    for k, ws in enumerate(s["windows"]):
        wp = p["windows"][k] if p is not None and k < len(p["windows"]) else None
        start = f"{ws['start_s'] / 3600:g} h" if hours else f"{ws['start_s']:g} s"
        cells = [start, f"{ws['requests']:,}",
                 f"{'yes' if ws['met'] else 'no'}, {ws['worst_ratio']:.2f}",
                 "-" if wp is None else f"{'yes' if wp['met'] else 'no'}, {wp['worst_ratio']:.2f}"]
        if names:
            cells += ["-" if wp is None else f"{wp['classes'][n]['fraction']:.1%}" for n in names]
        else:
            cells.append("-" if wp is None else f"{wp['fraction']:.1%}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines + ["", "worst: the largest observed / target over the window's targets (each class's own); "
                    "meeting: the share of the window's requests that met their targets.", ""]


def _command(r: dict, policy: dict) -> str:
    """The `servesim run` line that repeats a policy's run (its overrides quoted for a shell)."""
    return "servesim run " + r["scenario"] + "".join(f" --set {shlex.quote(o)}" for o in policy["overrides"])


def _each(row: dict) -> str:
    """Each seed run: yes / no; a first seed that missed is not run on the others."""
    return " / ".join("yes" if m else "no" for m in row["met_each"])


def _missed(row: dict) -> str:
    """Windows missed on the first seed, or where a run stopped at the first window it missed."""
    st = row.get("stopped")
    if st:
        return f"stopped at {_clock(st['at_s'])}: window {st['window'] + 1} missed ({st['metric'][:-3].upper()})"
    return str(row["windows_missed"])


def _hours(row: dict) -> str:
    return "-" if row.get("gpu_hours") is None else f"{row['gpu_hours']:,.2f}"


def _held(row: dict) -> str:
    return "-" if row.get("mean_replicas") is None else f"{row['mean_replicas']:.2f} / {row['peak_replicas']}"


def _faults_section(r: dict) -> list[str]:
    """plan.md's "Under the faults": the fault-free policy's day with the scenario's faults, and the
    floors tried for an availability target (sim/planning/fleet_faults.py)."""
    f = r.get("faults")
    if not f or "refused" in f:
        return []
    lines = ["## Under the faults", "",
             f"The policy's whole day with the scenario's faults, on fault seeds 0..{f['seeds'] - 1}; {f['rule']}.",
             "", "| min_replicas | SLO met in windows (worst / median / best seed) | requests lost | GPU-hours "
                 "(mean; on spot) | USD | meets |", "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {x['min_replicas']} | {x['availability_min']:.2%} / {x['availability_median']:.2%} / "
              f"{x['availability_max']:.2%} | {x['requests_lost']} | {x['gpu_hours']:,.2f}; "
              f"{x.get('spot_gpu_hours', 0.0):,.2f} | {x['usd']:,.2f} | {'yes' if x['met'] else 'no'} |"
              for x in f["rows"]]
    if "on_demand" in f:
        lines += ["", "All on demand (the faults without `spot`: no preemption, every GPU-hour at the plan's price):",
                  "", "| min_replicas | SLO met in windows (worst / median / best seed) | requests lost | GPU-hours "
                      "| USD | meets |", "| --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {x['min_replicas']} | {x['availability_min']:.2%} / {x['availability_median']:.2%} / "
                  f"{x['availability_max']:.2%} | {x['requests_lost']} | {x['gpu_hours']:,.2f} | {x['usd']:,.2f} | "
                  f"{'yes' if x['met'] else 'no'} |" for x in f["on_demand"]["rows"]]
        lines += ["", "Spot capacity " + ("lowers" if f["spot_lowers_bill"] else "does not lower") + " the bill"
                  + ("" if f["answer"] is None else f": the answer is {f['answer']['capacity']}, min_replicas "
                     f"{f['answer']['min_replicas']}, ${f['answer']['usd']:,.2f}") + "."]
    return lines + [""]


def _floor_section(r: dict, p: dict | None, sch: dict | None) -> list[str]:
    """plan.md's "A scheduled floor": the cron floor, the target above it, every target probed."""
    lines: list[str] = []
    if sch:
        q = sch["policy"]
        lines += ["## A scheduled floor", "",
                  "The workload's rate follows a profile, so its ramps are known ahead: a cron floor "
                  "(`min_replicas_schedule`) of the static fleet scaled to each segment's rate, each rise one cold "
                  f"start early: {_schedule_text(sch['schedule'])}"
                  + (f", repeating every {_clock(sch['period_s'])}" if sch["period_s"] else "") + "."]
        if q is None:
            lines += ["", "No target above it meets the SLO in every window below the static fleet.", ""]
        else:
            better = p is None or q["usd"] < p["usd"]
            lines += ["", f"With target_in_flight {q['target_in_flight']:.3g} above it: {q['gpu_hours']:,.2f} "
                      f"GPU-hours (${q['usd']:,.2f}), {q['mean_replicas']:.2f} / {q['peak_replicas']} replicas held "
                      f"(mean / peak), {len(q['windows']) - q['windows_missed']} of {len(q['windows'])} windows "
                      f"meeting the SLO; saving {sch['saving']['fraction']:.1%} on the static fleet, "
                      + ("**cheaper than the plain policy**." if better else "no cheaper than the plain policy."),
                      "", f"or: `{_command(r, q)}`", ""]
        lines += ["| target_in_flight | meets (each seed) | windows missed (first seed) | GPU-hours |",
                  "| --- | --- | --- | --- |"]
        lines += [f"| {t['target_in_flight']:.3g} | {_each(t)} | {_missed(t)} | {_hours(t)} |"
                  for t in sch["probes"]]
        lines.append("")
    return lines


def markdown(r: dict, figure: str | None) -> str:
    s, p = r["static"], r["policy"]
    windows = len(s["windows"])
    lines = [f"# Fleet plan: {r['name']}", "",
             f"{r['model']} on TP{r['tensor_parallel_size']} {r['hardware']} replicas at "
             f"${r['usd_per_gpu_hour']:g} per GPU-hour, over the scenario's whole run ({r['scenario']}). "
             f"SLO: {r['slo']}, judged in each of the {windows} windows of {_clock(r['window_s'])} of arrivals "
             "(every one must meet it), every request served"
             + (f", on seeds {' and '.join(map(str, r['seeds']))} (a candidate meets the SLO only when every seed's "
                "run does; costs are the first seed's)." if len(r["seeds"]) > 1 else "."), "",
             "| | static fleet for the peak | autoscaled policy |", "| --- | --- | --- |"]
    cells = [("replicas", f"{s['replicas']} all the time",
              "-" if p is None else _policy_text(p)),
             ("GPU-hours", f"{s['gpu_hours']:,.2f}", "-" if p is None else f"{p['gpu_hours']:,.2f}"),
             ("cost (USD)", f"{s['usd']:,.2f}", "-" if p is None else f"{p['usd']:,.2f}"),
             ("replicas held: mean / peak", f"{s['mean_replicas']:.2f} / {s['peak_replicas']}",
              "-" if p is None else f"{p['mean_replicas']:.2f} / {p['peak_replicas']}"),
             ("over the run (its percentile)", _observed(s), "-" if p is None else _observed(p)),
             ("windows meeting the SLO", f"{windows - s['windows_missed']} of {windows}",
              "-" if p is None else f"{len(p['windows']) - p['windows_missed']} of {len(p['windows'])}"),
             ("requests meeting every target", f"{s['fraction']:.2%}", "-" if p is None else f"{p['fraction']:.2%}"),
             *_energy_cells(s, p)]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in cells]
    lines.append("")
    if p is None:
        lines += ["No autoscaled policy meets the SLO in every window with fewer GPU-hours than the static fleet "
                  "(probes below).", ""]
    else:
        sv = r["saving"]
        lines += [f"**Saving: {sv['fraction']:.1%}**, {sv['gpu_hours']:,.2f} GPU-hours (${sv['usd']:,.2f}) over "
                  f"{_clock(p['end_s'])}.", "",
                  "The policy, as a scenario writes it:", "", "```yaml", "engine:", "  autoscaling:"]
        lines += [f"    {k}: {p[k]:.4g}" if isinstance(p[k], float) else f"    {k}: {p[k]}"
                  for k in ("min_replicas", "max_replicas", "target_in_flight", "interval_s", "cold_start_s",
                            "scale_down_delay_s", "tolerance")]
        lines += ["```", "", f"or: `{_command(r, p)}`", ""]
    own = r["own_policy"]
    a = r["autoscaling"]
    lines += [f"The scenario's own policy ({a['min_replicas']}-{a['max_replicas']} replicas, target_in_flight "
              f"{a['target_in_flight']:g}): {'meets' if own['met'] else 'misses'} the SLO "
              f"(on the first seed; windows missed: {_missed(own)}), {_hours(own)} GPU-hours.", ""]
    if figure:
        lines += [f"![the policy against the static fleet]({figure})", ""]
    sch = r.get("scheduled")
    lines += _floor_section(r, p, sch)
    lines += _faults_section(r)
    lines += _window_table(r) + ["## How it was found", "",
              "1. The static fleet: the fewest fixed replicas (engine.autoscaling off) that meet the SLO in every "
              "window, searched up from the fewest that could carry the peak flat out (the peak rate over one "
              "replica's saturated throughput).",
              "2. The policy: max_replicas = that fleet, target_in_flight on a grid of 2^(k/4) x the scenario's "
              "(1/16x to 16x), the largest that meets the SLO (a larger target holds fewer replicas), by "
              "bisection; when none does, min_replicas one higher. The scheduled floor's target is searched "
              "the same way, at the same time.",
              "", "| static replicas | meets (each seed) | windows missed (first seed) | GPU-hours |",
              "| --- | --- | --- | --- |"]
    lines += [f"| {t['replicas']} | {_each(t)} | {_missed(t)} | {_hours(t)} |"
              for t in r["static_probes"]]
    lines += ["", "| min_replicas | target_in_flight | meets (each seed) | windows missed (first seed) | GPU-hours "
              "| mean / peak replicas |", "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {t['min_replicas']} | {t['target_in_flight']:.3g} | {_each(t)} | "
              f"{_missed(t)} | {_hours(t)} | {_held(t)} |" for t in r["probes"]]
    lines += ["", f"{r['simulations']} runs simulated; a candidate is judged on the first seed while the search "
              "locates the answer, and a run stops at the first window it is certain to miss (it then has no cost: "
              "it meets no SLO); each answer is confirmed on every seed. GPU-hours: replica-seconds held "
              "(starting, serving, draining) x tensor_parallel_size / 3600, each over its own run (to its last "
              "request's finish).", ""]
    return "\n".join(lines)


@plain_text
def fleet_figure(r: dict):
    """Three panels over the run: arrivals per second in each window; replicas held, the policy's
    (from its spans) and the scheduled floor's, where there is one, against the static fleet; the
    worst observed / target per window, each."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    s, p = r["static"], r["policy"]
    q = (r.get("scheduled") or {}).get("policy")  # the policy above a scheduled floor (step 3)
    w = r["window_s"]
    hours = max(s["end_s"], p["end_s"] if p else 0) > 7200
    scale = 3600 if hours else 1
    starts = np.array([x["start_s"] for x in s["windows"]], dtype=float)
    fig = Figure(figsize=(11, 7.5), layout="constrained")
    axes = fig.subplots(3, 1, sharex=True)
    rate = np.array([x["requests"] for x in s["windows"]], dtype=float) / w
    axes[0].step(np.append(starts, starts[-1] + w) / scale, np.append(rate, rate[-1]), where="post", color="C0")
    axes[0].set_ylabel("arrivals\n(req/s)")
    axes[0].set_ylim(bottom=0)
    end = max(s["end_s"], p["end_s"] if p else 0)
    axes[1].hlines(s["replicas"], 0, s["end_s"] / scale, color="C7", lw=1.5,
                   label=f"static fleet: {s['replicas']}")
    if p is not None:
        t, held = held_steps([sp["start_s"] for sp in p["spans"]], [sp["end_s"] for sp in p["spans"]], p["end_s"])
        axes[1].step(np.array(t) / scale, held, where="post", color="C1", lw=1.2,
                     label=f"autoscaled: {_policy_text(p)}")
    if q is not None:
        t, held = held_steps([sp["start_s"] for sp in q["spans"]], [sp["end_s"] for sp in q["spans"]], q["end_s"])
        axes[1].step(np.array(t) / scale, held, where="post", color="C2", lw=1.2, ls="--",
                     label=f"scheduled floor + autoscaler: target_in_flight {q['target_in_flight']:.3g}")
    axes[1].set_ylabel("replicas held")
    axes[1].yaxis.set_major_locator(MaxNLocator(integer=True))
    axes[1].set_ylim(0, s["replicas"] * 1.5 + 1)  # (room above the fleet for the legend)
    axes[1].legend(loc="upper left", fontsize=8)
    mids = (starts + w / 2) / scale
    axes[2].plot(mids, [x["worst_ratio"] for x in s["windows"]], "o-", ms=3, color="C7", label="static fleet")
    if p is not None:
        axes[2].plot(mids[:len(p["windows"])], [x["worst_ratio"] for x in p["windows"]], "o-", ms=3, color="C1",
                     label="autoscaled")
    if q is not None:
        axes[2].plot(mids[:len(q["windows"])], [x["worst_ratio"] for x in q["windows"]], "s--", ms=3, color="C2",
                     label="scheduled floor + autoscaler")
    axes[2].axhline(1.0, color="red", ls="--", lw=0.8, label="the SLO (observed = target)")
    axes[2].set_ylabel("worst observed /\ntarget, per window")
    axes[2].set_ylim(bottom=0)
    axes[2].legend(loc="upper left", fontsize=8)
    axes[2].set_xlabel("time (h)" if hours else "time (s)")
    axes[2].set_xlim(0, end / scale)
    for ax in axes:
        ax.grid(alpha=0.3)
    title = f"{r['name']}: {r['slo']} in every {_clock(w)} of arrivals"
    if p is not None:
        title += (f"\nautoscaled {p['gpu_hours']:,.1f} GPU-hours against {s['gpu_hours']:,.1f} for "
                  f"{s['replicas']} fixed replicas: {r['saving']['fraction']:.0%} less")
    if q is not None:
        title += (f"; with a scheduled floor {q['gpu_hours']:,.1f}: "
                  f"{r['scheduled']['saving']['fraction']:.0%} less")
    axes[0].set_title(title)
    return fig


def write_fleet_report(r: dict, out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [write_file(out / "plan.json", json.dumps(r, indent=2) + "\n")]
    figure = None
    if r["static"]["windows"]:
        written.append(save_figure(fleet_figure(r), out / FLEET_PNG, dpi=110))
        figure = FLEET_PNG
    written.append(write_file(out / "plan.md", markdown(r, figure)))
    return written
