"""RMSNorm as Llama/Qwen/Mistral define it (Zhang & Sennrich 2019).

The statistics are taken in float32 and the weight multiplies after the cast
back to the input dtype, exactly as Hugging Face's LlamaRMSNorm, so float32
runs match it bit for bit and half-precision runs round the same way.
"""
from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x if dtype == torch.float32 else x.float()      # no cast calls on the float32 path
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * (h if dtype == torch.float32 else h.to(dtype))
