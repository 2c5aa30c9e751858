"""Adding a plug-in takes what docs/simulator.md ("Plug-ins") says: one reader, rule, model or preset
plus one registry line. Each test registers one (the registry line, as monkeypatch.setitem) and
runs it through the scenario loader and the simulator; numbers by hand. (A new scheduler:
tests/toy_scheduler.py, run by tests/schedulers/test_step_contract.py.)"""
import numpy as np
import pandas as pd
import pytest

from sim.config.errors import ScenarioError
from sim.cost.registry import COST_MODELS, CostModelKind
from sim.presets.hardware import HARDWARE_PRESETS, HardwareSpec
from sim.runtime.routers import ROUTERS
from sim.scenario import scenario_from_dict
from sim.simulate import simulate
from sim.workload.traces import TRACE_FORMATS, TraceFormat

ONE_REQUEST = {"arrival": {"process": "constant", "rate": 1}, "num_requests": 4,
               "prompt_tokens": {"dist": "fixed", "value": 10}, "output_tokens": {"dist": "fixed", "value": 3}}


def scenario(**over):
    raw = {"model": "llama-3-8b", "hardware": "h100-sxm", "cost_model": "unit",
           "engine": {"scheduler": "chunked"}, "workload": ONE_REQUEST}
    raw.update(over)
    return scenario_from_dict(raw)


def test_a_trace_format_is_a_reader_and_one_registry_line(tmp_path, monkeypatch):
    """A tab-separated trace with arrivals in minutes: found by its extension, read by its reader."""
    def read(path, name):
        df = pd.read_csv(path, sep="\t")
        return pd.DataFrame({"arrival_s": df["minute"].to_numpy(float) * 60, "prompt_tokens": df["in"],
                             "output_tokens": df["out"], "priority": np.zeros(len(df), dtype=np.int64)})

    monkeypatch.setitem(TRACE_FORMATS, "tsv_minutes",
                        TraceFormat(read, lambda path, head: path.suffix == ".tsv", (), "a TSV in minutes"))
    trace = tmp_path / "t.tsv"
    trace.write_text("minute\tin\tout\n0\t10\t2\n0.5\t20\t4\n2\t5\t1\n")
    for workload in ({"trace": str(trace)}, {"trace": str(trace), "format": "tsv_minutes"}):
        r = simulate(scenario(workload=workload))
        assert r.requests["arrival_s"].tolist() == [0.0, 30.0, 120.0]
        assert r.requests["prompt_tokens"].tolist() == [10, 20, 5]
        assert r.requests["output_tokens"].tolist() == [2, 4, 1]
    with pytest.raises(ScenarioError, match="tsv_minutes"):  # the registry names it in the choices
        scenario(workload={"trace": str(trace), "format": "tsv"})


def test_a_router_is_a_class_and_one_registry_line(monkeypatch):
    class LastReplica:  # built as Rule(num_replicas, routing); decided up front, so never attached
        def __init__(self, num_replicas, routing=None):
            self.last = num_replicas - 1

        def plan(self, num_requests):
            return np.full(num_requests, self.last)

        def choose(self, rid, loads):
            return self.last

    monkeypatch.setitem(ROUTERS, "last", LastReplica)
    r = simulate(scenario(engine={"scheduler": "chunked", "replicas": 3, "router": "last"}))
    assert r.requests["replica"].tolist() == [2, 2, 2, 2]


def test_a_cost_model_is_a_class_and_one_registry_line(monkeypatch):
    """Every iteration costs `seconds`: a request alone (arrivals 1 s apart) takes 3 iterations
    (prefill + first token, then 2 decodes), so its E2E is 3 x 0.25 s and its TTFT 0.25 s."""
    class Fixed:
        def __init__(self, seconds):
            self.seconds = seconds

        def step_times(self, stats, steps=1):
            return np.full(steps, self.seconds)

    def options(value, where, hardware, tp, model=None):
        if not isinstance(value, dict) or set(value) != {"seconds"}:
            raise ScenarioError(f"{where}: give {{seconds: S}}")
        return {"seconds": float(value["seconds"])}

    monkeypatch.setitem(COST_MODELS, "fixed", CostModelKind(options, lambda kw, m, hw, tp: Fixed(**kw), dict,
                                                            False, "every iteration lasts `seconds`"))
    r = simulate(scenario(cost_model={"fixed": {"seconds": 0.25}}))
    assert r.requests["e2el_s"].tolist() == [0.75] * 4
    assert r.requests["ttft_s"].tolist() == [0.25] * 4
    assert r.summary["run"]["cost_model"]["name"] == "fixed"


def test_a_gpu_preset_is_one_registry_line(monkeypatch):
    """A GPU without kernel tables runs on the roofline, and says so."""
    gpu = HardwareSpec("x-100", 96e9, 4.0e12, 1000e12, 400e9, 2.5)
    monkeypatch.setitem(HARDWARE_PRESETS, "x-100", gpu)
    sc = scenario(hardware="x-100", cost_model=None)
    assert sc.hardware is gpu and sc.cost_model.name == "roofline" and sc.cost_model.notice
    # 96 GB against the H100 preset's 80 GB: the same weights leave more room for KV blocks
    assert sc.budget.num_gpu_blocks > scenario(hardware="h100-sxm").budget.num_gpu_blocks
    assert simulate(sc).summary["completed"] == 4
