"""sim/scenario.py: scenario YAML -> validated Scenario; every bad input is one ScenarioError line."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from sim.config.errors import ScenarioError
from sim.presets.models import MODEL_PRESETS
from sim.scenario import EngineConfig, Scenario, SLOConfig, load_scenario, scenario_from_dict

REPO = Path(__file__).parents[2]
BUNDLED = sorted((REPO / "scenarios").glob("*.yaml"))
MINIMAL = {
    "model": "llama-3-8b",
    "hardware": "h100-sxm",
    "workload": {"arrival": {"process": "poisson", "rate": 8.0},
                 "prompt_tokens": {"dist": "fixed", "value": 100},
                 "output_tokens": {"dist": "fixed", "value": 10},
                 "num_requests": 10},
}


def write(tmp_path: Path, raw, name: str = "chat.yaml") -> Path:
    path = tmp_path / name
    path.write_text(raw if isinstance(raw, str) else yaml.safe_dump(raw))
    return path


def with_(**changes) -> dict:
    """MINIMAL with top-level keys replaced (None deletes) and engine/slo merged in."""
    raw = json.loads(json.dumps(MINIMAL))
    for key, value in changes.items():
        if value is None:
            raw.pop(key, None)
        else:
            raw[key] = value
    return raw


def error(raw, tmp_path: Path, overrides=(), name: str = "chat.yaml") -> str:
    """The one-line message that loading `raw` from tmp_path/name gives."""
    path = write(tmp_path, raw, name)
    with pytest.raises(ScenarioError) as exc:
        load_scenario(path, overrides=overrides)
    message = str(exc.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------- good input

def test_defaults(tmp_path):
    sc = load_scenario(write(tmp_path, MINIMAL, "my-run.yaml"))
    assert sc.name == "my-run"            # the file's stem
    assert sc.seed == 0
    assert sc.engine == EngineConfig()    # every engine key defaults
    assert sc.engine.scheduler == "continuous" and sc.engine.num_gpu_blocks is None
    # llama-3-8b on h100-sxm has a shipped profile; the resolved scenario writes the engine
    # overheads in force (sim/cost/overheads.py's fitted defaults), so it repeats the run if they change
    from sim.cost.overheads import default_overheads
    assert sc.cost_model.as_yaml() == {"measured": default_overheads().as_dict()}
    assert sc.slo is None
    assert sc.model == MODEL_PRESETS["llama-3-8b"]
    assert sc.hardware.name == "h100-sxm"
    assert sc.source == tmp_path / "my-run.yaml" and sc.base_dir == tmp_path


def test_null_means_default(tmp_path):
    text = yaml.safe_dump(MINIMAL) + "name:\nseed:\ncost_model:\nslo:\nengine:\n  max_num_seqs:\n  block_size: null\n"
    sc = load_scenario(write(tmp_path, text))
    assert (sc.name, sc.seed, sc.cost_model.name, sc.slo, sc.engine) == ("chat", 0, "measured", None, EngineConfig())


def test_expert_parallelism_on_a_dense_model_is_refused(tmp_path):
    """vLLM ignores --enable-expert-parallel on a dense model; a scenario that sets it has mistaken
    the model, so it is one line naming the key, not a run that silently means nothing."""
    with pytest.raises(ScenarioError, match=r"engine.enable_expert_parallel: .* is not a mixture of experts"):
        load_scenario(write(tmp_path, with_(engine={"enable_expert_parallel": True})))


def test_every_key_given(tmp_path):
    engine = dict(scheduler="chunked", max_num_seqs=128, max_num_batched_tokens=2048, block_size=32,
                  gpu_memory_utilization=0.8, num_gpu_blocks=5000, tensor_parallel_size=2,
                  replicas=3, router="weighted", policy="sjf", batch_timeout_s=0.25,
                  kv_cache_dtype="fp8", enable_expert_parallel=False, enable_prefix_caching=False,
                  scheduler_reserve_full_isl=False, enforce_eager=True,
                  speculative={"method": "eagle", "num_speculative_tokens": 2, "acceptance_rate": [0.8, 0.6]},
                  routing={"staleness_s": 0.05, "weights": {"prefix_affinity": 1.0, "queue_depth": 0.0,
                                                            "kv_utilization": 4.0}})
    raw = with_(name="x", seed=7, cost_model="unit", engine=engine,
                slo={"ttft_ms": 300, "tpot_ms": 40, "percentile": 90})
    sc = load_scenario(write(tmp_path, raw))
    assert (sc.name, sc.seed, sc.cost_model.as_yaml()) == ("x", 7, "unit")
    assert sc.engine.speculative.acceptance == (0.8, 0.6) and sc.engine.speculative.as_yaml() == engine["speculative"]
    assert sc.engine.disaggregation is None and sc.engine.autoscaling is None and sc.engine.admission is None
    assert sc.engine.routing.as_yaml(sc.engine.router) == engine["routing"]
    assert {k: v for k, v in {**dataclasses.asdict(sc.engine), "speculative": engine["speculative"],
                              "routing": engine["routing"]}.items()
            if k not in ("disaggregation", "autoscaling", "admission", "lora",  # (their own tests; offloading
                         "kv_offloading_size", "kv_offloading_backend",  # needs prefix caching, pipeline
                         "pipeline_parallel_size", "data_parallel_size", "all2all_backend",  # parallelism no
                         "max_cudagraph_capture_size")} == engine  # (not with enforce_eager: tests/cost/test_eager.py)
    # speculative decoding, data parallelism a MoE model)
    assert sc.slo == SLOConfig(ttft_ms=300.0, tpot_ms=40.0, percentile=90.0)


def test_scenario_from_dict_leaves_input_alone_and_is_replaceable():
    raw = with_(engine={"max_num_seqs": 64})
    before = json.dumps(raw, sort_keys=True)
    sc = scenario_from_dict(raw, overrides=["engine.max_num_seqs=32", "slo.ttft_ms=200"])
    assert json.dumps(raw, sort_keys=True) == before
    assert sc.engine.max_num_seqs == 32 and sc.slo.ttft_ms == 200.0 and sc.name == "scenario"
    smaller = dataclasses.replace(sc, engine=dataclasses.replace(sc.engine, max_num_seqs=8))
    assert isinstance(smaller, Scenario) and smaller.engine.max_num_seqs == 8
    with pytest.raises(dataclasses.FrozenInstanceError):
        sc.engine.max_num_seqs = 1  # type: ignore[misc]


def test_overrides_parse_yaml_scalars_and_seed_wins(tmp_path):
    path = write(tmp_path, with_(seed=3, engine={"num_gpu_blocks": 100}))
    sc = load_scenario(path, overrides=["engine.max_num_seqs=128", "engine.gpu_memory_utilization=0.5",
                                        "engine.num_gpu_blocks=", "engine.scheduler=static",
                                        "workload.arrival.rate=2", "seed=5"], seed=11)
    assert sc.engine.max_num_seqs == 128 and sc.engine.gpu_memory_utilization == 0.5
    assert sc.engine.num_gpu_blocks is None  # "KEY=" is YAML null
    assert sc.engine.scheduler == "static"
    assert sc.workload.arrival.rate == 2.0
    assert sc.seed == 11                     # --seed beats both the file and --set seed=...
    assert load_scenario(path, overrides=["seed=5"]).seed == 5


def test_relative_paths_resolve_against_the_yaml_folder(tmp_path, monkeypatch):
    (tmp_path / "sc" / "traces").mkdir(parents=True)
    (tmp_path / "sc" / "traces" / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,4,2\n")
    (tmp_path / "sc" / "hf").mkdir()
    (tmp_path / "sc" / "hf" / "config.json").write_text(json.dumps({
        "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256}))
    raw = with_(workload={"trace": "traces/t.csv"}, model={"hf_config": "hf/config.json", "name": "mini"})
    write(tmp_path / "sc", raw)
    monkeypatch.chdir(tmp_path)  # the working directory must not matter
    sc = load_scenario(Path("sc/chat.yaml"))
    assert sc.workload.trace == (tmp_path / "sc" / "traces" / "t.csv").resolve()
    assert (sc.model.name, sc.model.num_layers, sc.model.num_kv_heads) == ("mini", 2, 2)


def test_profile_cost_model_resolves_against_the_yaml_folder():
    raw = with_(cost_model={"profile": "profiles/example-h100-llama-3-8b.yaml"})
    sc = scenario_from_dict(raw, source="scenarios/x.yaml", base_dir=REPO / "scenarios")
    assert sc.cost_model.as_yaml() == {"profile": str(REPO / "scenarios/profiles/example-h100-llama-3-8b.yaml")}


def test_static_may_have_a_token_budget_below_max_num_seqs():
    sc = scenario_from_dict(with_(engine={"scheduler": "static", "max_num_seqs": 64,
                                          "max_num_batched_tokens": 16}))
    assert sc.engine.max_num_batched_tokens == 16


def test_router_and_batch_timeout_are_accepted_where_they_do_not_apply():
    # So that a sweep over replicas or schedulers can start from any scenario (documented).
    sc = scenario_from_dict(with_(engine={"replicas": 1, "router": "least_loaded",
                                          "scheduler": "chunked", "batch_timeout_s": 1.0}))
    assert sc.engine.router == "least_loaded"


@pytest.mark.parametrize("block_size", [1, 2, 16, 1024])
def test_block_size_powers_of_two(block_size):
    assert scenario_from_dict(with_(engine={"block_size": block_size})).engine.block_size == block_size


@pytest.mark.parametrize("path", BUNDLED, ids=lambda p: p.name)
def test_every_bundled_scenario_loads(path):
    sc = load_scenario(path)
    assert sc.name == path.stem


def test_bundled_scenarios_exist():
    names = {p.stem for p in BUNDLED}
    assert {"quickstart", "chat-llama3-8b-h100", "chat-static", "chat-continuous", "chat-chunked",
            "toy-static-8", "toy-continuous-8", "mooncake-replay", "azure-conv-replay"} <= names
    assert any(load_scenario(p).engine.replicas > 1 for p in BUNDLED)


def test_toy_scenarios_share_the_toy_trace():
    for name, scheduler in (("toy-static-8", "static"), ("toy-continuous-8", "continuous")):
        sc = load_scenario(REPO / "scenarios" / f"{name}.yaml")
        assert (sc.cost_model.as_yaml(), sc.engine.scheduler, sc.engine.max_num_seqs) == ("unit", scheduler, 8)
        assert sc.workload.trace == (REPO / "scenarios/traces/toy8.csv").resolve()


# ---------------------------------------------------------------- file-level errors

def test_missing_file(tmp_path):
    with pytest.raises(ScenarioError, match=r"nope\.yaml: no such file$"):
        load_scenario(tmp_path / "nope.yaml")


def test_directory(tmp_path):
    with pytest.raises(ScenarioError, match="is a directory"):
        load_scenario(tmp_path)


@pytest.mark.parametrize("text,expected", [
    ("", "chat.yaml: empty file; expected a mapping with keys name, seed, model"),
    ("# only a comment\n", "chat.yaml: empty file"),
    ("- a\n- b\n", "chat.yaml: top level is a list; expected a mapping"),
    ("just words\n", "chat.yaml: top level is 'just words'; expected a mapping"),
    ("model: llama-3-8b\nengine:\n  scheduler: [static\n", "chat.yaml: line 4: invalid YAML"),
    ("model: a\n  hardware: b\n", "chat.yaml: line 2: invalid YAML: mapping values are not allowed"),
    ("model: a\nmodel: b\n", "chat.yaml: line 2: invalid YAML: duplicate key 'model'"),
])
def test_bad_yaml(tmp_path, text, expected):
    assert expected in error(text, tmp_path)


# ---------------------------------------------------------------- key and value errors

@pytest.mark.parametrize("raw,expected", [
    (with_(colour="x"), ("chat.yaml: colour: unknown key; allowed: name, seed, model, hardware, "
                       "cost_model, engine, workload, slo")),
    (with_(engine={"schedular": "static"}),
     "chat.yaml: engine.schedular: unknown key (did you mean 'scheduler'?); allowed: scheduler, "),
    (with_(slo={"ttft": 5}), ("chat.yaml: slo.ttft: unknown key (did you mean 'ttft_ms'?); allowed: "
                             "ttft_ms, tpot_ms, itl_ms, e2el_ms, percentile")),
    (with_(model={"hf_config": "x.json", "layers": 2}), "chat.yaml: model.layers: unknown key"),
    (with_(model={"num_layers": 2, "foo": 1}), "chat.yaml: model.foo: unknown key; allowed: name"),
    (with_(hardware={"memory_bytes": 1, "hbm_bandwidth": 1, "bf16_flops": 1, "tflops": 1}),
     "chat.yaml: hardware.tflops: unknown key (did you mean 'fp8_flops'?); allowed: name, memory_bytes"),
    (with_(cost_model={"roofline": {"efficiency": 1}}), "chat.yaml: cost_model.roofline.efficiency: unknown key"),
    (with_(workload={**MINIMAL["workload"], "rate": 1}), "chat.yaml: workload.rate: unknown key"),
])
def test_unknown_key_at_each_level(tmp_path, raw, expected):
    assert expected in error(raw, tmp_path)


@pytest.mark.parametrize("engine,expected", [
    ({"scheduler": "fifo"}, "chat.yaml: engine.scheduler: 'fifo' is not one of static, continuous, chunked"),
    ({"router": "random"}, "engine.router: 'random' is not one of round_robin, least_loaded"),
    ({"policy": "lifo"}, "engine.policy: 'lifo' is not one of fcfs, sjf, priority"),
    ({"max_num_seqs": "many"}, "engine.max_num_seqs: 'many' is not an integer >= 1"),
    ({"max_num_seqs": 2.5}, "engine.max_num_seqs: 2.5 is not an integer >= 1"),
    ({"max_num_seqs": True}, "engine.max_num_seqs: true is not an integer >= 1"),
    ({"max_num_seqs": 0}, "engine.max_num_seqs: 0 is not an integer >= 1"),
    ({"max_num_batched_tokens": "1e4"}, "'1e4' is not an integer >= 1 (YAML 1.1 reads 1e3 as a string"),
    ({"block_size": 0}, "engine.block_size: 0 is not an integer in [1, 8192]"),
    # (multiples of 16 past 1024 are a hybrid model's, as vLLM raises its blocks: not another model's)
    ({"block_size": 2048}, "engine.block_size: 2048 is not a power of two in [1, 1024]"),
    ({"block_size": 16384}, "engine.block_size: 16384 is not an integer in [1, 8192]"),
    ({"block_size": 24}, "engine.block_size: 24 is not a power of two in [1, 1024]"),
    ({"gpu_memory_utilization": 0}, "engine.gpu_memory_utilization: 0 is not a number in (0, 1]"),
    ({"gpu_memory_utilization": 1.2}, "engine.gpu_memory_utilization: 1.2 is not a number in (0, 1]"),
    ({"gpu_memory_utilization": ".9"}, "engine.gpu_memory_utilization: '.9' is not a number in (0, 1]"),
    ({"num_gpu_blocks": 0}, "engine.num_gpu_blocks: 0 is not an integer >= 1"),
    ({"tensor_parallel_size": 0}, "engine.tensor_parallel_size: 0 is not an integer >= 1"),
    ({"tensor_parallel_size": 3}, ("engine.tensor_parallel_size: 3 does not divide llama-3-8b's 32 "
                                  "attention heads")),
    ({"replicas": 0}, "engine.replicas: 0 is not an integer >= 1"),
    ({"batch_timeout_s": -1}, "engine.batch_timeout_s: -1 is not a number >= 0"),
    ({"batch_timeout_s": float("inf")}, "engine.batch_timeout_s: inf is not a number >= 0"),
    ({"max_num_seqs": 512, "max_num_batched_tokens": 256},
     ("engine.max_num_batched_tokens: 256 is less than max_num_seqs (512); the continuous scheduler "
     "needs max_num_batched_tokens >= max_num_seqs")),
    ({"scheduler": "chunked", "max_num_batched_tokens": 100}, "the chunked scheduler needs"),
])
def test_bad_engine_values(tmp_path, engine, expected):
    assert expected in error(with_(engine=engine), tmp_path)


@pytest.mark.parametrize("changes,expected", [
    ({"engine": "fast"}, "chat.yaml: engine: 'fast' is not a mapping; allowed keys: scheduler, "),
    ({"seed": -1}, "chat.yaml: seed: -1 is not an integer >= 0"),
    ({"seed": "zero"}, "chat.yaml: seed: 'zero' is not an integer >= 0"),
    ({"name": "my run"}, "chat.yaml: name: 'my run' is not a name of letters, digits"),
    ({"name": 5}, "chat.yaml: name: 5 is not a name"),
    ({"slo": {"ttft_ms": 0}}, "chat.yaml: slo.ttft_ms: 0 is not a number > 0"),
    ({"slo": {"tpot_ms": "fast"}}, "chat.yaml: slo.tpot_ms: 'fast' is not a number > 0"),
    ({"slo": {"ttft_ms": 5, "percentile": 100}}, "chat.yaml: slo.percentile: 100 is not a number in (0, 100)"),
    ({"slo": {"ttft_ms": 5, "percentile": 0}}, "slo.percentile: 0 is not a number in (0, 100)"),
    ({"slo": {"percentile": 50}}, "chat.yaml: slo: give at least one of ttft_ms, tpot_ms, itl_ms, e2el_ms (milliseconds"),
    ({"slo": [1]}, "chat.yaml: slo: a list is not a mapping"),
    ({"model": None}, "chat.yaml: model: missing; required: a preset name (deepseek-v3, gpt-oss-120b, gpt-oss-20b, llama-125m, "),
    ({"hardware": None}, "chat.yaml: hardware: missing; required: a preset name (a100-80gb, "),
    ({"workload": None}, "chat.yaml: workload: missing; required"),
    ({"model": 7}, "chat.yaml: model: 7 is not a preset name"),
    ({"model": {"num_layers": 0, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 8,
                "vocab_size": 8}}, "chat.yaml: model.num_layers: 0 is not an integer >= 1"),
    ({"hardware": {"memory_bytes": "lots", "hbm_bandwidth": 1, "bf16_flops": 1}},
     "chat.yaml: hardware.memory_bytes: 'lots' is not a number > 0"),
    ({"cost_model": "magic"}, "chat.yaml: cost_model: unknown cost model 'magic'; allowed: measured, {measured: "),
    ({"cost_model": {"profile": "missing.yaml"}}, "chat.yaml: cost_model.profile: no such file 'missing.yaml'"),
    ({"workload": {"trace": "traces/missing.csv"}}, "chat.yaml: workload.trace: no such file 'traces/missing.csv'"),
    ({"workload": {"arrival": {"process": "poisson", "rate": 1}}}, "chat.yaml: workload: needs either trace"),
])
def test_bad_values(tmp_path, changes, expected):
    assert expected in error(with_(**changes), tmp_path)


@pytest.mark.parametrize("model, close", [("gpt-5", None), ("llama3-9b", "'llama3-8b', 'llama3-70b', 'llama-3-8b'")])
def test_unknown_model_preset_lists_the_presets(tmp_path, model, close):
    """(llama3-8b itself is an alias of llama-3-8b: sim/presets/names.py)"""
    message = error(with_(model=model), tmp_path)
    hint = f" (did you mean {close}" if close else ""
    assert f"chat.yaml: model: unknown preset {model!r}{hint}" in message
    assert all(name in message for name in MODEL_PRESETS)


def test_unknown_hardware_preset_lists_the_presets(tmp_path):
    message = error(with_(hardware="tpu-v5"), tmp_path)
    assert message.startswith(f"{tmp_path / 'chat.yaml'}: hardware: unknown preset 'tpu-v5'; presets: ")
    assert "h100-sxm" in message and "a100-80gb" in message


def test_hf_config_errors(tmp_path):
    assert "chat.yaml: model.hf_config: no such file 'cfg.json'" in error(
        with_(model={"hf_config": "cfg.json"}), tmp_path)
    (tmp_path / "cfg.json").write_text("{not json")
    assert "chat.yaml: model.hf_config: " in error(with_(model={"hf_config": "cfg.json"}), tmp_path)
    assert "cfg.json: not valid JSON" in error(with_(model={"hf_config": "cfg.json"}), tmp_path)


def test_model_that_does_not_fit(tmp_path):
    message = error(with_(model="llama-3-70b"), tmp_path)
    assert "chat.yaml: model: llama-3-70b needs 141.1 GB of weights per GPU at tensor_parallel_size=1" in message
    assert "raise tensor_parallel_size" in message
    fits = with_(model="llama-3-70b", engine={"tensor_parallel_size": 4})
    assert load_scenario(write(tmp_path, fits)).engine.tensor_parallel_size == 4


def test_model_that_leaves_no_room_for_kv(tmp_path):
    raw = with_(engine={"gpu_memory_utilization": 0.21})  # 16.8 GB: weights (16.1 GB) fit, KV doesn't
    assert "leaves no room for the KV cache" in error(raw, tmp_path)


# ---------------------------------------------------------------- --set errors

@pytest.mark.parametrize("override,expected", [
    ("engine.max_num_seqs", "--set engine.max_num_seqs: expected KEY=VALUE with a dotted key"),
    ("=5", "--set =5: expected KEY=VALUE"),
    ("engine..max_num_seqs=5", "--set engine..max_num_seqs=5: expected KEY=VALUE"),
    ("engine.max_num_seqs=[1,", "--set engine.max_num_seqs: '[1,' is not a YAML value"),
    ("engine.foo=1", "--set engine.foo: unknown key; allowed: scheduler, max_num_seqs"),
    ("foo=1", "--set foo: unknown key; allowed: name, seed, model"),
    ("engine.max_num_seqs=-5", "--set engine.max_num_seqs: -5 is not an integer >= 1"),
    ("engine.scheduler=fifo", "--set engine.scheduler: 'fifo' is not one of static, continuous, chunked"),
    ("engine.max_num_seqs=9000", ("--set engine.max_num_seqs: 9000 is more than max_num_batched_tokens "
                                 "(8192); the continuous scheduler needs")),
    ("model.num_layers=2", "--set model.num_layers: model is 'llama-3-8b', not a mapping, so it has no key"),
    ("model=gpt-5", "--set model: unknown preset 'gpt-5'; presets: "),
    ("model=llama-3-70b", "--set model: llama-3-70b needs 141.1 GB of weights"),
    ("engine.gpu_memory_utilization=0.21", "--set engine.gpu_memory_utilization: llama-3-8b at"),
    ("slo.percentile=50", "--set slo: give at least one of ttft_ms, tpot_ms, itl_ms, e2el_ms"),
    ("slo={ttft_ms: 9, percentile: 100}", "--set slo.percentile: 100 is not a number in (0, 100)"),
    ("slo={ttft_ms: -1}", "--set slo.ttft_ms: -1 is not a number > 0"),
    ("workload.arrival.rate=-1", ("chat.yaml: workload.arrival.rate: -1 is not a number > 0 "
                                 "(after --set workload.arrival.rate=-1)")),
    ("workload.foo=1", "workload.foo: unknown key; allowed: trace, "),
    ("cost_model=unit2", "--set cost_model: unknown cost model 'unit2'"),
])
def test_bad_overrides(tmp_path, override, expected):
    assert expected in error(MINIMAL, tmp_path, overrides=[override])


def test_bad_seed_argument(tmp_path):
    with pytest.raises(ScenarioError, match=r"^--seed: -1 is not an integer >= 0$"):
        load_scenario(write(tmp_path, MINIMAL), seed=-1)


def test_an_error_not_caused_by_a_set_names_the_file(tmp_path):
    message = error(with_(engine={"scheduler": "fifo"}), tmp_path, overrides=["engine.max_num_seqs=8"])
    assert message.startswith(f"{tmp_path / 'chat.yaml'}: engine.scheduler:")


def _yaml_with(tmp_path, line_edits: dict[str, str]) -> Path:
    """A chat scenario written as YAML text (so that PyYAML itself reads `9e-1` as a string)."""
    text = (f"model:\n  {line_edits.get('model', 'name: m')}\n  num_layers: {line_edits.get('num_layers', 2)}\n"
            "  hidden_size: 64\n  num_attention_heads: 4\n  intermediate_size: 128\n  vocab_size: 256\n"
            f"hardware:\n  memory_bytes: 80e9\n  hbm_bandwidth: {line_edits.get('hbm', '3.35e12')}\n"
            "  bf16_flops: 989e12\n"
            f"engine:\n  gpu_memory_utilization: {line_edits.get('util', 0.9)}\n"
            f"  max_num_seqs: {line_edits.get('seqs', 8)}\n"
            f"workload:\n  arrival: {{process: poisson, rate: {line_edits.get('rate', 1)}}}\n"
            f"  num_requests: {line_edits.get('n', 10)}\n"
            "  prompt_tokens: {dist: fixed, value: 10}\n  output_tokens: {dist: fixed, value: 10}\n"
            f"slo: {{ttft_ms: {line_edits.get('ttft', 500)}}}\n")
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


def test_one_number_vocabulary_in_every_section(tmp_path):
    """`9e-1` or `9e11` (strings to YAML 1.1) are the numbers 0.9 and 9e11 wherever a real number is expected, in
    every section alike; an integer written `1e2` is refused in every section with the same hint."""
    sc = load_scenario(_yaml_with(tmp_path, {"hbm": "9e11", "util": "9e-1", "rate": "9e-1",
                                             "ttft": "5e2"}))
    assert sc.hardware.hbm_bandwidth == 9e11 and sc.engine.gpu_memory_utilization == 0.9
    assert sc.workload.arrival.rate == 0.9 and sc.slo.ttft_ms == 500.0
    hint = "'1e2' is not an integer >= 1 (YAML 1.1 reads 1e3 as a string"
    for edit, key in (({"num_layers": "1e2"}, "model.num_layers"), ({"seqs": "1e2"}, "engine.max_num_seqs"),
                      ({"n": "1e2"}, "workload.num_requests")):
        with pytest.raises(ScenarioError) as e:
            load_scenario(_yaml_with(tmp_path, edit))
        assert f"s.yaml: {key}: {hint}" in str(e.value)
