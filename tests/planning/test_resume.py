"""An interrupted plan keeps what it ran (DIR/simulations.jsonl) and resumes: the same command
again reads those back, simulates only what was missing, and answers as an uninterrupted plan."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from sim.planning.journal import FILE, Journal
from sim.planning.plan_request import PlanRequest, prepare

REPO = Path(__file__).parents[2]
QUICKSTART = REPO / "scenarios" / "quickstart.yaml"
SMALL = dict(slo="ttft_ms=500,tpot_ms=50", horizon_s=15, min_requests=300, resolution=0.1, seeds=2, workers=1)


def _interrupted(request: PlanRequest, after: int) -> None:
    """Run the plan, interrupting it (as Ctrl-C would) after `after` simulations."""
    job = prepare(request)

    def progress(done, total=None, phase=None):
        if done >= after:
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        job.run(progress)


def _timeless(doc):
    """A result without the seconds each simulation took (a read-back one keeps its first run's)."""
    if isinstance(doc, dict):
        return {k: _timeless(v) for k, v in doc.items() if k not in ("wall_s", "simulated_wall_s", "read_back")}
    if isinstance(doc, list):
        return [_timeless(v) for v in doc]
    return doc


def test_an_interrupted_plan_resumes_with_the_same_answer(tmp_path):
    whole = PlanRequest(QUICKSTART, target_rate=30.0, out=tmp_path / "whole", **SMALL)
    job = prepare(whole)
    once = job.run()
    job.write(once)
    cut = replace(whole, out=tmp_path / "cut")
    _interrupted(cut, after=25)
    kept = [json.loads(x) for x in (tmp_path / "cut" / FILE).read_text().splitlines()]
    assert kept[0]["format"] == "servesim-plan-journal/1" and len(kept) - 1 >= 24  # the header, then each run
    again = prepare(cut)
    notes: list[str] = []
    resumed = again.run(note=notes.append)
    assert notes and notes[0].startswith("resuming: ") and resumed["read_back"] >= 24
    assert _timeless(resumed) == _timeless(once)  # the same steps, the same answer
    # a second resume simulates nothing at all
    assert prepare(cut).run()["read_back"] == resumed["simulations"]


def test_an_interrupted_day_plan_resumes_with_the_same_answer(tmp_path):
    from planning.test_fleet_plan import DAY

    path = tmp_path / "day.yaml"
    path.write_text(yaml.safe_dump(DAY))
    day = dict(window_s=150.0, workers=1)
    once = prepare(PlanRequest(path, out=tmp_path / "whole", **day)).run()
    _interrupted(PlanRequest(path, out=tmp_path / "cut", **day), after=4)
    resumed = prepare(PlanRequest(path, out=tmp_path / "cut", **day)).run()
    assert _timeless(resumed) == _timeless(once)
    assert resumed["policy"] == once["policy"] and resumed["static"]["replicas"] == once["static"]["replicas"]


def test_a_journal_of_other_inputs_or_damaged_lines_is_not_read_back(tmp_path):
    j = Journal(tmp_path, {"files": {"scenario": "a"}})
    j.put("k1", {"met": True, "wall_s": 0.1})
    j.put("k2", {"met": False, "wall_s": 0.2})
    j.close()
    with open(tmp_path / FILE, "a") as f:
        f.write('{"key": "k3", "result": {"met": tr')  # a torn last line (killed mid-write)
    same = Journal(tmp_path, {"files": {"scenario": "a"}})
    assert same.kept == 2 and same.get("k1") == {"met": True, "wall_s": 0.1} and same.get("k3") is None
    other = Journal(tmp_path, {"files": {"scenario": "b"}})
    notes: list[str] = []
    other.note = notes.append
    assert other.kept == 0 and other.restarted
    assert (tmp_path / FILE).read_text().count("\n") == 3  # nothing rewritten before a result comes
    other.put("k9", {"met": True, "wall_s": 1.0})
    other.close()
    lines = (tmp_path / FILE).read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["files"] == {"scenario": "b"} and notes


def test_a_plan_refused_for_bad_input_writes_nothing(tmp_path):
    out = tmp_path / "p"
    job = prepare(PlanRequest(QUICKSTART, target_users=10, out=out, **SMALL))
    from sim.config.errors import ScenarioError

    with pytest.raises(ScenarioError, match="--target-users"):
        job.run()
    assert not out.exists()


def test_a_hand_edited_result_is_simulated_again_and_a_journal_that_is_no_file_is_refused(tmp_path):
    request = PlanRequest(QUICKSTART, target_rate=30.0, out=tmp_path / "p", **SMALL)
    first = prepare(request).run()
    path = tmp_path / "p" / FILE
    lines = path.read_text().splitlines()
    row = json.loads(lines[1])
    del row["result"]["ttft_ms"]  # (a hand edit: a key the plan reads is gone)
    path.write_text("\n".join([lines[0], json.dumps(row), *lines[2:]]) + "\n")
    again = prepare(request).run()
    assert again["read_back"] == first["simulations"] - 1 and _timeless(again) == _timeless(first)
    folder = tmp_path / "q"
    (folder / FILE).mkdir(parents=True)
    from sim.config.errors import ScenarioError

    with pytest.raises(ScenarioError, match=f"{FILE} there is not a regular file"):
        prepare(replace(request, out=folder)).run()
