"""Quantised checkpoints: what a config's quantisation section says each linear weight costs in bytes.

Read from config.json's `quantization_config` (or a ModelOpt hf_quant_config.json beside it):

* ``fp8`` (vLLM's Fp8Config: per-tensor, or ``weight_block_size`` blocks with fp32 scales)
* ``compressed-tensors`` (llm-compressor: ``config_groups`` of a weights scheme and its
  ``targets``, an ``ignore`` list kept in the model's dtype, a ``kv_cache_scheme``): FP8
  per tensor / channel / block, INT8 W8A8, W4A16 and WNA16 group-quantised (symmetric or with
  zero points), NVFP4 (``tensor_group``, group 16)
* ``fbgemm_fp8`` (Meta's Llama-3.1-405B-FP8: FP8 weights with one fp32 scale per output row,
  ``modules_to_not_convert`` kept in bf16)
* ModelOpt (``quant_algo`` FP8: one fp32 scale per tensor; NVFP4: 4-bit values, one FP8 scale per
  ``group_size`` values and an fp32 scale per tensor; MIXED_PRECISION: per-module algorithms;
  ``exclude_modules``; ``kv_cache_quant_algo``)
* ``awq`` / ``gptq`` (``bits``, ``group_size``: fp16 scales and packed zero points per group)
* ``mxfp4`` (gpt-oss: the routed experts alone)

Each linear module of the model (named as the checkpoint names it: model.layers.N.self_attn.q_proj,
...mlp.experts.E.down_proj, ...) is matched against the section's targets and ignore patterns
(a full name, a trailing part of one, or ``re:`` + a regular expression, as compressed-tensors
matches them), and costs its values' bytes plus its scales' and zero points'. MoE routers stay in
the model's dtype whatever the checkpoint says (vLLM builds them without a quantisation method). The model's
`linear_weight_bytes` / `expert_weight_bytes` are the value bytes of the scheme most of its
(expert) weights use, which picks the kernel tables that price it; `quant_extra_bytes` is what
the exact count adds on top (scales, zero points, layers kept unquantised), so `weight_bytes` is
the checkpoint's byte count. The embedding and LM head stay in the model's dtype (vLLM quantises
neither for these formats).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

from sim.config.errors import ScenarioError


@dataclass(frozen=True)
class Scheme:
    """How one linear weight is stored."""
    name: str                 # fp8, fp8_block, int8, int4, nvfp4, mxfp4, bf16 (unquantised)
    value_bits: float         # bits per weight value
    scale_bytes: float = 0.0  # bytes of one scale
    per: str = "tensor"       # tensor | channel (one per output row) | group | block
    group: int = 0            # values per scale (group), or the block's side (block)
    zero_point_bits: float = 0.0  # per group (asymmetric int schemes)
    global_scale_bytes: float = 0.0  # one more scale per tensor (NVFP4's fp32)

    def bytes_of(self, out_features: int, in_features: int) -> float:
        """Bytes of an out x in weight stored this way: values, scales, zero points."""
        n = out_features * in_features
        values = n * self.value_bits / 8
        if self.per == "tensor":
            scales = 1
        elif self.per == "channel":
            scales = out_features
        elif self.per == "group":
            scales = out_features * math.ceil(in_features / self.group)
        else:  # block x block tiles
            scales = math.ceil(out_features / self.group) * math.ceil(in_features / self.group)
        zero = scales * self.zero_point_bits / 8 if self.per in ("group", "channel") else 0.0
        return values + scales * self.scale_bytes + zero + self.global_scale_bytes


def unquantised(dtype_bytes: int) -> Scheme:
    return Scheme("bf16" if dtype_bytes == 2 else f"{8 * dtype_bytes}-bit", 8 * dtype_bytes, 0.0)


@dataclass(frozen=True)
class Module:
    name: str
    out_features: int
    in_features: int
    expert: bool = False  # a routed expert's weight
    router: bool = False  # an MoE router: vLLM builds it unquantised whatever the checkpoint (quant_config None)


def linear_modules(model, model_type: str | None, layer_types: list | None = None) -> list[Module]:
    """Every linear module of `model` (a ModelSpec) as its checkpoint names it; their out x in
    add up to model.linear_params_total."""
    h, m, out = model.hidden_size, model.moe, []
    lin = model.linear_attention
    if lin is not None and isinstance(layer_types, list) and len(layer_types) == model.num_layers:
        linear_at = {i for i, t in enumerate(layer_types) if t == "linear_attention"}
    else:  # (no list: the linear-attention layers first, a bound on nothing but names)
        linear_at = set(range(lin.layers)) if lin is not None else set()
    mixtral = model_type == "mixtral"
    for i in range(model.num_layers):
        p = f"model.layers.{i}."
        if i in linear_at:
            params = lin.layer_params(h)
            out.append(Module(p + "linear_attn.in_proj", params // h, h) if params % h == 0
                       else Module(p + "linear_attn.in_proj", params, 1))
        elif model.mla is None:
            gate = model.q_dim if model.attention_output_gate else 0
            out += [Module(p + "self_attn.q_proj", model.q_dim + gate, h),
                    Module(p + "self_attn.k_proj", model.kv_dim, h),
                    Module(p + "self_attn.v_proj", model.kv_dim, h), Module(p + "self_attn.o_proj", h, model.q_dim)]
        else:
            a, heads = model.mla, model.num_attention_heads
            q_head = a.qk_nope_head_dim + a.qk_rope_head_dim
            if a.q_lora_rank:
                out += [Module(p + "self_attn.q_a_proj", a.q_lora_rank, h),
                        Module(p + "self_attn.q_b_proj", heads * q_head, a.q_lora_rank)]
            else:
                out.append(Module(p + "self_attn.q_proj", heads * q_head, h))
            out += [Module(p + "self_attn.kv_a_proj_with_mqa", a.kv_lora_rank + a.qk_rope_head_dim, h),
                    Module(p + "self_attn.kv_b_proj", heads * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank),
                    Module(p + "self_attn.o_proj", h, heads * a.v_head_dim)]
        if m is None or i < m.dense_layers:
            inter = model.intermediate_size
            out += [Module(p + "mlp.gate_proj", inter, h), Module(p + "mlp.up_proj", inter, h),
                    Module(p + "mlp.down_proj", h, inter)]
            continue
        e = m.expert_intermediate_size
        block = p + ("block_sparse_moe." if mixtral else "mlp.")
        out.append(Module(block + "gate", m.num_experts, h, router=True))
        names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
        for j in range(m.num_experts):
            x = f"{block}experts.{j}."
            out += [Module(x + names[0], e, h, True), Module(x + names[1], e, h, True),
                    Module(x + names[2], h, e, True)]
        for j in range(m.shared_experts):
            x = block + ("shared_experts." if m.shared_experts == 1 else f"shared_experts.{j}.")
            out += [Module(x + "gate_proj", e, h), Module(x + "up_proj", e, h), Module(x + "down_proj", h, e)]
    return out


def _matches(name: str, pattern: str) -> bool:
    """compressed-tensors' and ModelOpt's module patterns: `re:` + a regex (re.match), a name
    with `*` wildcards (ModelOpt's), or a module name / its trailing part."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    if "*" in pattern:
        return re.fullmatch(".*".join(re.escape(x) for x in pattern.split("*")), name) is not None
    return name == pattern or name.endswith("." + pattern)


def _strings(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise ScenarioError(f"{where}: must be a list of module names or patterns")
    return value


def _num(q: dict, key: str, where: str, allowed: tuple) -> Any:
    v = q.get(key)
    if v not in allowed or isinstance(v, bool):
        raise ScenarioError(f"{where}.{key}: {str(v)[:40]!r}: not modelled; allowed: "
                            f"{', '.join(str(a) for a in allowed)}")
    return v


def compressed_tensors_scheme(w: Any, where: str, dtype_bytes: int) -> Scheme:
    """A compressed-tensors `weights` scheme."""
    if not isinstance(w, dict):
        raise ScenarioError(f"{where}: must be a mapping (num_bits, type, strategy, ...)")
    bits = _num(w, "num_bits", where, (4, 8))
    kind = _num(w, "type", where, ("float", "int"))
    strategy = _num(w, "strategy", where, ("tensor", "channel", "group", "block", "tensor_group"))
    scale = dtype_bytes  # llm-compressor keeps scales in the model's dtype
    if strategy in ("group", "tensor_group"):
        group = w.get("group_size")
        if isinstance(group, bool) or not isinstance(group, int) or group < 1:
            raise ScenarioError(f"{where}.group_size: {str(group)[:40]!r}: a {strategy} scheme needs a "
                                f"positive integer")
    if kind == "float" and bits == 4:  # NVFP4: E2M1 values, FP8 scale per group, fp32 per tensor
        if strategy != "tensor_group":
            raise ScenarioError(f"{where}.strategy: {strategy!r}: 4-bit float weights are modelled as NVFP4 "
                                f"(strategy tensor_group)")
        return Scheme("nvfp4", 4, 1.0, "group", w["group_size"], global_scale_bytes=4.0)
    zero = 0.0 if w.get("symmetric", True) else bits
    if strategy == "block":
        block = w.get("block_structure")
        if (not isinstance(block, list) or len(block) != 2 or block[0] != block[1]
                or isinstance(block[0], bool) or not isinstance(block[0], int) or block[0] < 1):
            raise ScenarioError(f"{where}.block_structure: {str(block)[:40]}: only square blocks [N, N] are modelled")
        return Scheme("fp8_block" if kind == "float" else f"int{bits}", bits, scale, "block", block[0])
    name = "fp8" if kind == "float" else f"int{bits}"
    if strategy == "tensor_group":
        raise ScenarioError(f"{where}.strategy: tensor_group: modelled for 4-bit float (NVFP4) weights only")
    return Scheme(name, bits, scale, strategy, w.get("group_size") or 0, zero_point_bits=zero)


def modelopt_scheme(algo: Any, group: Any, where: str) -> Scheme | None:
    """A ModelOpt quant_algo (None: unquantised)."""
    if algo in (None, "NONE", "none"):
        return None
    # (static activation scales: one fp32 input_scale per module beside the weight's own)
    if algo == "FP8":
        return Scheme("fp8", 8, 4.0, "tensor", global_scale_bytes=4.0)
    if algo == "FP8_PER_CHANNEL_PER_TOKEN":  # (dynamic per-token activations: no input scale)
        return Scheme("fp8", 8, 4.0, "channel")
    if algo in ("NVFP4", "W4A16_NVFP4", "W4A8_NVFP4_FP8"):
        g = 16 if group is None else group
        if isinstance(g, bool) or not isinstance(g, int) or g < 1:
            raise ScenarioError(f"{where}.group_size: {str(group)[:40]!r}: must be a positive integer")
        # weight_scale (FP8 per group), weight_scale_2 and input_scale (fp32 per module)
        return Scheme("nvfp4", 4, 1.0, "group", g, global_scale_bytes=8.0)
    raise ScenarioError(f"{where}.quant_algo: {str(algo)[:40]!r}: not modelled; servesim reads ModelOpt FP8, "
                        f"FP8_PER_CHANNEL_PER_TOKEN, NVFP4 (and W4A16_NVFP4), MIXED_PRECISION of those")


def schemes(cfg: dict, q: dict, path: str, modules: list[Module], dtype_bytes: int) -> tuple[list[Scheme], dict]:
    """Per module its Scheme, and notes: {"kv_cache": "fp8" when the checkpoint carries FP8
    KV-cache scales, "method": what was read}. ScenarioError naming the field for what is not
    modelled."""
    method = q.get("quant_method")
    notes: dict = {"method": method}
    read = _READERS.get(method) if isinstance(method, str) else None
    if read is None:
        raise ScenarioError(f"{path}: quantization_config.quant_method: {str(method)[:40]!r}: not modelled; servesim "
                            f"reads fp8, compressed-tensors, fbgemm_fp8, modelopt (hf_quant_config.json), awq and "
                            f"gptq (4 or 8 bits) and mxfp4 experts")
    return read(q, path, modules, dtype_bytes, notes), notes


def _compressed_tensors(q: dict, path: str, modules: list[Module], dtype_bytes: int, notes: dict) -> list[Scheme]:
    """compressed-tensors: config_groups (weights, targets), ignore, format, kv_cache_scheme."""
    plain = unquantised(dtype_bytes)
    where = f"{path}: quantization_config"
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ScenarioError(f"{where}.config_groups: must be a mapping of groups (weights, targets)")
    fmt = q.get("format")
    if fmt in ("sparse-24-bitmask", "marlin-24"):
        raise ScenarioError(f"{where}.format: {fmt!r}: 2:4 sparse weights are not modelled")
    ignore = _strings(q.get("ignore"), f"{where}.ignore")
    parsed = []
    for gname, g in groups.items():
        gw = f"{where}.config_groups.{gname}"
        if not isinstance(g, dict):
            raise ScenarioError(f"{gw}: must be a mapping (weights, targets)")
        if g.get("weights") is None:  # activations only: the weights stay
            continue
        targets = _strings(g.get("targets"), f"{gw}.targets") or ["Linear"]
        scheme = compressed_tensors_scheme(g["weights"], f"{gw}.weights", dtype_bytes)
        if fmt == "pack-quantized":  # (values packed in int32 words, with each weight's shape: 2 x int64)
            scheme = replace(scheme, global_scale_bytes=scheme.global_scale_bytes + 16)
        parsed.append((targets, scheme))
    kv = q.get("kv_cache_scheme")
    if isinstance(kv, dict) and kv.get("num_bits") == 8 and kv.get("type") == "float":
        notes["kv_cache"] = "fp8"

    def pick(mod: Module) -> Scheme:
        if any(_matches(mod.name, p) for p in ignore):
            return plain
        for targets, scheme in parsed:
            if any(t == "Linear" or _matches(mod.name, t) for t in targets):
                return scheme
        return plain
    return [pick(mod) for mod in modules]


def _fbgemm_fp8(q: dict, path: str, modules: list[Module], dtype_bytes: int, notes: dict) -> list[Scheme]:
    plain = unquantised(dtype_bytes)
    keep = _strings(q.get("modules_to_not_convert"), f"{path}: quantization_config.modules_to_not_convert")
    fp8 = Scheme("fp8", 8, 4.0, "channel")  # one fp32 scale per output row
    return [plain if any(_matches(mod.name, p) for p in keep) else fp8 for mod in modules]


def _modelopt(q: dict, path: str, modules: list[Module], dtype_bytes: int, notes: dict) -> list[Scheme]:
    """ModelOpt (hf_quant_config.json): one quant_algo, or MIXED_PRECISION per module; exclude_modules."""
    plain = unquantised(dtype_bytes)
    quant = q.get("quantization") or {}
    mw = f"{path}: hf_quant_config.json quantization"
    if quant.get("kv_cache_quant_algo") == "FP8":
        notes["kv_cache"] = "fp8"
    exclude = _strings(quant.get("exclude_modules"), f"{mw}.exclude_modules")
    algo = quant.get("quant_algo")
    if algo == "MIXED_PRECISION":
        layers = quant.get("quantized_layers")
        if not isinstance(layers, dict):
            raise ScenarioError(f"{mw}.quantized_layers: MIXED_PRECISION needs a mapping of module -> quant_algo")
        per: dict[str, Scheme | None] = {}
        for name, spec in layers.items():
            if not isinstance(spec, dict):
                raise ScenarioError(f"{mw}.quantized_layers.{name}: must be a mapping with quant_algo")
            per[_normal_name(name)] = modelopt_scheme(spec.get("quant_algo"), spec.get("group_size"),
                                                      f"{mw}.quantized_layers.{name}")
        return [per.get(mod.name) or plain for mod in modules]
    one = modelopt_scheme(algo, quant.get("group_size"), mw)
    if one is None:
        return [plain] * len(modules)
    return [plain if any(_matches(mod.name, p) or _matches(_normal_name(mod.name), _normal_name(p))
                         for p in exclude) else one for mod in modules]


def _fp8(q: dict, path: str, modules: list[Module], dtype_bytes: int, notes: dict) -> list[Scheme]:
    """vLLM's fp8: per tensor, or square blocks (weight_block_size); modules kept in 16 bits."""
    plain = unquantised(dtype_bytes)
    where = f"{path}: quantization_config"
    block = q.get("weight_block_size")
    if block is not None and (not isinstance(block, list) or len(block) != 2 or block[0] != block[1]
                              or isinstance(block[0], bool) or not isinstance(block[0], int) or block[0] < 1):
        raise ScenarioError(f"{where}.weight_block_size: {str(block)[:40]}: only square blocks [N, N] are modelled")
    fp8 = (Scheme("fp8", 8, 4.0, "tensor") if block is None
           else Scheme("fp8_block", 8, 4.0, "block", block[0]))
    keep = _strings(q.get("modules_to_not_convert") or q.get("ignored_layers"), f"{where}.ignored_layers")
    return [plain if any(_matches(mod.name, p) for p in keep) else fp8 for mod in modules]


def _awq_gptq(q: dict, path: str, modules: list[Module], dtype_bytes: int, notes: dict) -> list[Scheme]:
    """AWQ / GPTQ integer weights: bits, group_size (-1: per channel), zero points."""
    where = f"{path}: quantization_config"
    bits = _num(q, "bits", where, (4, 8))
    group = q.get("group_size", 128)
    if isinstance(group, bool) or not isinstance(group, int) or (group < 1 and group != -1):
        raise ScenarioError(f"{where}.group_size: {str(group)[:40]!r}: must be a positive integer or -1")
    asymmetric = q.get("zero_point", True) if q.get("quant_method") == "awq" else not q.get("sym", True)
    zero = bits if asymmetric else 0
    scheme = (Scheme(f"int{bits}", bits, 2.0, "channel", zero_point_bits=zero) if group == -1
              else Scheme(f"int{bits}", bits, 2.0, "group", group, zero_point_bits=zero))
    return [scheme] * len(modules)


# quant_method -> its reader: (quantization_config, path, modules, the model's dtype bytes, notes) ->
# each module's Scheme (a reader may add to notes)
_READERS = {"compressed-tensors": _compressed_tensors, "fbgemm_fp8": _fbgemm_fp8, "modelopt": _modelopt,
            "fp8": _fp8, "awq": _awq_gptq, "gptq": _awq_gptq}


def _normal_name(name: str) -> str:
    """A module name without a multimodal wrapper's prefix (model.language_model.layers.N ->
    model.layers.N), as vLLM maps it for a text-only run."""
    return name.replace("model.language_model.", "model.").replace("language_model.model.", "model.")


def quantised_fields(model, cfg: dict, q: dict, path: str) -> dict:
    """ModelSpec fields for a checkpoint quantised as `q` says: linear_weight_bytes,
    expert_weight_bytes, weight_block_size, quant_extra_bytes, quant_scheme (and kv_cache_scales
    when it carries FP8 KV-cache scales)."""
    modules = linear_modules(model, cfg.get("model_type"), cfg.get("layer_types"))
    per, notes = schemes(cfg, q, path, modules, model.dtype_bytes)
    per = [unquantised(model.dtype_bytes) if mod.router else s for mod, s in zip(modules, per)]
    exact = {"dense": 0.0, "expert": 0.0}
    count: dict[tuple[bool, str], int] = {}
    by_name: dict[str, Scheme] = {}
    for mod, s in zip(modules, per):
        kind = "expert" if mod.expert else "dense"
        exact[kind] += s.bytes_of(mod.out_features, mod.in_features)
        count[(mod.expert, s.name)] = count.get((mod.expert, s.name), 0) + mod.out_features * mod.in_features
        by_name[s.name] = s
    quantised = [k for k in count if k[1] != unquantised(model.dtype_bytes).name]
    if not quantised:
        raise ScenarioError(f"{path}: quantization_config: no linear module of the model is quantised "
                            f"(every one matches an ignore pattern, or no target names it)")

    def main(expert: bool) -> Scheme | None:
        mine = {name: n for (e, name), n in count.items() if e == expert}
        return by_name[max(mine, key=lambda k: mine[k])] if mine else None
    dense, experts = main(False), main(True)
    out: dict = {"quant_scheme": "+".join(sorted({name for _, name in quantised}))}
    lin_bytes = dense.value_bits / 8 if dense is not None else model.dtype_bytes
    plain = unquantised(model.dtype_bytes).name
    out["linear_weight_bytes"] = None if dense is None or dense.name == plain else lin_bytes
    if dense is not None and dense.per == "block":
        out["weight_block_size"] = dense.group
    if experts is not None and experts.value_bits / 8 != (out["linear_weight_bytes"] or model.dtype_bytes):
        out["expert_weight_bytes"] = experts.value_bits / 8
    routed = sum(mod.out_features * mod.in_features for mod in modules if mod.expert)
    approx = ((model.linear_params_total - routed) * (out["linear_weight_bytes"] or model.dtype_bytes)
              + routed * out.get("expert_weight_bytes", out["linear_weight_bytes"] or model.dtype_bytes))
    expert_bytes = out.get("expert_weight_bytes", out["linear_weight_bytes"] or model.dtype_bytes)
    out["expert_quant_extra_bytes"] = exact["expert"] - routed * expert_bytes
    out["quant_extra_bytes"] = exact["dense"] + exact["expert"] - approx - out["expert_quant_extra_bytes"]
    if notes.get("kv_cache"):  # (k_scale and v_scale, fp32, per attention layer)
        out["kv_cache_scales"] = notes["kv_cache"]
        out["quant_extra_bytes"] += 8 * model.attention_layers
    return out
