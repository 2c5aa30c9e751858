"""The energy figure (`servesim plot` draws it for every run with an energy section): a
GPU's mean power over the run beside the batch size, with its idle and TDP lines."""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure


def power_figure(run) -> Figure:
    e = run.summary["energy"]
    p = e["power_over_time"]
    width, n = p["bin_s"], len(p["gpu_w"])
    t = p["start_s"] + width * (np.arange(n) + 0.5)
    minutes = t[-1] > 1200 if n else False
    hours = t[-1] > 7200 if n else False
    scale, unit = (3600.0, "h") if hours else (60.0, "min") if minutes else (1.0, "s")
    fig = Figure(figsize=(11, 6), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    top.plot(t / scale, p["gpu_w"], color="C3", lw=1.2, label="a GPU's mean power in each stretch")
    top.axhline(p["tdp_w"], color="k", ls=":", lw=0.8, label=f"TDP {p['tdp_w']:g} W")
    top.axhline(p["idle_w"], color="grey", ls="--", lw=0.8, label=f"idle {p['idle_w']:g} W")
    measured = e.get("power_source") == "measured"
    top.set_ylabel("W per GPU (" + ("busy power measured" if measured else "modelled") + ")")
    top.set_ylim(0, p["tdp_w"] * 1.08)
    top.legend(loc="lower right", fontsize=8)
    bottom.plot(t / scale, p["batch"], color="C0", lw=1.2)
    bottom.set_ylabel("batch size\n(requests an iteration,\nper engine)")
    bottom.set_ylim(bottom=0)
    bottom.set_xlabel(f"time ({unit})")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    cells = [f"{e['kwh']:.3g} kWh (facility)", f"GPU avg {e['gpu_avg_w']:.0f} W, peak {e['gpu_peak_w']:.0f} W"]
    if e.get("j_per_output_token") is not None:
        cells.append(f"{e['j_per_output_token']:.3g} J per output token")
    top.set_title(f"{run.name}: power over the run ({n} stretches of {width:.3g} s)\n" + ", ".join(cells)
                  + ("; busy power measured per kernel, idle stated (docs/energy.md)"
                     if measured else "; stated model, not a power meter (docs/energy.md)"), fontsize=10, loc="left")
    return fig
