"""How many KV-cache blocks fit on one GPU, computed the way vLLM's memory profiling does.

CONTRACT (owned by the cost-model engineer):
    MemoryBudget dataclass below (all byte counts are per GPU, i.e. per tensor-parallel rank).
    kv_budget(model, hardware, *, tensor_parallel_size, gpu_memory_utilization, block_size,
              max_num_batched_tokens=8192, num_gpu_blocks=None, where="") -> MemoryBudget

vLLM: usable = gpu_memory_utilization x total; KV cache = usable - weights - peak activations
- non-torch memory (NCCL buffers, cuBLAS workspace, CUDA graph pool); blocks = floor(KV / block).
We cannot profile, so the last two are a documented estimate (see `activation_reserve_bytes`).
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from sim.config.errors import ScenarioError
from sim.presets.hardware import HardwareSpec
from sim.presets.models import KVLayout, ModelSpec

# Non-torch memory that scales with nothing we model: NCCL/cuBLAS workspaces, CUDA graph pool,
# allocator fragmentation. vLLM logs for 7-8B models report 0.1-1.5 GiB here. Bytes.
FIXED_RESERVE_BYTES = 1 << 30
# Activation values alive at the peak of one forward pass, per batched token and per rank:
# MLP gate+up output and their SiLU product (3 x intermediate / tp) plus the residual, normed
# input and q/k/v/attention output (~4 x hidden). In units of dtype elements.
ACTIVATION_HIDDEN_COPIES = 4
ACTIVATION_INTERMEDIATE_COPIES = 3


@dataclass(frozen=True)
class MemoryBudget:
    total_bytes: float              # GPU memory (hardware.memory_bytes)
    usable_bytes: float             # gpu_memory_utilization x total_bytes
    weight_bytes_per_gpu: float     # model.weight_bytes / tensor_parallel_size
    activation_reserve_bytes: float # fixed reserve + peak activations (max_num_batched_tokens)
    kv_cache_bytes: float           # bytes the KV blocks occupy: num_gpu_blocks x block_bytes
    kv_bytes_per_token: int         # K+V bytes one token takes on this GPU (all layers)
    block_bytes: int                # block_size tokens of K+V for layout.group_layers layers
    num_gpu_blocks: int             # KV blocks per GPU (the override, when one was given)
    block_size: int                 # tokens per block
    tensor_parallel_size: int = 1
    # vLLM's KV-cache groups (sliding-window models): a request holds blocks in each group.
    # None: one group of every layer (full attention), block_bytes = block_size x kv_bytes_per_token
    layout: KVLayout | None = None

    def blocks_per_seq(self, seq_len: int) -> int:
        """Blocks a sequence of seq_len tokens holds (whole blocks; with a sliding window, in every
        layer group, the windowed ones only the blocks its window touches)."""
        if self.layout is None:
            return math.ceil(seq_len / self.block_size)
        return self.layout.held(seq_len, self.block_size)

    def max_concurrent_seqs(self, seq_len: int) -> int:
        """How many sequences of seq_len tokens fit at once."""
        if isinstance(seq_len, bool) or not isinstance(seq_len, numbers.Integral) or seq_len < 1:
            raise ScenarioError(f"seq_len: {seq_len!r} is not a whole number of tokens >= 1")
        return self.num_gpu_blocks // max(1, self.blocks_per_seq(seq_len))

    @property
    def max_tokens(self) -> int:
        """KV capacity in tokens (each token held by every group: sequences shorter than the window)."""
        groups = 1 if self.layout is None else self.layout.groups
        return self.num_gpu_blocks * self.block_size // groups


def _fail(where: str, msg: str) -> ScenarioError:
    return ScenarioError(f"{where}: {msg}" if where else msg)


def kv_heads_per_rank(model: ModelSpec, tensor_parallel_size: int) -> int:
    """vLLM splits KV heads across ranks and replicates them when tp > num_kv_heads."""
    return max(1, model.num_kv_heads // tensor_parallel_size)


KV_CACHE_DTYPES = {"auto": None, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}  # vLLM's --kv-cache-dtype


def kv_bytes_per_token_per_rank(model: ModelSpec, tensor_parallel_size: int,
                                kv_cache_dtype: str = "auto") -> int:
    """KV bytes of one token on one GPU. GQA: K and V of the KV heads on that rank. MLA: the whole
    latent + rope key, which vLLM keeps on every rank (it is not split by heads)."""
    elem = KV_CACHE_DTYPES[kv_cache_dtype] or model.dtype_bytes
    if model.mla is not None:
        return model.kv_elements_per_token * elem
    heads = kv_heads_per_rank(model, tensor_parallel_size)
    return 2 * model.attention_layers * heads * model.head_dim * elem


def linear_state_bytes(model: ModelSpec, tensor_parallel_size: int) -> int:
    """One linear-attention layer's state for one sequence on one GPU, bytes (vLLM's
    gated_delta_net_state_shape, split by TP): the conv state, conv_kernel - 1 inputs of q, k and v
    at the model's dtype, and the recurrent state, value heads x value_head_dim x key_head_dim at
    the state's dtype. Qwen3-Next at TP1: 3 x 8,192 x 2 + 32 x 128 x 128 x 2 = 1,097,728 B."""
    lin = model.linear_attention
    assert lin is not None  # (asked of hybrid models only)
    tp = tensor_parallel_size
    conv = (lin.conv_kernel - 1) * (lin.conv_dim // tp) * model.dtype_bytes
    temporal = lin.num_value_heads // tp * lin.value_head_dim * lin.key_head_dim
    return conv + temporal * (lin.state_dtype_bytes or model.dtype_bytes)


# Blackwell GPUs (compute capability 10.0) run FlashInfer, which has no 16-token blocks at head_dim
# 256: vLLM aligns a hybrid's attention block to 32 tokens there (HybridAttentionMambaModelConfig)
_ALIGN_32_AT_HEAD_256 = ("b200", "gb200")


def hybrid_block_size(model: ModelSpec, hardware: HardwareSpec, tensor_parallel_size: int,
                      kv_cache_dtype: str = "auto", block_size: int = 16) -> int:
    """The attention block size vLLM runs a hybrid model at (`block_size` for any other model): one
    block of an attention layer must hold at least one linear-attention layer's state, so vLLM
    raises a smaller block to the least multiple of 16 tokens (32 on Blackwell at head_dim 256)
    whose K and V reach the state's bytes, and pads the state to that page (its
    HybridAttentionMambaModelConfig without prefix caching). Qwen3-Next at TP1, bf16 KV: 2 KV heads
    x 256 x 2 x 2 B = 2,048 B a token, 1,097,728 / 2,048 = 536 -> 544 tokens."""
    if model.linear_attention is None:
        return block_size
    per_token = kv_bytes_per_token_per_rank(model, tensor_parallel_size, kv_cache_dtype) // model.attention_layers
    align = 32 if hardware.name in _ALIGN_32_AT_HEAD_256 and model.head_dim == 256 else 16
    need = align * -(-linear_state_bytes(model, tensor_parallel_size) // (align * per_token))
    return max(block_size, need)


def weights_per_gpu(model: ModelSpec, tp: int, expert_parallel: bool = False, data_parallel: int = 1) -> float:
    """Weight bytes on one GPU. Tensor parallelism splits every matrix evenly: total / tp. With
    expert parallelism (vLLM's --enable-expert-parallel) each routed expert sits whole on one GPU
    of the expert-parallel group, tp x `data_parallel` GPUs (vLLM's --data-parallel-size: each DP
    rank keeps its own copy of everything else), so the busiest GPU holds ceil(experts / group) of
    them; everything else is still split by tp."""
    if not expert_parallel or model.moe is None:
        return model.weight_bytes / tp
    routed = model.routed_expert_bytes
    return (model.weight_bytes - routed) / tp + routed_expert_bytes_per_gpu(model, tp, True, data_parallel)


def routed_expert_bytes_per_gpu(model: ModelSpec, tp: int, expert_parallel: bool = False,
                                data_parallel: int = 1) -> float:
    """The routed experts' bytes on one GPU (weights_per_gpu's share of them): split by tp, or with
    expert parallelism ceil(experts / (tp x data_parallel)) whole ones (0 for a dense model)."""
    m = model.moe
    if m is None:
        return 0.0
    routed = model.routed_expert_bytes
    if not expert_parallel:
        return routed / tp
    return -(-m.num_experts // (tp * data_parallel)) * (routed / m.num_experts)


def lora_dims(model: ModelSpec) -> int:
    """sum(in + out) over one layer's projections a LoRA adapter covers: q, k, v, o, gate, up, down."""
    h, q, kv, i = model.hidden_size, model.q_dim, model.kv_dim, model.intermediate_size
    return (h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h)


def lora_adapter_bytes(model: ModelSpec, rank: int) -> int:
    """Bytes of one LoRA adapter of `rank` on every layer (A: in x r, B: r x out), at the model's dtype."""
    return rank * lora_dims(model) * model.num_layers * model.dtype_bytes


def lora_slot_bytes(model: ModelSpec, lora, tensor_parallel_size: int) -> float:
    """GPU bytes vLLM sets aside for its adapter slots (engine.lora, a LoRAConfig): max_loras
    adapters at max_lora_rank, split by tensor parallelism; 0 without LoRA (None)."""
    if lora is None:
        return 0.0
    return lora.max_loras * lora_adapter_bytes(model, lora.max_lora_rank) / tensor_parallel_size


def activation_reserve_bytes(model: ModelSpec, tensor_parallel_size: int,
                             max_num_batched_tokens: int) -> int:
    """Fixed non-torch reserve + peak activations of a max_num_batched_tokens forward pass."""
    per_token = (ACTIVATION_HIDDEN_COPIES * model.hidden_size
                 + ACTIVATION_INTERMEDIATE_COPIES * model.intermediate_size // tensor_parallel_size)
    return FIXED_RESERVE_BYTES + max_num_batched_tokens * per_token * model.dtype_bytes


def _check_args(model, tp, util, block_size, max_tokens, override, where) -> None:
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1 or model.num_attention_heads % tp:
        raise _fail(where, f"tensor_parallel_size must divide num_attention_heads "
                           f"({model.num_attention_heads}) of {model.name}, got {tp!r}")
    if isinstance(util, bool) or not isinstance(util, (int, float)) or not 0 < util <= 1:
        raise _fail(where, f"gpu_memory_utilization must be in (0, 1], got {util!r}")
    for key, value in (("block_size", block_size), ("max_num_batched_tokens", max_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _fail(where, f"{key} must be a positive integer, got {value!r}")
    if override is not None and (isinstance(override, bool) or not isinstance(override, int)
                                 or override < 1):
        raise _fail(where, f"num_gpu_blocks must be a positive integer, got {override!r}")
    lin = model.linear_attention
    if lin is not None and (lin.num_key_heads % tp or lin.num_value_heads % tp):
        raise _fail(where, f"tensor_parallel_size {tp} does not divide {model.name}'s linear-attention "
                           f"heads ({lin.num_key_heads} key, {lin.num_value_heads} value)")


def kv_budget(model: ModelSpec, hardware: HardwareSpec, *, tensor_parallel_size: int,
              gpu_memory_utilization: float, block_size: int, max_num_batched_tokens: int = 8192,
              num_gpu_blocks: int | None = None, where: str = "",
              kv_cache_dtype: str = "auto", enable_expert_parallel: bool = False,
              data_parallel_size: int = 1, reserved_bytes: float = 0.0) -> MemoryBudget:
    """KV blocks per GPU. Raises ScenarioError when the weights (or weights + reserve) leave no
    room; a `num_gpu_blocks` override is trusted as given (like vLLM's
    num_gpu_blocks_override) but the weights must still fit."""
    tp = tensor_parallel_size
    _check_args(model, tp, gpu_memory_utilization, block_size, max_num_batched_tokens,
                num_gpu_blocks, where)
    usable = gpu_memory_utilization * hardware.memory_bytes
    weights = weights_per_gpu(model, tp, enable_expert_parallel, data_parallel_size)
    if weights >= usable:
        raise _fail(where, f"{model.name} needs {weights / 1e9:.1f} GB of weights per GPU at "
                           f"tensor_parallel_size={tp} but {hardware.name} has "
                           f"{usable / 1e9:.1f} GB usable (gpu_memory_utilization "
                           f"{gpu_memory_utilization}); raise tensor_parallel_size"
                           + (" or data_parallel_size" if enable_expert_parallel and model.moe else "")
                           + " or use a bigger GPU")
    # (reserved_bytes: held beside the weights, e.g. LoRA adapter slots: lora_slot_bytes)
    activations = activation_reserve_bytes(model, tp, max_num_batched_tokens)
    reserve = activations + reserved_bytes
    per_token = kv_bytes_per_token_per_rank(model, tp, kv_cache_dtype)
    layout = model.kv_layout if model.sliding_layers or model.linear_attention else None
    # one block: block_size tokens of one group's layers (all layers, without a sliding window or
    # linear attention); a linear-attention group's block is one state, padded to the same bytes
    block_bytes = block_size * (per_token if layout is None
                                else per_token // model.attention_layers * layout.group_layers)
    if model.linear_attention is not None:
        need = hybrid_block_size(model, hardware, tp, kv_cache_dtype, 1)
        if block_size < need:
            raise _fail(where, f"block_size {block_size} is too small for {model.name}: a block of K and V "
                               f"must hold one linear-attention state ({linear_state_bytes(model, tp):,} "
                               f"bytes per GPU); vLLM raises it to {need}")
    blocks = num_gpu_blocks
    if blocks is None:
        blocks = int((usable - weights - reserve) // block_bytes)
        if blocks < 1:
            slots = f" - {reserved_bytes / 1e9:,.1f} GB LoRA adapter slots (engine.lora)" if reserved_bytes else ""
            raise _fail(where, f"{model.name} at tensor_parallel_size={tp} leaves no room for "
                               f"the KV cache on {hardware.name}: {usable / 1e9:.1f} GB usable - "
                               f"{weights / 1e9:.1f} GB weights - {activations / 1e9:.1f} GB "
                               f"activation reserve (max_num_batched_tokens "
                               f"{max_num_batched_tokens}){slots} < one {block_bytes}-byte block; raise "
                               f"tensor_parallel_size or gpu_memory_utilization, or lower "
                               f"max_num_batched_tokens" + (" or engine.lora's max_loras / max_lora_rank"
                                                            if reserved_bytes else ""))
    return MemoryBudget(
        total_bytes=hardware.memory_bytes, usable_bytes=usable, weight_bytes_per_gpu=weights,
        activation_reserve_bytes=reserve, kv_cache_bytes=blocks * block_bytes,
        kv_bytes_per_token=per_token, block_bytes=block_bytes, num_gpu_blocks=blocks,
        block_size=block_size, tensor_parallel_size=tp, layout=layout,
    )
