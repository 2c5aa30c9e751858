"""Triton kernels for attention over a paged KV cache, with plain-torch references.

Cache layout: ``[num_blocks, block_size, num_kv_heads, head_dim]`` for both K and V.

- ``write_kv``: scatter new K/V rows into their cache slots.
- ``paged_decode``: one query token per sequence (GQA-packed, optional split-KV).
- ``paged_prefill``: ragged causal query chunks over the cache (chunked prefill).

The same source runs compiled on a CUDA device and, on a machine without one, through Triton's CPU
interpreter. Triton decides which when a kernel is defined, so on a CPU-only machine this package
sets ``TRITON_INTERPRET=1`` (unless the caller chose already) before its kernel modules load.
"""

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

from .decode import choose_num_splits, paged_decode  # noqa: E402
from .kv_write import write_kv  # noqa: E402
from .prefill import paged_prefill  # noqa: E402

__all__ = ["write_kv", "paged_decode", "paged_prefill", "choose_num_splits"]
