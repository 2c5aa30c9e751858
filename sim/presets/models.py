"""Model presets and the sizes derived from them (weights, KV bytes per token, FLOPs per token).

CONTRACT (owned by the cost-model engineer; fields and property names are used across sim/):
    ModelSpec fields below; derived properties: num_params, weight_bytes, kv_bytes_per_token,
    flops_per_token (2 x matmul params, attention excluded).
    MODEL_PRESETS: dict[str, ModelSpec]
    model_from_hf_config(path, name=None) -> ModelSpec
    model_from_fields(fields, where) -> ModelSpec

Only Llama-style decoders: RMSNorm, rotary positions (no position-embedding table), GQA attention,
SwiGLU MLP (gate/up/down). Preset numbers are copied from each model's Hugging Face config.json.
"""
from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from dataclasses import fields as dc_fields
from pathlib import Path
from typing import Any

from sim.config.checks import (
    MAX_BYTES,
    MAX_COUNT,
    MAX_TOKENS,
    _bool,
    _int,
    _show,
    _text,
    check_fields,
    json_object,
    read_text,
)
from sim.config.errors import ScenarioError, ServesimWarning


@dataclass(frozen=True)
class MoESpec:
    """Mixture-of-experts MLP layers (Mixtral, Qwen3-MoE, DeepSeek-V3), from config.json."""
    num_experts: int               # routed experts per MoE layer
    experts_per_token: int         # routed experts each token is sent to
    expert_intermediate_size: int  # gate/up/down width of one expert
    shared_experts: int = 0        # experts every token also uses (DeepSeek), same width
    # layers with a dense MLP of intermediate_size: DeepSeek's lead (first_k_dense_replace);
    # Llama-4-Maverick's alternate with the MoE ones (interleave_moe_layer_step 2). Sized and priced
    # by count; only pipeline_stage reads them as leading (an upper bound for an interleaved stage)
    dense_layers: int = 0


@dataclass(frozen=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2/V3): the KV cache holds one compressed latent of
    kv_lora_rank plus the shared rope key per token and layer, not K and V per head."""
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int = 0           # 0: queries projected from the hidden state directly


@dataclass(frozen=True)
class LinearAttentionSpec:
    """Gated DeltaNet layers (Qwen3-Next; vLLM's GatedDeltaNet, `linear_attention` in layer_types):
    in place of a KV cache each keeps, per sequence, a recurrent state of num_value_heads x
    value_head_dim x key_head_dim and the last conv_kernel - 1 inputs of its short convolution over
    q, k and v, whatever the sequence's length (vLLM's MambaStateShapeCalculator.gated_delta_net_state_shape)."""
    layers: int                # decoder layers with linear attention (the others: full attention)
    num_key_heads: int         # linear_num_key_heads (q and k share them)
    num_value_heads: int       # linear_num_value_heads
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int = 4       # linear_conv_kernel_dim
    state_dtype_bytes: int = 0  # the recurrent state's bytes per element (0: the model's dtype, vLLM's
    #                             mamba_ssm_cache_dtype auto)

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the short convolution: q, k and v."""
        return 2 * self.key_dim + self.value_dim

    def layer_params(self, hidden: int) -> int:
        """One layer's projection weights: in_proj_qkvz (q, k, v and the output gate z), in_proj_ba
        (the per-head beta and decay inputs) and out_proj."""
        return hidden * (2 * self.key_dim + 2 * self.value_dim) + hidden * 2 * self.num_value_heads \
            + self.value_dim * hidden

    def other_params(self) -> int:
        """One layer's small weights: the conv filters, A_log and dt_bias per value head, the gated norm."""
        return self.conv_dim * self.conv_kernel + 2 * self.num_value_heads + self.value_head_dim


@dataclass(frozen=True)
class KVLayout:
    """How vLLM's hybrid KV-cache manager groups a model's attention layers (vLLM 0.32,
    `kv_cache_utils._get_kv_cache_groups_uniform_page_size`). Every block of the shared pool holds
    `block_size` tokens for `group_layers` layers; a request holds its own blocks in each group:
    full-attention groups keep every token, sliding-window groups only the blocks that the last
    `window` tokens touch (the ones behind the window are freed as the request advances)."""
    group_layers: int          # layers one block holds K/V for (padding layers included)
    full_groups: int = 1       # groups of full-attention layers
    sliding_groups: int = 0    # groups of sliding-window layers
    window: int = 0            # sliding window, tokens (0: none)
    # groups of linear-attention (state) layers (vLLM's MambaManager, mamba_cache_mode none): a
    # request holds one block in each, its state, from its first computed token to its end
    state_groups: int = 0

    @property
    def groups(self) -> int:
        """Groups of attention layers (their blocks grow with the sequence)."""
        return self.full_groups + self.sliding_groups

    def behind(self, tokens: int, block_size: int) -> int:
        """Blocks a sliding-window group has freed once `tokens` are computed: those wholly before
        the window of the next token (vLLM's get_num_skipped_tokens: tokens - window + 1)."""
        return max(0, tokens - self.window + 1) // block_size if self.sliding_groups else 0

    def held(self, tokens: int, block_size: int) -> int:
        """Blocks, over every group, a request holds for `tokens` computed tokens (arrays too, without
        a sliding window)."""
        blocks = -(-tokens // block_size)
        held = self.groups * blocks - self.sliding_groups * self.behind(tokens, block_size)
        return held + self.state_groups * (tokens > 0) if self.state_groups else held


@dataclass(frozen=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dtype_bytes: int = 2  # bf16/fp16 activations, KV cache (kv_cache_dtype auto) and unquantised weights
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2/2.5); o_proj never does
    layer_norms: int = 2  # RMSNorm weight vectors (hidden_size each) per layer: Gemma-2/3 have 4
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    # bytes per weight of the linear layers when quantised (fp8: 1, int4: 0.5); None: dtype_bytes.
    # Embeddings, LM head and norms stay at dtype_bytes, as vLLM loads them.
    linear_weight_bytes: float | None = None
    # bytes per routed-expert weight when the experts alone are quantised (gpt-oss's MXFP4: 4-bit
    # values + one 8-bit scale per 32, 4.25 bits); None: as the other linear layers
    expert_weight_bytes: float | None = None
    # FP8 weights scaled per block of this many x this many weights (DeepSeek-V3's 128, from
    # quantization_config.weight_block_size; vLLM runs them on block-scaled GEMM and MoE kernels);
    # 0: one scale per tensor (or channel), or not FP8
    weight_block_size: int = 0
    # a quantised checkpoint's bytes beyond its linear weights' values (linear_weight_bytes and
    # expert_weight_bytes per weight): scales, zero points, and layers it keeps unquantised
    # (sim/presets/quantization.py); with them weight_bytes is the checkpoint's byte count
    quant_extra_bytes: float = 0.0
    expert_quant_extra_bytes: float = 0.0  # the same for the routed experts (split with them under EP)
    quant_scheme: str = ""    # the formats its linear weights are in (e.g. "fp8", "int4", "nvfp4+fp8")
    # "fp8": the checkpoint carries FP8 KV-cache scales (engine.kv_cache_dtype: fp8 uses them)
    kv_cache_scales: str = ""
    # Sliding-window attention (Mistral-7B-v0.1, Qwen2 with use_sliding_window, hybrid layouts
    # from `layer_types`): `sliding_layers` of the layers attend only the last `sliding_window`
    # tokens; the others attend everything. 0, 0: full attention everywhere.
    sliding_window: int = 0
    sliding_layers: int = 0
    # Hybrid models (Qwen3-Next): linear_attention.layers of the layers are Gated DeltaNet, the
    # others full attention; None: every layer attends
    linear_attention: LinearAttentionSpec | None = None
    # full-attention layers gate their output by a sigmoid of a second query-sized projection
    # (Qwen3-Next's attn_output_gate: q_proj twice as wide)
    attention_output_gate: bool = False
    # per-head RMSNorm of queries and keys (Qwen3, Gemma-3: q_norm and k_norm, head_dim weights each
    # per attention layer)
    qk_norm: bool = False

    @property
    def attention_layers(self) -> int:
        """Layers with softmax attention (and a KV cache): all of them but the linear-attention ones."""
        return self.num_layers - (self.linear_attention.layers if self.linear_attention else 0)

    @property
    def kv_layout(self) -> KVLayout:
        """vLLM's KV-cache groups for this model. One attention type: one group of every layer.
        Two types (full and sliding attention, or attention and linear attention's state): groups
        of `min(a, b)` layers each (`max` when the larger count is under 1.5x the smaller), the
        last group of a type padded with unused layers."""
        if self.linear_attention is not None:
            full, state = self.attention_layers, self.linear_attention.layers
            size = min(full, state) if max(full, state) >= 1.5 * min(full, state) else max(full, state)
            return KVLayout(size, -(-full // size), state_groups=-(-state // size))
        sliding, full = self.sliding_layers, self.num_layers - self.sliding_layers
        if not sliding:
            return KVLayout(self.num_layers)
        if not full:
            return KVLayout(self.num_layers, 0, 1, self.sliding_window)
        size = min(full, sliding) if max(full, sliding) >= 1.5 * min(full, sliding) else max(full, sliding)
        return KVLayout(size, -(-full // size), -(-sliding // size), self.sliding_window)

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def attention_params(self) -> int:
        """Weights of one full-attention layer's projections."""
        h, heads = self.hidden_size, self.num_attention_heads
        if self.mla is None:
            gate = h * self.q_dim if self.attention_output_gate else 0
            return h * self.q_dim + gate + 2 * h * self.kv_dim + self.q_dim * h
        a = self.mla
        q_head = a.qk_nope_head_dim + a.qk_rope_head_dim
        q = h * heads * q_head if not a.q_lora_rank else h * a.q_lora_rank + a.q_lora_rank * heads * q_head
        kv = h * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank * heads * (a.qk_nope_head_dim + a.v_head_dim)
        return q + kv + heads * a.v_head_dim * h

    def _mlp_params(self, layer: int, active: bool) -> int:
        """Weights of layer `layer`'s MLP: all of them, or those one token uses (`active`)."""
        h, m = self.hidden_size, self.moe
        if m is None or layer < m.dense_layers:
            return 3 * h * self.intermediate_size
        routed = m.experts_per_token if active else m.num_experts
        return 3 * h * m.expert_intermediate_size * (routed + m.shared_experts) + h * m.num_experts  # + router

    @property
    def layer_matmul_params(self) -> int:
        """Weights one token multiplies in an average decoder layer (MoE: only its experts)."""
        return self.active_layer_params_total // self.num_layers

    @property
    def mixer_params_total(self) -> int:
        """Every layer's attention projections: full attention's, and linear attention's where it is."""
        lin = self.linear_attention
        linear = lin.layers * lin.layer_params(self.hidden_size) if lin is not None else 0
        return self.attention_layers * self.attention_params + linear

    @property
    def active_layer_params_total(self) -> int:
        return self.mixer_params_total + sum(self._mlp_params(i, True) for i in range(self.num_layers))

    @property
    def linear_params_total(self) -> int:
        """Every decoder layer's linear weights (MoE: every expert)."""
        return self.mixer_params_total + sum(self._mlp_params(i, False) for i in range(self.num_layers))

    @property
    def matmul_params(self) -> int:
        """Parameters used as matmul weights per token: its layers' + lm_head (tied or not)."""
        return self.active_layer_params_total + self.vocab_size * self.hidden_size

    @property
    def other_params(self) -> int:
        """Embedding, LM head, norms and biases: loaded at dtype_bytes even when quantised."""
        h = self.hidden_size
        bias = (self.q_dim + 2 * self.kv_dim) if self.attention_bias else 0
        norms = self.layer_norms * h + (self.mla.kv_lora_rank + self.mla.q_lora_rank if self.mla else 0)
        qk = 2 * self.head_dim * self.attention_layers if self.qk_norm else 0
        embed = self.vocab_size * h
        lm_head = 0 if self.tie_word_embeddings else self.vocab_size * h
        lin = self.linear_attention
        small = lin.layers * lin.other_params() if lin is not None else 0
        return embed + self.attention_layers * bias + self.num_layers * norms + qk + small + h + lm_head  # + final norm

    @property
    def num_params(self) -> int:
        return self.linear_params_total + self.other_params

    @property
    def linear_bytes_per_weight(self) -> float:
        """Bytes of one linear-layer weight: quantised (linear_weight_bytes) or the model dtype."""
        return self.dtype_bytes if self.linear_weight_bytes is None else self.linear_weight_bytes

    @property
    def expert_bytes_per_weight(self) -> float:
        """Bytes of one routed-expert weight."""
        return self.linear_bytes_per_weight if self.expert_weight_bytes is None else self.expert_weight_bytes

    @property
    def routed_expert_bytes(self) -> float:
        """Bytes of every routed expert over all MoE layers: values, and their scales."""
        return self.routed_expert_params * self.expert_bytes_per_weight + self.expert_quant_extra_bytes

    @property
    def routed_expert_params(self) -> int:
        """Weights of every routed expert over all MoE layers (0 for a dense model)."""
        m = self.moe
        if m is None:
            return 0
        return (self.num_layers - m.dense_layers) * m.num_experts * 3 * self.hidden_size * m.expert_intermediate_size

    @property
    def weight_bytes(self) -> float:
        routed = self.routed_expert_params
        total = ((self.linear_params_total - routed) * self.linear_bytes_per_weight
                 + routed * self.expert_bytes_per_weight + self.other_params * self.dtype_bytes
                 + self.quant_extra_bytes + self.expert_quant_extra_bytes)
        return int(total) if float(total).is_integer() else total

    @property
    def kv_elements_per_token(self) -> int:
        """KV-cache elements one token holds over all layers: K and V per KV head, or (MLA) the
        latent and the rope key."""
        if self.mla is not None:
            return self.num_layers * (self.mla.kv_lora_rank + self.mla.qk_rope_head_dim)
        return 2 * self.attention_layers * self.kv_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V for every layer, whole model (divide by TP for one rank). Bytes."""
        return self.kv_elements_per_token * self.dtype_bytes

    @property
    def flops_per_token(self) -> int:
        """2 FLOPs per matmul weight a token uses (MoE: its experts only). Excludes attention
        scores (QK^T, PV), which grow with context; cost models add those separately."""
        return 2 * self.matmul_params


def pipeline_stage(model: ModelSpec, pipeline_parallel_size: int) -> ModelSpec:
    """The busiest of `pipeline_parallel_size` pipeline stages as a model of its own: vLLM splits
    the layers evenly (the first stages take one more where they do not divide), the last stage
    holding the LM head, so the heaviest stage is taken as ceil(L / S) layers with the head and the
    embedding counted (a little more than any stage holds). Its MoE layers: those of the last
    ceil(L / S) layers (a model's dense layers lead). The model itself for S = 1."""
    if pipeline_parallel_size == 1:
        return model
    layers = -(-model.num_layers // pipeline_parallel_size)
    moe = model.moe
    if moe is not None:
        moe = replace(moe, dense_layers=max(0, moe.dense_layers - (model.num_layers - layers)))
    lin = model.linear_attention
    if lin is not None:  # its share of linear-attention layers, rounded down (attention keeps the KV)
        lin = replace(lin, layers=lin.layers * layers // model.num_layers)
    return replace(model, num_layers=layers, moe=moe, linear_attention=lin)


# quant_method -> bytes per routed-expert weight, for methods that quantise only the experts
# (vLLM's Mxfp4Config quantises FusedMoE layers alone): MXFP4 = 4-bit E2M1 values + one E8M0
# scale byte per 32 values
EXPERT_QUANT_BYTES = {"mxfp4": (4 + 8 / 32) / 8}


def _llama(name, layers, hidden, heads, kv, inter, vocab, **kw) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, kv, hidden // heads, inter, vocab, **kw)


# name -> ModelSpec, numbers from the published config.json of each checkpoint.
MODEL_PRESETS: dict[str, ModelSpec] = {
    "llama-2-7b": _llama("llama-2-7b", 32, 4096, 32, 32, 11008, 32000),
    "llama-2-13b": _llama("llama-2-13b", 40, 5120, 40, 40, 13824, 32000),
    "llama-2-70b": _llama("llama-2-70b", 80, 8192, 64, 8, 28672, 32000),
    "llama-3-8b": _llama("llama-3-8b", 32, 4096, 32, 8, 14336, 128256),
    "llama-3-70b": _llama("llama-3-70b", 80, 8192, 64, 8, 28672, 128256),
    "mistral-7b": _llama("mistral-7b", 32, 4096, 32, 8, 14336, 32000,  # v0.1: every layer windowed
                         sliding_window=4096, sliding_layers=32),
    "qwen2.5-7b": _llama("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, attention_bias=True),
    "qwen2.5-32b": _llama("qwen2.5-32b", 64, 5120, 40, 8, 27648, 152064, attention_bias=True),
    # FP8 linear layers (NVIDIA's ModelOpt checkpoint; tests/fixtures/hf_configs/ with its
    # hf_quant_config.json): llama-3-70b's shape, embeddings and LM head kept in bf16
    # (its 80 x 7 linear modules' fp32 weight and input scales and 80 layers' FP8 KV-cache scales,
    # k and v: 5,120 bytes)
    "llama-3.1-70b-fp8": _llama("llama-3.1-70b-fp8", 80, 8192, 64, 8, 28672, 128256, linear_weight_bytes=1,
                                quant_extra_bytes=5120.0, quant_scheme="fp8", kv_cache_scales="fp8"),
    # Mixture of experts (tests/fixtures/hf_configs/: equal to their published configs)
    "mixtral-8x7b": _llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000,
                           moe=MoESpec(num_experts=8, experts_per_token=2, expert_intermediate_size=14336)),
    "qwen3-30b-a3b": ModelSpec("qwen3-30b-a3b", 48, 2048, 32, 4, 128, 6144, 151936, qk_norm=True,
                               moe=MoESpec(num_experts=128, experts_per_token=8, expert_intermediate_size=768)),
    # DeepSeek-V3 as published: MLA, 256 routed experts + 1 shared, 3 leading dense layers, FP8
    # weights in 128 x 128 blocks (head_dim is config.json's hidden / heads: MLA does not use it)
    "deepseek-v3": ModelSpec("deepseek-v3", 61, 7168, 128, 128, 56, 18432, 129280,
                             moe=MoESpec(num_experts=256, experts_per_token=8, expert_intermediate_size=2048,
                                         shared_experts=1, dense_layers=3),
                             mla=MLASpec(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
                                         v_head_dim=128, q_lora_rank=1536),
                             # (its fp32 block scales and its routers, kept in bf16: 110,137,696 bytes more,
                             # and its routed experts' block scales, 159,645,696)
                             linear_weight_bytes=1, weight_block_size=128, quant_extra_bytes=110137696.0,
                             expert_quant_extra_bytes=159645696.0,
                             quant_scheme="fp8_block"),
    # gpt-oss: MXFP4 experts, bf16 attention (64-wide heads, q/k/v biases), every other layer
    # windowed at 128 tokens
    **{name: ModelSpec(name, layers, 2880, 64, 8, 64, 2880, 201088, attention_bias=True,
                       moe=MoESpec(num_experts=experts, experts_per_token=4, expert_intermediate_size=2880),
                       expert_weight_bytes=EXPERT_QUANT_BYTES["mxfp4"], sliding_window=128,
                       sliding_layers=layers // 2)
       for name, layers, experts in (("gpt-oss-20b", 24, 32), ("gpt-oss-120b", 36, 128))},
    # Not a published checkpoint: a 125M-parameter Llama (GQA 12/4 heads) that real vLLM runs on a
    # CPU with random weights, for `servesim validate --engine vllm` (docs/validation.md).
    "llama-125m": _llama("llama-125m", 12, 768, 12, 4, 2048, 32000),
    # Hybrid: Qwen3-Next-80B-A3B (Qwen/Qwen3-Next-80B-A3B-Instruct config.json): every fourth layer
    # full attention with an output gate (16 query, 2 KV heads of 256), the other 36 Gated
    # DeltaNet (16 key, 32 value heads of 128, conv 4); 512 experts of 512, 10 a token, plus one
    # shared expert as wide. 79,674,292,992 weights counted: the published 79,674,391,296 less the
    # shared experts' gates (48 x 2,048), not counted here.
    "qwen3-next-80b-a3b": ModelSpec("qwen3-next-80b-a3b", 48, 2048, 16, 2, 256, 5120, 151936, qk_norm=True,
                                    moe=MoESpec(num_experts=512, experts_per_token=10,
                                                expert_intermediate_size=512, shared_experts=1),
                                    linear_attention=LinearAttentionSpec(36, 16, 32, 128, 128, 4),
                                    attention_output_gate=True),
    # Small enough for CPU calibration runs and fast tests.
    "tiny": ModelSpec("tiny", 2, 64, 4, 2, 16, 128, 256),
}

# presets for CPU runs and tests only: no kernel-table rows or GPU profiles are shipped for them
CPU_PRESETS = ("llama-125m", "tiny")

# Hugging Face torch_dtype (or dtype) string -> bytes per element.
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}

_REQUIRED = ("num_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
_FIELDS = tuple(f.name for f in dc_fields(ModelSpec))
_HI = {"num_layers": MAX_COUNT, "hidden_size": MAX_COUNT, "num_attention_heads": MAX_COUNT,
       "intermediate_size": MAX_TOKENS, "vocab_size": MAX_TOKENS * 10}


def _fail(where: str, msg: str) -> ScenarioError:
    return ScenarioError(f"{where}: {msg}" if where else msg)


def model_from_fields(fields: dict, where: str) -> ModelSpec:
    """Explicit ModelSpec mapping (e.g. a scenario's `model:` block). `where` prefixes messages,
    e.g. "chat.yaml: model". num_kv_heads defaults to num_attention_heads, head_dim to
    hidden_size // num_attention_heads, name to "custom"."""
    check_fields(fields, where, _FIELDS, _REQUIRED)
    at = lambda key: f"{where}.{key}"  # noqa: E731
    v: dict[str, Any] = {k: _int(fields[k], at(k), lo=1, cap=_HI[k]) for k in _REQUIRED}
    heads = v["num_attention_heads"]
    v["num_kv_heads"] = _int(fields.get("num_kv_heads", heads), at("num_kv_heads"), lo=1, cap=MAX_COUNT)
    if heads % v["num_kv_heads"]:
        raise ScenarioError(f"{at('num_kv_heads')}: {v['num_kv_heads']} does not divide "
                            f"num_attention_heads ({heads})")
    v["head_dim"] = _int(fields.get("head_dim", v["hidden_size"] // heads), at("head_dim"), lo=1,
                         cap=MAX_COUNT)
    dtype_bytes = fields.get("dtype_bytes", 2)
    if dtype_bytes not in (1, 2, 4) or isinstance(dtype_bytes, bool):
        raise ScenarioError(f"{at('dtype_bytes')}: {_show(dtype_bytes)} is not one of 1, 2, 4")
    parts = _model_parts(fields, at, v["num_layers"])
    window, sliding = _model_window(fields, at, v["num_layers"], parts)
    lwb, ewb, block, extra, expert_extra, kv_scales = _model_quantisation(fields, at)
    return ModelSpec(
        name=_text(fields.get("name", "custom"), at("name")), dtype_bytes=dtype_bytes,
        quant_extra_bytes=float(extra), expert_quant_extra_bytes=float(expert_extra),
        quant_scheme=_text(fields["quant_scheme"], at("quant_scheme")) if fields.get("quant_scheme") else "",
        kv_cache_scales=kv_scales,
        linear_weight_bytes=lwb, expert_weight_bytes=ewb, weight_block_size=block, sliding_window=window,
        sliding_layers=sliding, **parts,
        tie_word_embeddings=_bool(fields.get("tie_word_embeddings", False), at("tie_word_embeddings")),
        attention_bias=_bool(fields.get("attention_bias", False), at("attention_bias")),
        attention_output_gate=_bool(fields.get("attention_output_gate", False), at("attention_output_gate")),
        qk_norm=_bool(fields.get("qk_norm", False), at("qk_norm")),
        layer_norms=_int(fields.get("layer_norms", 2), at("layer_norms"), lo=0, cap=MAX_COUNT),
        **v,
    )


def _model_parts(fields: dict, at: Callable[[str], str], num_layers: int) -> dict[str, Any]:
    """The model's optional parts (moe, mla, linear_attention) as their specs, checked."""
    parts: dict[str, Any] = {}
    for key, cls in (("moe", MoESpec), ("mla", MLASpec), ("linear_attention", LinearAttentionSpec)):
        if fields.get(key) is not None:
            names = tuple(f.name for f in dc_fields(cls))
            required = tuple(f.name for f in dc_fields(cls) if f.default is dataclasses.MISSING)
            check_fields(fields[key], at(key), names, required)
            parts[key] = cls(**{k: _int(v, f"{at(key)}.{k}", lo=0, cap=MAX_TOKENS)
                                for k, v in fields[key].items()})
    moe = parts.get("moe")
    if moe is not None:  # (fields that cannot be right together: issue 53)
        if moe.num_experts < 1 or not 1 <= moe.experts_per_token <= moe.num_experts:
            raise ScenarioError(f"{at('moe.experts_per_token')}: {moe.experts_per_token} routed experts a token of "
                                f"{moe.num_experts} (num_experts): needs 1 <= experts_per_token <= num_experts")
        if moe.expert_intermediate_size < 1:
            raise ScenarioError(f"{at('moe.expert_intermediate_size')}: must be at least 1")
        if moe.dense_layers > num_layers:
            raise ScenarioError(f"{at('moe.dense_layers')}: {moe.dense_layers} dense layers of {num_layers} "
                                f"(num_layers)")
    return parts


def _model_window(fields: dict, at: Callable[[str], str], num_layers: int, parts: dict) -> tuple[int, int]:
    """sliding_window and sliding_layers, checked against each other and the other parts."""
    window = _int(fields.get("sliding_window", 0), at("sliding_window"), lo=0, cap=MAX_TOKENS)
    sliding = _int(fields.get("sliding_layers", num_layers if window else 0), at("sliding_layers"),
                   lo=0, hi=num_layers)
    if bool(window) != bool(sliding):
        raise ScenarioError(f"{at('sliding_layers')}: {sliding} windowed layers with sliding_window "
                            f"{window}; give both (or neither)")
    if sliding and parts.get("mla") is not None:
        raise ScenarioError(f"{at('sliding_window')}: a sliding window over latent attention (mla) "
                            f"is not modelled")
    lin = parts.get("linear_attention")
    if lin is not None:
        _check_linear_attention(lin, num_layers, at("linear_attention"))
        if sliding or parts.get("mla") is not None:
            raise ScenarioError(f"{at('linear_attention')}: linear attention beside "
                                f"{'a sliding window' if sliding else 'latent attention (mla)'} is not modelled")
    return window, sliding


def _model_quantisation(fields: dict, at: Callable[[str], str]) -> tuple:
    """The weights' and KV cache's stored precision: linear_weight_bytes, expert_weight_bytes,
    weight_block_size, quant_extra_bytes, expert_quant_extra_bytes, kv_cache_scales; checked."""
    lwb = fields.get("linear_weight_bytes")
    if lwb is not None and (isinstance(lwb, bool) or lwb not in (0.5, 1, 2, 4)):
        raise ScenarioError(f"{at('linear_weight_bytes')}: {_show(lwb)} is not one of 0.5, 1, 2, 4")
    ewb = fields.get("expert_weight_bytes")
    allowed = (0.5, EXPERT_QUANT_BYTES["mxfp4"], 1, 2, 4)
    if ewb is not None and (isinstance(ewb, bool) or ewb not in allowed):
        raise ScenarioError(f"{at('expert_weight_bytes')}: {_show(ewb)} is not one of "
                            f"{', '.join(f'{x:g}' for x in allowed)}")
    if ewb is not None and fields.get("moe") is None:
        raise ScenarioError(f"{at('expert_weight_bytes')}: the model has no experts (moe:)")
    block = _int(fields.get("weight_block_size", 0), at("weight_block_size"), lo=0, cap=MAX_COUNT)
    if block and lwb != 1:
        raise ScenarioError(f"{at('weight_block_size')}: {block}: block scales are modelled for FP8 "
                            f"weights only (linear_weight_bytes: 1)")
    extra = fields.get("quant_extra_bytes", 0.0)
    expert_extra = fields.get("expert_quant_extra_bytes", 0.0)
    for key, value in (("quant_extra_bytes", extra), ("expert_quant_extra_bytes", expert_extra)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_BYTES:
            raise ScenarioError(f"{at(key)}: {_show(value)} is not bytes in [0, {MAX_BYTES:g}]")
    kv_scales = fields.get("kv_cache_scales", "")
    if kv_scales not in ("", "fp8"):
        raise ScenarioError(f"{at('kv_cache_scales')}: {_show(kv_scales)} is not one of fp8 or empty")
    return lwb, ewb, block, extra, expert_extra, kv_scales


def _check_linear_attention(lin: LinearAttentionSpec, num_layers: int, where: str) -> None:
    """A hybrid keeps both kinds of layer, heads and dims of at least one, a state dtype of 1, 2 or 4 bytes."""
    if not 1 <= lin.layers < num_layers:
        raise ScenarioError(f"{where}.layers: {lin.layers} of {num_layers} layers; a hybrid has from 1 to "
                            f"{num_layers - 1} linear-attention layers")
    for key in ("num_key_heads", "num_value_heads", "key_head_dim", "value_head_dim", "conv_kernel"):
        if getattr(lin, key) < 1:
            raise ScenarioError(f"{where}.{key}: {getattr(lin, key)} is not a positive integer")
    if lin.num_value_heads % lin.num_key_heads:
        raise ScenarioError(f"{where}.num_value_heads: {lin.num_value_heads} is not a multiple of "
                            f"num_key_heads ({lin.num_key_heads})")
    if lin.state_dtype_bytes not in (0, 1, 2, 4):
        raise ScenarioError(f"{where}.state_dtype_bytes: {lin.state_dtype_bytes} is not one of 0 (the "
                            f"model's dtype), 1, 2, 4")


# Model types whose layers ModelSpec sizes and prices: dense Llama-style decoders (GQA attention,
# gated MLP), and the MoE / MLA layouts read by _moe / _mla below. Granite (IBM) is Llama with scalar
# multipliers on embeddings, residuals, attention and logits (no weights, no work); Phi-3/Phi-4 fuse
# q/k/v and gate/up into one GEMM each, the same weights and FLOPs as Llama's four; Gemma (1) is
# Llama-shaped with GeGLU (the same gate/up/down) and 2 norms per layer; OLMo-2 adds q/k RMSNorms
# (2 x hidden per layer, not counted, as Gemma-3's).
LLAMA_STYLE = ("llama", "mistral", "qwen2", "qwen3", "granite", "phi3", "gemma", "olmo2")
# Gemma-2/3 text decoders: Llama-shaped (GeGLU has the same gate/up/down), 4 norms per layer
GEMMA_TYPES = ("gemma2", "gemma3_text")
# model types whose attention normalises each head's queries and keys (q_norm, k_norm)
QK_NORM_TYPES = ("qwen3", "qwen3_moe", "gemma3_text", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
# Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): routed experts of moe_intermediate_size plus one shared
# expert of shared_expert_intermediate_size (its sigmoid gate, hidden weights, not counted)
MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "gpt_oss", "llama4_text", "qwen3_next",
             "qwen3_5_moe_text")
# model types that always use q/k/v biases without saying so (no attention_bias key)
QKV_BIAS_TYPES = ("qwen2", "qwen2_moe")
# hybrids of attention and Gated DeltaNet layers (_linear_attention below): Qwen3-Next, Qwen3.5
HYBRID_TYPES = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")
MODELLED_TYPES = tuple(dict.fromkeys(LLAMA_STYLE + GEMMA_TYPES + MOE_TYPES + HYBRID_TYPES))
# quantization_config.quant_method values read module by module (sim/presets/quantization.py);
# anything else but mxfp4 experts is refused
# read module by module (sim/presets/quantization.py)
QUANT_METHODS = ("fp8", "compressed-tensors", "fbgemm_fp8", "modelopt", "awq", "gptq")


def _refuse_unmodelled(cfg: dict, path: Path) -> None:
    """A config describing what ModelSpec does not model is an error naming the field, never a
    silent dense bf16 sizing (a Mixtral sized as a dense 7B model under-counts its weights 6x)."""
    model_type = cfg.get("model_type")
    if model_type is not None and model_type not in MODELLED_TYPES:
        raise ScenarioError(f"{path}: model_type: {_show(model_type)} is not modelled; servesim sizes "
                            f"{', '.join(MODELLED_TYPES)}, or give the model's fields under model: "
                            f"in the scenario")
    if model_type not in MOE_TYPES:
        for key in ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size",
                    "kv_lora_rank", "q_lora_rank"):
            if cfg.get(key) not in (None, 0, False):
                raise ScenarioError(f"{path}: {key}: {_show(cfg[key])}: experts or latent attention "
                                    f"in a {_show(model_type)} config are not modelled")
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list):
        known = LAYER_TYPES + (("linear_attention",) if model_type in HYBRID_TYPES else ())
        odd = [t for t in layer_types if t not in known]
        if odd:
            raise ScenarioError(f"{path}: layer_types: {_show(odd[0])} layers are not modelled "
                                f"(only {', '.join(known)})")
    step = cfg.get("interleave_moe_layer_step", 1)
    if model_type == "llama4_text" and (isinstance(step, bool) or not isinstance(step, int) or step < 1):
        raise ScenarioError(f"{path}: interleave_moe_layer_step: {_show(step)} is not a positive integer")
    if cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1 or cfg.get("moe_layer_freq", 1) != 1:
        raise ScenarioError(f"{path}: mlp_only_layers / decoder_sparse_step / moe_layer_freq: MoE "
                            f"layers interleaved with dense ones are not modelled (only leading dense "
                            f"layers, first_k_dense_replace)")


# config.json `layer_types` entries ModelSpec sizes
LAYER_TYPES = ("full_attention", "sliding_attention")


def _sliding(cfg: dict, path: Path) -> dict:
    """sliding_window / sliding_layers from a config, as transformers and vLLM read it: an explicit
    `layer_types` list says which layers are windowed; else Qwen2-style configs window the layers
    from `max_window_layers` on when `use_sliding_window` is true, and Mistral-style configs (no
    `use_sliding_window` key) window every layer when `sliding_window` is set."""
    window = cfg.get("sliding_window")
    layers = cfg["num_hidden_layers"]
    if isinstance(layers, bool) or not isinstance(layers, int):
        return {}  # (model_from_fields says what is wrong with it)
    types = cfg.get("layer_types")
    if cfg.get("model_type") == "llama4_text" and cfg.get("attention_chunk_size"):
        # chunked local attention (the RoPE layers; every no_rope_layer_interval-th is global, NoPE)
        # priced and sized as a sliding window of one chunk: it attends and keeps at most a chunk
        # (L mod chunk tokens), the window min(L, chunk): an upper bound on its KV and attention work
        rope = cfg.get("no_rope_layers")
        if isinstance(rope, list) and rope:
            if len(rope) != layers:
                raise ScenarioError(f"{path}: no_rope_layers: {len(rope)} entries for {layers} num_hidden_layers")
            sliding = sum(1 for r in rope if r)
        else:
            interval = _int(cfg.get("no_rope_layer_interval", 4), f"{path}: no_rope_layer_interval", lo=1,
                            cap=MAX_COUNT)
            sliding = layers - layers // interval
        return {"sliding_window": cfg["attention_chunk_size"], "sliding_layers": sliding} if sliding else {}
    if isinstance(types, list):
        if len(types) != layers:
            raise ScenarioError(f"{path}: layer_types: {len(types)} entries for {layers} "
                                f"num_hidden_layers")
        sliding = types.count("sliding_attention")
    elif window in (None, 0) or cfg.get("use_sliding_window", True) is False:
        sliding = 0
    elif cfg.get("model_type") == "gemma2":  # layers 0, 2, 4, ... (transformers' Gemma2Config)
        sliding = (layers + 1) // 2
    elif cfg.get("model_type") == "gemma3_text":  # every layer but each sliding_window_pattern-th
        pattern = _int(cfg.get("sliding_window_pattern", 6), f"{path}: sliding_window_pattern", lo=1,
                       cap=MAX_COUNT)
        sliding = layers - layers // pattern
    elif "use_sliding_window" in cfg:
        start = cfg.get("max_window_layers", layers)
        sliding = max(0, layers - _int(start, f"{path}: max_window_layers", lo=0, cap=MAX_COUNT))
    else:
        sliding = layers
    if not sliding:
        return {}
    if window in (None, 0):
        raise ScenarioError(f"{path}: sliding_window: {_show(window)}: layer_types lists "
                            f"sliding_attention layers but no window is given")
    return {"sliding_window": window, "sliding_layers": sliding}


def _quantised_bytes(cfg: dict, path: Path, model: ModelSpec) -> dict:
    """linear_weight_bytes / expert_weight_bytes and the exact extras from `quantization_config`
    ({}: unquantised): sim/presets/quantization.py, but for gpt-oss's MXFP4 experts."""
    q: Any = cfg.get("quantization_config")
    if q in (None, {}):
        return {}
    method = q.get("quant_method") if isinstance(q, dict) else None
    if method in QUANT_METHODS:
        from sim.presets.quantization import quantised_fields
        return quantised_fields(model, cfg, q, str(path))
    if method in EXPERT_QUANT_BYTES and _moe(cfg) is not None:
        return {"expert_weight_bytes": EXPERT_QUANT_BYTES[method]}
    raise ScenarioError(f"{path}: quantization_config.quant_method: {_show(method)}: not modelled; "
                        f"servesim sizes {', '.join(QUANT_METHODS)} and mxfp4 experts")


def _moe(cfg: dict) -> MoESpec | None:
    keys = [k for k in ("num_local_experts", "num_experts", "n_routed_experts") if cfg.get(k) is not None]
    experts = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts")
    if not experts:
        if keys and cfg.get("model_type") in MOE_TYPES:  # (an MoE model with 0 experts has no MLP)
            raise ValueError(f"{keys[0]}: {_show(cfg[keys[0]])}: a {cfg['model_type']} model needs at least one expert")
        return None
    layers = cfg["num_hidden_layers"]
    for key in keys:
        if isinstance(cfg[key], bool) or not isinstance(cfg[key], int) or cfg[key] < 1:
            raise ValueError(f"{key}: {_show(cfg[key])} is not a positive whole number of experts")
    k = cfg.get("num_experts_per_tok")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= experts:
        raise ValueError(f"num_experts_per_tok: {_show(k)} is not a whole number of experts in [1, {experts}] "
                         f"(the routed experts)")
    also = cfg.get("experts_per_token")  # (gpt-oss writes both: two answers to one question is an error)
    if also is not None and also != k:
        raise ValueError(f"experts_per_token: {_show(also)} but num_experts_per_tok is {k}; they name the same "
                         "count (the routed experts a token goes to)")
    first = cfg.get("first_k_dense_replace")
    if first is not None and (isinstance(first, bool) or not isinstance(first, int) or not 0 <= first <= layers):
        raise ValueError(f"first_k_dense_replace: {_show(first)} is not a number of layers in [0, {layers}] "
                         f"(num_hidden_layers)")
    width = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]  # Mixtral: experts are full width
    # Llama 4: every MoE layer has one shared expert as wide as the routed ones
    shared = 1 if cfg.get("model_type") == "llama4_text" else cfg.get("n_shared_experts") or 0
    dense = cfg.get("first_k_dense_replace") or 0
    if cfg.get("model_type") == "llama4_text" and cfg.get("interleave_moe_layer_step", 1) > 1:
        # Llama-4-Maverick: layer i is MoE when (i + 1) % step == 0 (transformers' Llama4TextConfig),
        # the others dense (of intermediate_size_mlp: model_from_hf_config)
        dense = cfg["num_hidden_layers"] - cfg["num_hidden_layers"] // cfg["interleave_moe_layer_step"]
    if cfg.get("shared_expert_intermediate_size"):  # Qwen3-Next: one shared MLP, in experts' widths
        wide = cfg["shared_expert_intermediate_size"]
        if not isinstance(wide, int) or isinstance(wide, bool) or wide % width:
            raise ValueError(f"shared_expert_intermediate_size {_show(wide)} is not a whole number of "
                             f"experts of moe_intermediate_size {width}")
        shared = wide // width
    return MoESpec(num_experts=experts, experts_per_token=cfg["num_experts_per_tok"],
                   expert_intermediate_size=width, shared_experts=shared, dense_layers=dense)


def _linear_attention(cfg: dict, path: Path) -> dict:
    """A hybrid's Gated DeltaNet layers (Qwen3-Next): which layers (layer_types, else every
    full_attention_interval-th layer attends and the others are linear), their heads and state."""
    if cfg.get("model_type") not in HYBRID_TYPES:
        return {}
    layers = cfg["num_hidden_layers"]
    types = cfg.get("layer_types")
    if isinstance(types, list):
        if len(types) != layers:
            raise ScenarioError(f"{path}: layer_types: {len(types)} entries for {layers} num_hidden_layers")
        linear = types.count("linear_attention")
    else:
        interval = _int(cfg.get("full_attention_interval", 4), f"{path}: full_attention_interval", lo=1,
                        cap=MAX_COUNT)
        linear = layers - layers // interval
    if not linear or linear == layers:
        raise ScenarioError(f"{path}: layer_types: {linear} of {layers} layers are linear attention; servesim "
                            f"models a hybrid with both kinds")
    state = cfg.get("mamba_ssm_dtype")
    if state is not None and state not in DTYPE_BYTES:
        raise ScenarioError(f"{path}: mamba_ssm_dtype: {_show(state)}; allowed: {', '.join(DTYPE_BYTES)}")
    keys = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")
    nk, nv, dk, dv = (_int(cfg.get(k), f"{path}: {k}", lo=1, cap=MAX_COUNT) for k in keys)
    if nv % nk:
        raise ScenarioError(f"{path}: linear_num_value_heads: {nv} is not a multiple of "
                            f"linear_num_key_heads ({nk})")
    spec = LinearAttentionSpec(linear, nk, nv, dk, dv,
                               conv_kernel=_int(cfg.get("linear_conv_kernel_dim", 4), f"{path}: linear_conv_kernel_dim",
                                                lo=1, cap=MAX_COUNT),
                               state_dtype_bytes=DTYPE_BYTES[state] if state is not None else 0)
    return {"linear_attention": spec, "attention_output_gate": bool(cfg.get("attn_output_gate", True))}


def _mla(cfg: dict) -> MLASpec | None:
    if not cfg.get("kv_lora_rank"):
        return None
    return MLASpec(kv_lora_rank=cfg["kv_lora_rank"], qk_rope_head_dim=cfg["qk_rope_head_dim"],
                   qk_nope_head_dim=cfg["qk_nope_head_dim"], v_head_dim=cfg["v_head_dim"],
                   q_lora_rank=cfg.get("q_lora_rank") or 0)


# config.json key -> ModelSpec field, for the keys every Llama-style config has.
_HF_KEYS = {
    "num_hidden_layers": "num_layers",
    "hidden_size": "hidden_size",
    "num_attention_heads": "num_attention_heads",
    "intermediate_size": "intermediate_size",
    "vocab_size": "vocab_size",
}


# multimodal configs whose text decoder servesim sizes: model_type -> its decoder's model_type
TEXT_DECODERS = {"llama4": "llama4_text", "qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text",
                 "gemma3": "gemma3_text"}


def _llama4_text(cfg: dict, path: Path) -> dict:
    """A multimodal config.json (Llama 4, Qwen3.5, Gemma 3: the decoder under text_config, a vision encoder
    beside it) as its text decoder's config; the vision encoder's weights are not counted, and a
    warning says so. Any other config as it is."""
    kind = cfg.get("model_type")
    if kind not in TEXT_DECODERS:
        return cfg
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        raise ScenarioError(f"{path}: text_config: missing or not a mapping in a {kind} config")
    if cfg.get("vision_config"):
        warnings.warn(f"{path}: {kind}: the text decoder is sized and priced; the vision encoder "
                      "(vision_config: about 1% of Llama 4's and Qwen3.5's weights, 0.4 B parameters in Gemma 3's) "
                      "is not counted", ServesimWarning, stacklevel=3)
    out = {**text, "model_type": TEXT_DECODERS[kind]}
    for key in ("torch_dtype", "tie_word_embeddings", "quantization_config"):
        if key in cfg and key not in text:
            out[key] = cfg[key]
    return out


def _read_json(path: Path, what: str) -> dict:
    return json_object(read_text(path, "config"), str(path), f"a {what}")


# NVIDIA ModelOpt checkpoints keep their quantisation in hf_quant_config.json beside config.json
# (vLLM reads it as quant_method "modelopt"); sim/presets/quantization.py reads its `quantization`


def _modelopt_quantization(path: Path) -> dict | None:
    """The hf_quant_config.json next to `path` (also `<stem>_hf_quant_config.json`, as the
    AIConfigurator wheel names them), as a quantization_config; None when there is none."""
    for sibling in (path.with_name("hf_quant_config.json"), path.with_name(f"{path.stem}_hf_quant_config.json")):
        if sibling.is_file():
            q = _read_json(sibling, "hf_quant_config.json").get("quantization")
            if not isinstance(q, dict) or "quant_algo" not in q:
                raise ScenarioError(f"{sibling}: quantization.quant_algo: missing; a ModelOpt hf_quant_config.json "
                                    f"names its algorithm (FP8, NVFP4, MIXED_PRECISION)")
            return {"quant_method": "modelopt", "quantization": q}
    return None


def model_from_hf_config(path: Path, name: str | None = None) -> ModelSpec:
    """ModelSpec from a Llama-style Hugging Face config.json (or the folder holding one), with a
    ModelOpt hf_quant_config.json beside it when there is one.

    name defaults to the folder's name (e.g. "Meta-Llama-3-8B"). Qwen2 and Qwen2-MoE configs
    have no `attention_bias` key but always use q/k/v biases, so their model_type implies it."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        raise ScenarioError(f"{path}: file not found")
    raw = _read_json(path, "config.json")
    if not isinstance(raw.get("model_type", ""), str):
        raise ScenarioError(f"{path}: model_type: {_show(raw['model_type'])} is not a name (e.g. \"llama\")")
    cfg = _llama4_text(raw, path)
    modelopt = _modelopt_quantization(path)
    own = cfg.get("quantization_config")
    if isinstance(own, dict) and "quant_method" not in own and (own.get("producer") or {}).get("name") == "modelopt":
        # ModelOpt writes its section into config.json too, without a quant_method (vLLM reads
        # it as modelopt): the hf_quant_config.json beside it, where there is one, says the same
        own = None if modelopt is not None else {"quant_method": "modelopt", "quantization": {
            **own, "exclude_modules": own.get("exclude_modules", own.get("ignore")),
            "kv_cache_quant_algo": own.get("kv_cache_quant_algo", own.get("kv_cache_scheme"))}}
        cfg["quantization_config"] = own
    if modelopt is not None:
        if own:
            raise ScenarioError(f"{path}: quantization_config and an hf_quant_config.json beside it: "
                                f"keep one")
        cfg["quantization_config"] = modelopt
    _refuse_unmodelled(cfg, path)
    if "intermediate_size" not in cfg and cfg.get("moe_intermediate_size") and cfg.get("num_experts_per_tok"):
        # every layer MoE, no dense width given (Qwen3.5-MoE): the width a token activates stands in
        # where a dense one is read (the activation reserve), k x the expert width
        cfg = {**cfg, "intermediate_size": cfg["moe_intermediate_size"] * cfg["num_experts_per_tok"]}
    missing = [k for k in _HF_KEYS if k not in cfg]
    if missing:
        raise ScenarioError(f"{path}: missing key {missing[0]!r}; a Llama-style config.json "
                            f"needs {', '.join(_HF_KEYS)}")
    fields = {ours: cfg[theirs] for theirs, ours in _HF_KEYS.items()}
    if cfg.get("model_type") == "llama4_text" and cfg.get("interleave_moe_layer_step", 1) > 1:
        # (its dense layers' width; intermediate_size is the experts')
        fields["intermediate_size"] = cfg.get("intermediate_size_mlp", cfg["intermediate_size"])
    for theirs, ours in (("num_key_value_heads", "num_kv_heads"), ("head_dim", "head_dim")):
        if cfg.get(theirs) is not None:  # some configs write "head_dim": null
            fields[ours] = cfg[theirs]
    # (transformers 5 writes `dtype`, and null where none was set: vLLM then serves 16-bit, bf16 here)
    dtype = next((cfg[k] for k in ("torch_dtype", "dtype") if cfg.get(k) is not None), "bfloat16")
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise ScenarioError(f"{path}: torch_dtype {dtype!r} not supported; "
                            f"allowed: {', '.join(DTYPE_BYTES)}")
    fields["dtype_bytes"] = DTYPE_BYTES[dtype]
    fields["tie_word_embeddings"] = bool(cfg.get("tie_word_embeddings", False))
    # (transformers 5 writes Qwen2-MoE's as qkv_bias)
    biased = cfg.get("qkv_bias", cfg.get("model_type") in QKV_BIAS_TYPES)
    fields["attention_bias"] = bool(cfg.get("attention_bias", biased))
    if cfg.get("model_type") in GEMMA_TYPES:  # input, post-attention, pre- and post-feedforward
        fields["layer_norms"] = 4
    if cfg.get("model_type") in QK_NORM_TYPES:
        fields["qk_norm"] = True
    fields.update(_sliding(cfg, path))
    fields["name"] = name or (path.stem if path.name != "config.json" else path.resolve().parent.name) or "custom"
    spec = model_from_fields(fields, str(path))
    try:
        extra = {"moe": _moe(cfg), "mla": _mla(cfg), **_linear_attention(cfg, path)}
        extra.update(_quantised_bytes(cfg, path, replace(spec, **extra)))
        for part in ("moe", "mla"):
            if extra[part] is not None:
                for key, value in vars(extra[part]).items():
                    _int(value, f"{path}: {part}.{key}", lo=0, cap=MAX_TOKENS)
    except ScenarioError:
        raise
    except ValueError as e:  # (_moe's)
        raise ScenarioError(f"{path}: {e}") from None
    except (KeyError, TypeError) as e:
        raise ScenarioError(f"{path}: {e.args[0] if e.args else e}: missing or malformed for its "
                            f"model_type {_show(cfg.get('model_type'))}") from None
    return replace(spec, **extra)
