"""The faults figure (`servesim plot` draws it for a run with a `faults` section): the replicas up,
draining and down over the run; each request's TTFT by its arrival, the retried ones marked and
the failed ones at the top; and which windows met the SLO."""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator


def states_over_time(timeline: list[dict], size: int, end_s: float):
    """(times, up, draining, down): the replicas in each state from each time on."""
    state = ["up"] * size
    times, rows = [0.0], [(size, 0, 0)]
    for e in sorted(timeline, key=lambda e: e["t_s"]):
        state[e["replica"]] = e["state"]
        times.append(e["t_s"])
        rows.append((state.count("up"), state.count("draining"), state.count("down")))
    times.append(end_s)
    rows.append(rows[-1])
    up, draining, down = (np.array(c, dtype=float) for c in zip(*rows))
    return np.array(times), up, draining, down


def faults_figure(run) -> Figure:
    f = run.summary["faults"]
    q = run.requests
    size = f["cost"]["on_demand_replicas"] + f["cost"]["spot_replicas"]
    finish = q["finish_s"].to_numpy(dtype=float)
    end_s = float(np.nanmax(finish)) if np.isfinite(finish).any() else 1.0
    scale, unit = (3600.0, "h") if end_s > 7200 else (60.0, "min") if end_s > 600 else (1.0, "s")
    t, up, draining, down = states_over_time(f["timeline"], size, end_s)
    fig = Figure(figsize=(11, 8), layout="constrained")
    axes = fig.subplots(3, 1, sharex=True, height_ratios=(2, 3, 1))
    ax = axes[0]
    ax.stackplot(t / scale, up, draining, down, step="post", colors=("#4c9f70", "#f2b134", "#d1495b"),
                 labels=("up (routed to)", "draining (no new requests)", "down (failed, restarting, preempted)"))
    ax.set_ylabel("replicas")
    ax.set_ylim(0, size)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(loc="lower left", fontsize=8, ncol=3)
    ax = axes[1]
    arrival = q["arrival_s"].to_numpy(dtype=float) / scale
    ttft = q["ttft_s"].to_numpy(dtype=float) * 1e3
    attempts = q["attempts"].to_numpy() if "attempts" in q else np.ones(len(q), dtype=int)
    failed = q["failed"].to_numpy(dtype=bool) if "failed" in q else np.zeros(len(q), dtype=bool)
    plain = (attempts == 1) & ~failed
    ax.scatter(arrival[plain], ttft[plain], s=4, color="C0", alpha=0.5, lw=0, label="served at the first attempt")
    retried = (attempts > 1) & ~failed
    ax.scatter(arrival[retried], ttft[retried], s=14, color="C1", marker="^", lw=0,
               label=f"retried ({int(retried.sum())})")
    top = float(np.nanmax(ttft)) * 1.05 if np.isfinite(ttft).any() else 1.0
    if failed.any():
        ax.scatter(arrival[failed], np.full(failed.sum(), top), s=18, color="C3", marker="x",
                   label=f"failed ({int(failed.sum())})")
    target = ((run.summary.get("goodput") or {}).get("ttft_ms") or {}).get("target")
    if target:
        ax.axhline(target, color="red", ls="--", lw=0.8, label=f"SLO TTFT {target:g} ms")
    ax.set_yscale("log")
    ax.set_ylabel("TTFT (ms, log)\nby arrival")
    ax.legend(loc="upper right", fontsize=8, framealpha=0.9)  # (faults strike early in a short run: clear of them)
    ax = axes[2]
    a = f["availability"]
    if "fraction" in a:
        window = a["minute_s"]
        starts = np.array([w[0] for w in a["windows"]], dtype=float)
        met = np.array([bool(w[1]) for w in a["windows"]])
        ax.bar(starts[met] / scale, np.ones(int(met.sum())), width=window / scale, align="edge", color="#4c9f70",
               lw=0, label="met")
        # a missed window drawn at least 1/300 of the run wide, so that one minute shows on a day
        ax.bar(starts[~met] / scale, np.ones(int((~met).sum())), width=max(window, end_s / 300) / scale,
               align="edge", color="#d1495b", lw=0, label=f"missed ({int((~met).sum())})")
        ax.legend(loc="lower left", fontsize=8, ncol=2)
        ax.set_yticks([])
        ax.set_ylabel("SLO met\nper window")
        title = f"SLO met in {a['fraction']:.2%} of {window:g}-s windows ({a['met']}/{a['minutes']})"
    else:
        title = a.get("source", "")
    ax.set_xlabel(f"time ({unit})")
    for x in axes:
        x.grid(alpha=0.3)
    axes[0].set_title(f"{run.name}: {f['failures']} failures, {f['outages']} outages, {f['drains']} drains, "
                      f"{f['preemptions']} spot preemptions; {f['requests_retried']} requests retried, "
                      f"{f['requests_failed']} failed; capacity lost {f['capacity']['capacity_lost_fraction']:.1%}"
                      f"\n{title}", fontsize=10, loc="left")
    return fig
