"""The CPU backend: torch_backend with its decode rows computed by our C++ kernel.

torch_backend's decode pass gathers each decoding sequence's context from the pool into a
float32 copy (every layer, every step) and runs torch's scaled_dot_product_attention on it
under a mask. engine/attention/cpu_attention.cpp instead reads the cache through the block
table where it lies, converting a float16 or bfloat16 cache in registers, and stops at each
sequence's length: 3.5-4.7x less time per layer at 256-2,048 tokens of context, float32
arithmetic throughout (docs/benchmarks.md "Decode attention from the paged cache"). The cache
writes are the library's too (store_kv: one operator call a layer, where torch_backend's is a
Python operator around two index_copy_ calls under torch.compile); prefill chunks stay
torch_backend's.

Chosen by the runner (runner_setup.select_backend) on CPU with --attention-backend auto where
our kernels are loaded (the GGUF default path: engine/quant/q4_fused.py builds both) for a
float32 query and a head size that is a multiple of 8; otherwise torch_backend serves.
"""
from __future__ import annotations

import torch

from pagedkube.engine.attention import torch_backend
from pagedkube.engine.attention.metadata import AttentionMetadata
from pagedkube.engine.attention.torch_backend import DecodePlan
from pagedkube.engine.quant.q4_fused import Q4Ops


class CpuKernelBackend:
    """The backend interface (write_kv, paged_attention) over one process's built kernels."""

    def __init__(self, ops: Q4Ops):
        self.ops = ops

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        self.ops.store_kv(key, value, k_cache, v_cache, slot_mapping)

    def paged_attention(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        meta: AttentionMetadata, scale: float) -> torch.Tensor:
        return torch_backend.paged_attention(query, k_cache, v_cache, meta, scale, decode=self._decode)

    def _decode(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: DecodePlan,
                scale: float) -> torch.Tensor:
        if query.dtype != torch.float32 or query.shape[-1] % 8:    # the kernel's 8-wide rows
            return torch_backend.torch_decode(query, k_cache, v_cache, plan, scale)
        tables = plan.tables.view(query.shape[0], -1)
        return self.ops.decode_attention(query.contiguous(), k_cache, v_cache, tables, plan.seq_lens, scale)
