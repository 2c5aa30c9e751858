"""`servesim capacity`: the GPU-memory budget of a model on a GPU as rows a person reads (and a
JSON), without simulating: weights, activation reserve, KV bytes per token and per block, KV blocks,
and how many sequences of a length fit at once.

    title, rows = capacity_table(model="llama-3-8b", gpu="h100-sxm", tp=1, seq_len=4096)
    rows: (json key, label, value, shown); ScenarioError (one line, naming the option) for bad input
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from sim.config.checks import MAX_TOKENS, _int
from sim.config.errors import ScenarioError
from sim.config.knobs import MAX_BLOCK_SIZE, block_size_ok
from sim.presets.hardware import HARDWARE_PRESETS
from sim.presets.memory import (
    KV_CACHE_DTYPES,
    hybrid_block_size,
    kv_budget,
    linear_state_bytes,
    lora_slot_bytes,
    routed_expert_bytes_per_gpu,
)
from sim.presets.models import MODEL_PRESETS, model_from_hf_config, pipeline_stage
from sim.scenario import load_scenario


def capacity_table(model: str | None = None, gpu: str | None = None, tp: int | None = None, seq_len: int = 4096,
                   gpu_memory_utilization: float | None = None, block_size: int | None = None,
                   max_num_batched_tokens: int | None = None,
                   scenario: Path | None = None, pp: int | None = None, dp: int | None = None,
                   ep: bool | None = None) -> tuple[str, list[tuple[str, str, Any, str]]]:
    """(title, rows) of the budget: the options given over the scenario's settings (if any) over
    vLLM's defaults. `pp`: pipeline stages (the busiest stage's GPU); `dp` with `ep`: data-parallel
    ranks sharing one expert-parallel group (sim/presets/memory.weights_per_gpu)."""
    m: Any = None
    hw: Any = None
    if scenario is not None:
        sc = load_scenario(scenario)
        m, hw, e = sc.model, sc.hardware, sc.engine
        defaults: dict[str, Any] = {"tp": e.tensor_parallel_size, "util": e.gpu_memory_utilization,
                                    "block": e.block_size, "tokens": e.max_num_batched_tokens,
                                    "kv_dtype": e.kv_cache_dtype, "pp": e.pipeline_parallel_size,
                                    "dp": e.data_parallel_size, "ep": e.enable_expert_parallel,
                                    "lora": e.lora}
    else:
        defaults = {"tp": 1, "util": 0.9, "block": 16, "tokens": 8192, "kv_dtype": "auto", "pp": 1, "dp": 1,
                    "ep": False}
    if model is not None:
        m = _capacity_model(model)
    if gpu is not None:
        if gpu not in HARDWARE_PRESETS:
            raise ScenarioError(f"--gpu: unknown preset {gpu!r}; presets: " + ", ".join(sorted(HARDWARE_PRESETS)))
        hw = HARDWARE_PRESETS[gpu]
    if m is None or hw is None:
        flag = "--model" if m is None else "--gpu"
        names = MODEL_PRESETS if m is None else HARDWARE_PRESETS
        raise ScenarioError(f"{flag}: missing (or give --scenario FILE); presets: " + ", ".join(sorted(names)))
    _int(seq_len, "--seq-len", lo=1, cap=MAX_TOKENS)
    check_capacity_options(m, tp, gpu_memory_utilization, block_size, max_num_batched_tokens)
    stages: int = _or_default(pp, defaults["pp"])
    ranks: int = _or_default(dp, defaults["dp"])
    experts: bool = _or_default(ep, defaults["ep"])
    check_layout(m, stages, ranks, experts)
    stage = pipeline_stage(m, stages)
    b_tp: int = _or_default(tp, defaults["tp"])
    # a hybrid's attention block holds one linear-attention state (vLLM raises a smaller one)
    block = hybrid_block_size(stage, hw, b_tp, defaults["kv_dtype"], _or_default(block_size, defaults["block"]))
    b = kv_budget(stage, hw, tensor_parallel_size=b_tp,
                  gpu_memory_utilization=_or_default(gpu_memory_utilization, defaults["util"]),
                  block_size=block,
                  max_num_batched_tokens=_or_default(max_num_batched_tokens, defaults["tokens"]),
                  where="capacity", kv_cache_dtype=defaults["kv_dtype"], enable_expert_parallel=experts,
                  data_parallel_size=ranks,
                  # a scenario's LoRA adapter slots, set aside beside the weights (sim/presets/memory.py)
                  reserved_bytes=lora_slot_bytes(m, defaults.get("lora"), b_tp))
    rows = capacity_rows(m.name, hw.name, b, seq_len, spec=stage, kv_cache_dtype=defaults["kv_dtype"],
                         pp=stages, dp=ranks, ep=experts)
    layout = "".join(f", {k} {v}" for k, v in (("pipeline_parallel_size", stages), ("data_parallel_size", ranks))
                     if v > 1)
    return (f"servesim capacity: {m.name} on {hw.name}, tensor_parallel_size {b.tensor_parallel_size}{layout}"
            + (", expert parallel" if experts and m.moe is not None else ""), rows)


def check_layout(m: Any, pp: int, dp: int, ep: bool) -> None:
    """--pp, --dp and --ep by the scenario rules, in errors that name the option."""
    if pp < 1 or pp > m.num_layers:
        raise ScenarioError(f"--pp: {pp} is not a number of pipeline stages in [1, {m.num_layers}] "
                            f"({m.name} has {m.num_layers} layers)")
    if dp < 1:
        raise ScenarioError(f"--dp: {dp} is not an integer >= 1")
    if ep and m.moe is None:
        raise ScenarioError(f"--ep: {m.name} is not a mixture of experts; expert parallelism has no experts "
                            "to place (vLLM ignores the flag on a dense model): leave it off")
    if dp > 1 and (m.moe is None or not ep):
        raise ScenarioError("--dp: data-parallel ranks are modelled for a mixture-of-experts model with "
                            "--ep (expert parallelism); for a dense model each rank is a replica")


def check_capacity_options(m: Any, tp: int | None, util: float | None, block: int | None,
                            tokens: int | None) -> None:
    """The options given, by the scenario rules (sim/scenario.py), in errors that name the option."""
    heads = m.num_attention_heads
    if tp is not None and (tp < 1 or heads % tp):
        allowed = ", ".join(str(d) for d in range(1, heads + 1) if heads % d == 0)
        raise ScenarioError(f"--tp: {tp} does not divide the {heads} attention heads of {m.name}; "
                            f"allowed: {allowed}")
    lin = m.linear_attention
    if tp is not None and lin is not None and (lin.num_key_heads % tp or lin.num_value_heads % tp):
        raise ScenarioError(f"--tp: {tp} does not divide {m.name}'s linear-attention heads "
                            f"({lin.num_key_heads} key, {lin.num_value_heads} value)")
    if util is not None and not 0 < util <= 1:
        raise ScenarioError(f"--gpu-memory-utilization: {util} is not a number in (0, 1]")
    if block is not None and not block_size_ok(block):
        raise ScenarioError(f"--block-size: {block} is not a power of two in [1, {MAX_BLOCK_SIZE}] "
                            "(vLLM uses 16) or a multiple of 16 (a hybrid model's)")
    if tokens is not None and tokens < 1:
        raise ScenarioError(f"--max-num-batched-tokens: {tokens} is not an integer >= 1")


def _or_default(value: Any, default: Any) -> Any:
    return default if value is None else value


def _capacity_model(name: str) -> Any:
    if name in MODEL_PRESETS:
        return MODEL_PRESETS[name]
    if Path(name).exists():
        return model_from_hf_config(Path(name))
    raise ScenarioError(f"--model: unknown preset {name!r}; presets: "
                        + ", ".join(sorted(MODEL_PRESETS)) + " (or a path to a HF config.json)")


def capacity_rows(model: str, gpu: str, b: Any, seq_len: int, spec: Any = None,
                  kv_cache_dtype: str = "auto", pp: int = 1, dp: int = 1,
                  ep: bool = False) -> list[tuple[str, str, Any, str]]:
    """(json key, label, value, shown) for `servesim capacity`; bytes are per GPU (per TP rank; with
    pipeline stages, of the busiest stage: `spec` is that stage)."""
    gb = lambda x: f"{x / 1e9:,.2f} GB"  # noqa: E731
    per_seq = b.blocks_per_seq(seq_len)
    group = b.tensor_parallel_size * dp if ep else b.tensor_parallel_size
    extra = [] if spec is None else _architecture_rows(spec, b.tensor_parallel_size, kv_cache_dtype, gb, dp, ep)
    if pp > 1:
        extra.insert(0, ("pipeline_parallel_size", "pipeline_parallel_size (stages; the busiest one's GPU below)",
                         pp, f"{pp} ({spec.num_layers} layers a stage at most)" if spec is not None else str(pp)))
    if dp > 1:
        extra.insert(0, ("data_parallel_size", "data_parallel_size (engines, each its own KV cache)", dp,
                         f"{dp} (experts over {group} GPUs)"))
    rows = [
        ("model", "model", model, model), ("gpu", "GPU", gpu, gpu),
        ("tensor_parallel_size", "tensor_parallel_size", b.tensor_parallel_size, str(b.tensor_parallel_size)),
        ("total_bytes", "GPU memory", b.total_bytes, gb(b.total_bytes)),
        ("usable_bytes", "usable (gpu_memory_utilization x memory)", b.usable_bytes, gb(b.usable_bytes)),
        ("weight_bytes_per_gpu", "weights per GPU", b.weight_bytes_per_gpu, gb(b.weight_bytes_per_gpu)),
        ("activation_reserve_bytes", "activation + fixed reserve (+ LoRA slots, if any)", b.activation_reserve_bytes,
         gb(b.activation_reserve_bytes)),
        ("kv_cache_bytes", "KV cache", b.kv_cache_bytes, gb(b.kv_cache_bytes)),
        ("kv_bytes_per_token", "KV bytes per token (per GPU)", b.kv_bytes_per_token,
         f"{b.kv_bytes_per_token:,} B"),
        ("block_bytes", f"KV bytes per block ({b.block_size} tokens"
         + (")" if b.layout is None else f" x {b.layout.group_layers} layers)"), b.block_bytes, f"{b.block_bytes:,} B"),
        ("num_gpu_blocks", "KV blocks per GPU", b.num_gpu_blocks, f"{b.num_gpu_blocks:,}"),
        ("max_tokens", "KV capacity (tokens per replica)", b.max_tokens, f"{b.max_tokens:,}"),
        ("seq_len", "sequence length (tokens)", seq_len, f"{seq_len:,}"),
        ("blocks_per_seq", "blocks per sequence", per_seq, f"{per_seq:,}"),
        ("max_concurrent_seqs", f"concurrent sequences of {seq_len:,} tokens", b.max_concurrent_seqs(seq_len),
         f"{b.max_concurrent_seqs(seq_len):,}"),
    ]
    return rows[:3] + extra + rows[3:]  # after model, GPU and TP: what the weights and KV are made of



def _architecture_rows(m: Any, tp: int, kv_cache_dtype: str, gb, dp: int = 1,
                       ep: bool = False) -> list[tuple[str, str, Any, str]]:
    """What the weights and the KV bytes per token are made of (MoE experts, MLA latent, fp8)."""
    rows = [("num_params", "parameters (all)", m.num_params, f"{m.num_params / 1e9:,.2f} B"),
            ("active_params", "parameters one token multiplies", m.matmul_params,
             f"{m.matmul_params / 1e9:,.2f} B")]
    if m.moe is not None:
        e = m.moe
        per_gpu = routed_expert_bytes_per_gpu(m, tp, ep, dp)
        rows.append(("routed_expert_bytes_per_gpu", f"routed experts per GPU ({e.num_experts} x "
                     f"{m.num_layers - e.dense_layers} layers, {e.experts_per_token} per token"
                     + (f"; {-(-e.num_experts // (tp * dp))} whole experts a GPU)" if ep else ")"),
                     per_gpu, gb(per_gpu)))
    if m.linear_weight_bytes is not None:
        rows.append(("linear_weight_bytes", "bytes per linear-layer weight (quantised)",
                     m.linear_weight_bytes, f"{m.linear_weight_bytes:g}"))
    if m.expert_weight_bytes is not None:
        rows.append(("expert_weight_bytes", "bytes per routed-expert weight (quantised)",
                     m.expert_weight_bytes, f"{m.expert_weight_bytes:g}"))
    elem = KV_CACHE_DTYPES[kv_cache_dtype] or m.dtype_bytes
    if m.mla is not None:
        why = (f"{m.num_layers} layers x ({m.mla.kv_lora_rank} latent + {m.mla.qk_rope_head_dim} rope) "
               f"x {elem} B, the same on every GPU (MLA)")
    else:
        heads = max(1, m.num_kv_heads // tp)
        layers = (f"{m.attention_layers} attention layers (of {m.num_layers})" if m.linear_attention
                  else f"{m.num_layers} layers")
        why = f"2 (K, V) x {layers} x {heads} KV heads x {m.head_dim} x {elem} B"
    rows.append(("kv_bytes_per_token_why", "KV bytes per token, because", why, why))
    if m.linear_attention is not None:
        lin, lay = m.linear_attention, m.kv_layout
        state = linear_state_bytes(m, tp)
        text = (f"{state:,} B a layer per GPU ({lin.layers} Gated DeltaNet layers: conv {lin.conv_kernel - 1} x "
                f"{lin.conv_dim // tp:,} + recurrent {lin.num_value_heads // tp} x {lin.value_head_dim} x "
                f"{lin.key_head_dim}); vLLM groups the layers {lay.full_groups} attention + {lay.state_groups} "
                f"state group(s) of {lay.group_layers}: a sequence holds one state block in each, whatever its length")
        rows.append(("linear_state_bytes", "linear-attention state per sequence", state, text))
    if m.sliding_layers:
        lay = m.kv_layout
        full = m.num_layers - m.sliding_layers
        if not full:
            text = (f"all {m.num_layers} layers attend the last {m.sliding_window:,} tokens: a sequence keeps "
                    f"only its window's blocks")
        else:
            pad = lay.groups * lay.group_layers - m.num_layers
            text = (f"{m.sliding_layers} of {m.num_layers} layers attend the last {m.sliding_window:,} tokens; "
                    f"vLLM groups the layers {lay.full_groups} full + {lay.sliding_groups} windowed group(s) of "
                    f"{lay.group_layers}" + (f" ({pad} padding)" if pad else "")
                    + ": a sequence keeps every token in the full group(s), only its window in the others")
        rows.append(("sliding_window", "sliding window", m.sliding_window, text))
    return rows
