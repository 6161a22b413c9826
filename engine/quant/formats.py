"""The two packed weight formats every quantized path shares.

A linear layer's weight W is [N out, K in], as in torch. Both formats are
groups of `group_size` consecutive input columns, each group with its own scale:

    Int8Weight:  W[n, k] = qweight[n, k] * scales[n, k // G]                  q in [-128, 127]
    Int4Weight:  W[n, k] = q[n, k] * scales[n, k // G] + mins[n, k // G]      q in [0, 15]

Int4 stores two values per byte, in input order: byte qweight[n, j] holds q[n, 2j]
in its low nibble and q[n, 2j + 1] in its high nibble. One scale per output
channel is the case G = K.

These are the numbers a GGUF file carries, without rounding (scales and mins are
float32, which holds every fp16 product the GGUF types use exactly):

    Q8_0  (32 values, fp16 d)                    -> Int8, G 32, scale d
    Q4_0  (32 values, fp16 d, W = d (q - 8))      -> Int4, G 32, scale d, min -8 d
    Q4_1  (32 values, fp16 d and m, W = d q + m)  -> Int4, G 32, scale d, min m
    Q4_K  (256 = 8 x 32, 6-bit sc and m per 32)   -> Int4, G 32, scale d sc, min -dmin m

Kernels (torch's CPU int8/int4 matmuls, our Triton W8A16/W4A16 kernels) take these
tensors, or a layout derived from them once at load; `dequantize` is the reference
every kernel is tested against.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


def _check_groups(name: str, qweight: torch.Tensor, k: int, scales: torch.Tensor, group_size: int) -> None:
    n = qweight.shape[0]
    if group_size <= 0 or k % group_size:
        raise ValueError(f"{name}: group_size {group_size} must divide the input size {k}")
    if scales.dtype != torch.float32 or tuple(scales.shape) != (n, k // group_size):
        raise ValueError(f"{name}: scales must be float32 [{n}, {k // group_size}], "
                         f"got {scales.dtype} {list(scales.shape)}")


@dataclass(frozen=True)
class Int8Weight:
    qweight: torch.Tensor   # int8 [N, K]
    scales: torch.Tensor    # float32 [N, K // group_size]
    group_size: int

    def __post_init__(self):
        if self.qweight.dtype != torch.int8 or self.qweight.dim() != 2:
            raise ValueError(f"Int8Weight: qweight must be int8 [N, K], got {self.qweight.dtype} "
                             f"{list(self.qweight.shape)}")
        _check_groups("Int8Weight", self.qweight, self.qweight.shape[1], self.scales, self.group_size)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.qweight.shape[0], self.qweight.shape[1])


@dataclass(frozen=True)
class Int4Weight:
    qweight: torch.Tensor   # uint8 [N, K // 2], two values per byte (low nibble first)
    scales: torch.Tensor    # float32 [N, K // group_size]
    mins: torch.Tensor      # float32 [N, K // group_size]
    group_size: int

    def __post_init__(self):
        if self.qweight.dtype != torch.uint8 or self.qweight.dim() != 2:
            raise ValueError(f"Int4Weight: qweight must be uint8 [N, K / 2], got {self.qweight.dtype} "
                             f"{list(self.qweight.shape)}")
        k = 2 * self.qweight.shape[1]
        _check_groups("Int4Weight", self.qweight, k, self.scales, self.group_size)
        if self.mins.dtype != torch.float32 or self.mins.shape != self.scales.shape:
            raise ValueError(f"Int4Weight: mins must be float32 {list(self.scales.shape)}, "
                             f"got {self.mins.dtype} {list(self.mins.shape)}")

    @property
    def shape(self) -> tuple[int, int]:
        return (self.qweight.shape[0], 2 * self.qweight.shape[1])


QuantizedWeight = Int8Weight | Int4Weight


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K] values in [0, 15] -> uint8 [N, K // 2], low nibble first."""
    if q.dtype != torch.uint8 or q.dim() != 2 or q.shape[1] % 2:
        raise ValueError(f"pack_int4: expected uint8 [N, even K], got {q.dtype} {list(q.shape)}")
    if q.numel() and int(q.max()) > 15:
        raise ValueError("pack_int4: values must be in [0, 15]")
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_int4(qweight: torch.Tensor) -> torch.Tensor:
    """uint8 [N, K // 2] -> uint8 [N, K] values in [0, 15]."""
    return torch.stack((qweight & 0x0F, qweight >> 4), dim=-1).reshape(qweight.shape[0], -1)


def dequantize(w: QuantizedWeight) -> torch.Tensor:
    """The reference: float32 [N, K], computed as the formulas above say."""
    n, k = w.shape
    groups = k // w.group_size
    if isinstance(w, Int8Weight):
        q = w.qweight.to(torch.float32).view(n, groups, w.group_size)
        return (q * w.scales.unsqueeze(-1)).view(n, k)
    q = unpack_int4(w.qweight).to(torch.float32).view(n, groups, w.group_size)
    return (q * w.scales.unsqueeze(-1) + w.mins.unsqueeze(-1)).view(n, k)
