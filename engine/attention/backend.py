"""What the model's attention layers call: a backend module (torch_backend, triton_backend) or
an object with the same two functions (cpu_backend.CpuKernelBackend)."""
from __future__ import annotations

from typing import Protocol

import torch

from pagedkube.engine.attention.metadata import AttentionMetadata


class AttentionBackend(Protocol):
    def write_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None: ...

    def paged_attention(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        meta: AttentionMetadata, scale: float) -> torch.Tensor: ...
