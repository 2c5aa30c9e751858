"""The engine curve: each engine setting's own sustained load under the SLO, and the best setting.

    curve = engine_curve(ev, knob, search)   # search: max_load() for the scenario's own setting

Settings are ranked by the highest load each sustains under the SLO (the goodput there is reported
too, but goodput at a short run's sustained load is dominated by its drain tail and cannot rank).
Settings: max_num_seqs over SEQS_GRID (capped by the sequences of the workload's
mean length that fit in the KV cache, and by max_num_batched_tokens) at the scenario's
max_num_batched_tokens; then, for the chunked scheduler, max_num_batched_tokens over TOKENS_GRID at
the best max_num_seqs. A small 2-D design, not the full product, unless the user lists candidates
for both knobs: then every pair.

Each setting's search is coarser than the load search: a grid of `curve_resolution` steps anchored at
the scenario setting's answer, `curve_seeds` seeds per point (`curve_max_seeds` when they are near a
target), started at the neighbouring setting's answer and galloping from there. The winner (highest
sustained load; a tie on the grid goes to the simpler setting) is then searched again on the load
search's own grid and seeds: that answer sizes the cluster.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from sim.config.errors import ScenarioError
from sim.planning.load_search import Knob, max_load
from sim.schedulers import SCHEDULERS
from sim.workload.generators import build_workload

SEQS_GRID = (8, 16, 32, 64, 128, 256, 512)
TOKENS_GRID = (512, 1024, 2048, 4096, 8192, 16384)
SETTING_KEYS = ("max_num_seqs", "max_num_batched_tokens")


def kv_seq_cap(sc) -> int:
    """Sequences of the workload's mean length (prompt + output) that fit in the KV cache."""

    w = sc.workload if sc.workload.trace is not None else replace(  # a trace: its own requests
        sc.workload, num_requests=min(sc.workload.num_requests or 1000, 2000))
    w = build_workload(w, np.random.default_rng(sc.seed))
    return sc.budget.max_concurrent_seqs(int(np.mean(w.prompt_tokens + w.output_tokens)))


def engine_overrides(engine, setting: dict) -> tuple[str, ...]:
    """Overrides for the values that differ from the scenario's, so that the scenario's own setting
    shares its cache entries with the load search."""
    return tuple(f"engine.{k}={v}" for k, v in setting.items() if getattr(engine, k) != v)


def engine_curve(ev, knob: Knob, search: dict, *, seqs_grid: tuple[int, ...] | None = None,
                 tokens_grid: tuple[int, ...] | None = None, on_refine=None) -> dict:
    """Sustained load and goodput per setting; `chosen` the best; `chosen_search` its full search.
    seqs_grid / tokens_grid: the user's candidates (taken as given, beyond the KV cap too), else
    SEQS_GRID capped by the KV cache and TOKENS_GRID; on_refine: called when the winner's search starts."""
    e, o = ev.scenario.engine, ev.options
    grid = knob.anchored(search["answer"], max(o.curve_resolution, knob.resolution))
    cap = kv_seq_cap(ev.scenario)
    kind = SCHEDULERS[e.scheduler]
    if kind.token_budget:  # every running sequence needs a token of the budget
        cap = min(cap, e.max_num_batched_tokens)
    own = {k: getattr(e, k) for k in SETTING_KEYS}
    done = {tuple(own.values()): _entry(own, (), search, o.curve_seeds)}

    seqs = sorted(set(seqs_grid) | {e.max_num_seqs} if seqs_grid else
                  {v for v in SEQS_GRID if v <= max(cap, SEQS_GRID[0])} | {e.max_num_seqs})
    seq_entries = _ladder(ev, grid, done, [{**own, "max_num_seqs": v} for v in seqs], seqs.index(e.max_num_seqs))
    best = _best(seq_entries) or done[tuple(own.values())]
    token_entries: list[dict] = []
    if kind.token_budget and kind.chunks_prompts:  # the budget trades TTFT for ITL: search it
        # at the best max_num_seqs; at every one when the user gave both lists (the full product)
        for n in (seqs if seqs_grid and tokens_grid else [best["max_num_seqs"]]):
            tokens = sorted({t for t in tokens_grid or TOKENS_GRID if t >= n} | {e.max_num_batched_tokens})
            token_entries += _ladder(ev, grid, done, [{"max_num_seqs": n, "max_num_batched_tokens": t}
                                                      for t in tokens], tokens.index(e.max_num_batched_tokens))
        best = _best(token_entries) or best
    chosen = {k: best[k] for k in SETTING_KEYS}
    every = list({id(p): p for p in seq_entries + token_entries}.values())
    if chosen == own:
        chosen_search = search
    else:  # refine the winner on the load search's grid and seeds, from its coarse answer
        if on_refine is not None:
            on_refine()
        chosen_search = max_load(ev, knob, engine_overrides(e, chosen), start=knob.index(best["sustained"]),
                                 gallop=True)
    return {"grid": {"base": search["answer"], "resolution": grid.resolution, "unit": grid.unit,
                     "seeds": list(o.curve_ladder()[::2])},
            "kv_seq_cap": cap, "max_num_seqs": seq_entries, "max_num_batched_tokens": token_entries,
            "chosen": chosen, "chosen_search": chosen_search, "ties": ties(every, best),
            "ranked_by": "sustained load (ties on the grid: the simpler setting)"}


def _ladder(ev, grid: Knob, done: dict, settings: list[dict], anchor: int) -> list[dict]:
    """Search each setting, walking out from settings[anchor] (already in `done`, or started at the
    grid's base); each starts at its neighbour's answer. Settings the scenario rules refuse (e.g.
    max_num_batched_tokens < max_num_seqs) are left out."""
    e = ev.scenario.engine
    order = [anchor] + list(range(anchor - 1, -1, -1)) + list(range(anchor + 1, len(settings)))
    entries: dict[int, dict] = {}
    for pos in order:
        setting = settings[pos]
        key = tuple(setting[k] for k in SETTING_KEYS)
        if key not in done:
            extra = engine_overrides(e, setting)
            try:
                ev.load(extra)
            except ScenarioError:
                continue
            found = max_load(ev, grid, extra, start=_start(grid, entries, pos), gallop=True,
                             seeds=ev.options.curve_ladder(), **setting)
            done[key] = _entry(setting, extra, found, ev.options.curve_seeds)
        entries[pos] = done[key]
    return [entries[p] for p in sorted(entries)]


def _start(grid: Knob, entries: dict, pos: int) -> int:
    """Where to start a setting's search: its neighbour's answer, times the ratio of the neighbour's
    to the next one out when both are known (capacity moves by similar factors along a ladder)."""
    for side in (1, -1):
        near, far = entries.get(pos + side), entries.get(pos + 2 * side)
        if near is None:
            continue
        if near["sustained"] is None:
            return grid.index(near["next"])
        if far is not None and far["sustained"] is not None:
            return grid.index(near["sustained"] ** 2 / far["sustained"])
        return grid.index(near["sustained"])
    return 0


def _entry(setting: dict, extra: tuple[str, ...], found: dict, common_seeds: int) -> dict:
    """One setting on the curve: its sustained load, the goodput there and the points that decide
    it. The goodput is the mean over the first `common_seeds` seeds, which every point has: settings
    then compare on the same arrivals."""
    point = found["answer_point"]
    return {**{k: setting[k] for k in SETTING_KEYS}, "overrides": list(extra),
            "sustained": found["answer"], "next": found["next"], "resolution": found["resolution"],
            "goodput_rps": float(np.mean(point["goodput_rps_by_seed"][:common_seeds])) if point else 0.0,
            "point": point, "next_point": found["next_point"],
            "judged": [[p["load"], p["passes"], p["seeds"]] for p in found["curve"]]}


def _best(entries: list[dict]) -> dict | None:
    """The highest sustained load (goodput at a load would rank by a short run's drain tail). Settings on the same
    grid point are a tie, which goes to
    the simpler setting: the scenario's own (no overrides), then fewer changed knobs, then the
    smaller max_num_seqs and max_num_batched_tokens (less memory, shorter iterations). None when no
    setting meets the SLO at any load."""
    ok = [p for p in entries if p["sustained"] is not None]
    return max(ok, key=lambda p: (p["sustained"], -len(p["overrides"]), -p["max_num_seqs"],
                                  -p["max_num_batched_tokens"])) if ok else None


def ties(entries: list[dict], best: dict) -> list[dict]:
    """The other settings that sustain the same grid load as `best` (reported as ties)."""
    return [{k: p[k] for k in SETTING_KEYS} for p in entries
            if p is not best and p["sustained"] == best["sustained"]]
