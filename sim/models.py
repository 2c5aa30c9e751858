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

import json
from dataclasses import dataclass, fields as dc_fields
from pathlib import Path

from .checks import MAX_COUNT, MAX_TOKENS, _bool, _int, _show, _text, check_fields, read_text
from .errors import ScenarioError


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
    dtype_bytes: int = 2  # bf16/fp16 weights and KV cache
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2/2.5); o_proj never does

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def layer_matmul_params(self) -> int:
        """Weights of one decoder layer's linear layers: q, k, v, o + gate, up, down."""
        h = self.hidden_size
        attn = h * self.q_dim + 2 * h * self.kv_dim + self.q_dim * h
        mlp = 3 * h * self.intermediate_size
        return attn + mlp

    @property
    def matmul_params(self) -> int:
        """Parameters used as matmul weights per token: all layers + lm_head (tied or not)."""
        return self.num_layers * self.layer_matmul_params + self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        h = self.hidden_size
        bias = (self.q_dim + 2 * self.kv_dim) if self.attention_bias else 0
        per_layer = self.layer_matmul_params + bias + 2 * h  # + input/post-attention RMSNorm
        embed = self.vocab_size * h
        lm_head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return embed + self.num_layers * per_layer + h + lm_head  # + final norm

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V for every layer, whole model (divide by TP for one rank). Bytes."""
        return 2 * self.num_layers * self.kv_dim * self.dtype_bytes

    @property
    def flops_per_token(self) -> int:
        """2 FLOPs per matmul weight. Excludes attention scores (QK^T, PV), which grow with
        context; cost models add those separately. Biases, norms, activations are negligible."""
        return 2 * self.matmul_params


def _llama(name, layers, hidden, heads, kv, inter, vocab, **kw) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, kv, hidden // heads, inter, vocab, **kw)


# name -> ModelSpec, numbers from the published config.json of each checkpoint.
MODEL_PRESETS: dict[str, ModelSpec] = {
    "llama-2-7b": _llama("llama-2-7b", 32, 4096, 32, 32, 11008, 32000),
    "llama-2-13b": _llama("llama-2-13b", 40, 5120, 40, 40, 13824, 32000),
    "llama-2-70b": _llama("llama-2-70b", 80, 8192, 64, 8, 28672, 32000),
    "llama-3-8b": _llama("llama-3-8b", 32, 4096, 32, 8, 14336, 128256),
    "llama-3-70b": _llama("llama-3-70b", 80, 8192, 64, 8, 28672, 128256),
    "mistral-7b": _llama("mistral-7b", 32, 4096, 32, 8, 14336, 32000),  # v0.1
    "qwen2.5-7b": _llama("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, attention_bias=True),
    "qwen2.5-32b": _llama("qwen2.5-32b", 64, 5120, 40, 8, 27648, 152064, attention_bias=True),
    # Small enough for CPU calibration runs and fast tests.
    "tiny": ModelSpec("tiny", 2, 64, 4, 2, 16, 128, 256),
}

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
    v = {k: _int(fields[k], at(k), lo=1, cap=_HI[k]) for k in _REQUIRED}
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
    return ModelSpec(
        name=_text(fields.get("name", "custom"), at("name")), dtype_bytes=dtype_bytes,
        tie_word_embeddings=_bool(fields.get("tie_word_embeddings", False), at("tie_word_embeddings")),
        attention_bias=_bool(fields.get("attention_bias", False), at("attention_bias")),
        **v,
    )


# Dense decoders with Llama's layer shapes (GQA attention, gated MLP), which ModelSpec sizes and
# prices; other model types may differ in ways that change weights, KV bytes or FLOPs.
LLAMA_STYLE = ("llama", "mistral", "qwen2", "qwen3")
# (config key, what it means): present and active -> a model servesim does not size correctly yet
_UNMODELLED = (
    ("num_local_experts", "mixture of experts"), ("num_experts", "mixture of experts"),
    ("n_routed_experts", "mixture of experts"), ("moe_intermediate_size", "mixture of experts"),
    ("kv_lora_rank", "multi-head latent attention (MLA)"), ("q_lora_rank", "multi-head latent attention (MLA)"),
    ("quantization_config", "quantised weights"),
)


def _refuse_unmodelled(cfg: dict, path: Path) -> None:
    """A config describing what ModelSpec does not model is an error naming the field, never a
    silent dense bf16 sizing (a Mixtral sized as a dense 7B model under-counts its weights 6x)."""
    for key, what in _UNMODELLED:
        value = cfg.get(key)
        if value not in (None, 0, False, {}, []):
            shown = value.get("quant_method", "a mapping") if isinstance(value, dict) else value
            raise ScenarioError(f"{path}: {key}: {_show(shown)}: {what} is not modelled yet, so "
                                f"weights, KV bytes and FLOPs would be wrong; servesim sizes dense "
                                f"Llama-style models ({', '.join(LLAMA_STYLE)})")
    window = cfg.get("sliding_window")
    if window not in (None, 0) and cfg.get("use_sliding_window", True) is not False:
        raise ScenarioError(f"{path}: sliding_window: {_show(window)}: sliding-window attention is not "
                            f"modelled yet (KV would be over-counted); servesim sizes full attention")
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and any(t != "full_attention" for t in layer_types):
        odd = next(t for t in layer_types if t != "full_attention")
        raise ScenarioError(f"{path}: layer_types: {_show(odd)} layers are not modelled yet "
                            f"(only full_attention)")
    model_type = cfg.get("model_type")
    if model_type is not None and model_type not in LLAMA_STYLE:
        raise ScenarioError(f"{path}: model_type: {_show(model_type)} is not modelled; servesim sizes "
                            f"dense Llama-style models ({', '.join(LLAMA_STYLE)}), or give the "
                            f"model's fields under model: in the scenario")


# config.json key -> ModelSpec field, for the keys every Llama-style config has.
_HF_KEYS = {
    "num_hidden_layers": "num_layers",
    "hidden_size": "hidden_size",
    "num_attention_heads": "num_attention_heads",
    "intermediate_size": "intermediate_size",
    "vocab_size": "vocab_size",
}


def model_from_hf_config(path: Path, name: str | None = None) -> ModelSpec:
    """ModelSpec from a Llama-style Hugging Face config.json (or the folder holding one).

    name defaults to the folder's name (e.g. "Meta-Llama-3-8B"). Qwen2 configs have no
    `attention_bias` key but always use q/k/v biases, so model_type "qwen2" implies it."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        raise ScenarioError(f"{path}: file not found")
    text = read_text(path, "config")
    try:
        cfg = json.loads(text)
    except ValueError as exc:
        raise ScenarioError(f"{path}: not a readable JSON file ({str(exc)[:120]})") from None
    except RecursionError:
        raise ScenarioError(f"{path}: nested too deeply to be a config.json") from None
    if not isinstance(cfg, dict):
        raise ScenarioError(f"{path}: expected a JSON object")
    _refuse_unmodelled(cfg, path)
    missing = [k for k in _HF_KEYS if k not in cfg]
    if missing:
        raise ScenarioError(f"{path}: missing key {missing[0]!r}; a Llama-style config.json "
                            f"needs {', '.join(_HF_KEYS)}")
    fields = {ours: cfg[theirs] for theirs, ours in _HF_KEYS.items()}
    for theirs, ours in (("num_key_value_heads", "num_kv_heads"), ("head_dim", "head_dim")):
        if cfg.get(theirs) is not None:  # some configs write "head_dim": null
            fields[ours] = cfg[theirs]
    dtype = cfg.get("torch_dtype", cfg.get("dtype", "bfloat16"))
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise ScenarioError(f"{path}: torch_dtype {dtype!r} not supported; "
                            f"allowed: {', '.join(DTYPE_BYTES)}")
    fields["dtype_bytes"] = DTYPE_BYTES[dtype]
    fields["tie_word_embeddings"] = bool(cfg.get("tie_word_embeddings", False))
    fields["attention_bias"] = bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2"))
    fields["name"] = name or path.resolve().parent.name or "custom"
    return model_from_fields(fields, str(path))
