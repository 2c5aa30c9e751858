"""The `vllm serve` command line for a planned configuration: vLLM's own argument names.

    vllm_serve(scenario, {"max_num_seqs": 128, "max_num_batched_tokens": 4096}) -> "vllm serve ..."

Every engine knob that servesim simulates maps to one vLLM argument (docs.vllm.ai, "Engine
Arguments"); the mapping is the inverse of the scenario's `engine:` section. A `static` scheduler
(Hugging Face `generate`) has no vLLM equivalent: None.
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path

from sim.presets import names
from sim.schedulers import SCHEDULERS

# servesim's model presets -> the Hugging Face repository vLLM would load (the first of its
# checkpoints: sim/presets/names.py); a config.json path is passed as its folder (vLLM accepts a
# local model directory)
HF_REPOS = {preset: repos[0] for preset, repos in names.HF_REPOS.items()}


def model_argument(scenario) -> str:
    """What `vllm serve` takes as the model: the preset's HF repository, or the folder of the
    scenario's hf_config, or the model's name as a placeholder to replace."""
    raw = (scenario.raw or {}).get("model")
    if isinstance(raw, dict) and raw.get("hf_config"):
        path = Path(raw["hf_config"]).expanduser()
        path = path if path.is_absolute() else scenario.base_dir / path
        return str(path.parent if path.name.endswith(".json") else path)
    return HF_REPOS.get(scenario.model.name, scenario.model.name)


KV_TRANSFER = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}  # vLLM's P/D connector config


def vllm_serve(scenario, setting: dict | None = None) -> str | None:
    """The command for one replica of `scenario` with `setting` (engine knobs that override it);
    None for the static scheduler. Disaggregated: one command per pool (each instance runs vLLM with
    a KV connector; a proxy sends each request to a prefill, then a decode instance), on two lines."""
    e = scenario.engine
    d = e.disaggregation
    if d is not None:
        from dataclasses import replace

        lines = []
        for name, n, pool in (("prefill", d.prefill_replicas, d.prefill), ("decode", d.decode_replicas, d.decode)):
            one = vllm_serve(replace(scenario, engine=replace(pool, disaggregation=None)), setting)
            lines.append(f"# {n} x {name}: {one} --kv-transfer-config {shlex.quote(json.dumps(KV_TRANSFER))}")
        return "\n".join(lines)
    knobs = {k: getattr(e, k) for k in ("scheduler", "max_num_seqs", "max_num_batched_tokens",
                                         "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
                                         "gpu_memory_utilization", "block_size",
                                         "kv_cache_dtype", "enable_expert_parallel", "num_gpu_blocks",
                                         "enable_prefix_caching", "kv_offloading_size")}
    knobs.update(setting or {})
    kind = SCHEDULERS[knobs["scheduler"]]
    if not kind.token_budget:  # static batching: Hugging Face generate, not vLLM
        return None
    args = ["vllm", "serve", model_argument(scenario),
            "--tensor-parallel-size", str(knobs["tensor_parallel_size"]),
            *(["--pipeline-parallel-size", str(knobs["pipeline_parallel_size"])]
              if knobs["pipeline_parallel_size"] > 1 else []),
            *(["--data-parallel-size", str(knobs["data_parallel_size"])] if knobs["data_parallel_size"] > 1 else []),
            "--max-num-seqs", str(knobs["max_num_seqs"]),
            "--max-num-batched-tokens", str(knobs["max_num_batched_tokens"]),
            "--gpu-memory-utilization", f"{knobs['gpu_memory_utilization']:g}",
            # (a hybrid's block is vLLM's own choice, raised to hold a layer's state: not given)
            *(["--block-size", str(knobs["block_size"])] if scenario.model.linear_attention is None else []),
            "--enable-chunked-prefill" if kind.chunks_prompts else "--no-enable-chunked-prefill"]
    caching = knobs["enable_prefix_caching"]
    if caching is not None:  # None: vLLM's default (on), like servesim's
        args.append("--enable-prefix-caching" if caching else "--no-enable-prefix-caching")
    if knobs["kv_cache_dtype"] != "auto":
        args += ["--kv-cache-dtype", knobs["kv_cache_dtype"]]
    if knobs["enable_expert_parallel"]:
        args.append("--enable-expert-parallel")
    if knobs["data_parallel_size"] > 1 and e.all2all_backend != "allgather_reducescatter":  # (vLLM's default)
        args += ["--all2all-backend", e.all2all_backend]
    if e.lora is not None:  # multi-LoRA serving; adapters themselves: --lora-modules name=path ...
        args += ["--enable-lora", "--max-loras", str(e.lora.max_loras), "--max-lora-rank", str(e.lora.max_lora_rank)]
    if knobs["kv_offloading_size"] is not None:  # GiB over all TP ranks, the native backend
        args += ["--kv-offloading-size", f"{knobs['kv_offloading_size']:g}", "--kv-offloading-backend", "native"]
    if not e.scheduler_reserve_full_isl:  # on is vLLM's default
        args.append("--no-scheduler-reserve-full-isl")
    if e.enforce_eager:
        args.append("--enforce-eager")
    if e.max_cudagraph_capture_size is not None:
        args += ["--max-cudagraph-capture-size", str(e.max_cudagraph_capture_size)]
    spec = e.speculative
    if spec is not None:  # vLLM's --speculative-config (JSON); EAGLE needs its head's weights
        config = {"method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens}
        if spec.draft_model is not None:
            config["model"] = HF_REPOS.get(spec.draft_model, spec.draft_model)
        elif spec.method == "eagle":
            config["model"] = "<EAGLE head for this model>"
        args += ["--speculative-config", json.dumps(config)]
    if knobs["num_gpu_blocks"] is not None:  # vLLM's override counts the null block too
        args += ["--num-gpu-blocks-override", str(knobs["num_gpu_blocks"] + 1)]
    from sim.features import registry

    for key, feature in registry.active(scenario):  # what each feature adds (sim/features/: its vllm_flags)
        args += feature.vllm_flags(scenario.features[key])
    return shlex.join(args)
