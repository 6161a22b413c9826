"""QuantLinear: y = x W^T + b with W kept packed (engine/quant/formats.py), for every projection.

The layer is built empty (its bias, if any, is an ordinary parameter the loader fills)
and receives its weight once, through `set_weight`, which derives the kernel's layout
once at load and keeps only that:

    CPU  Int8, G = K (per channel)   torch._weight_int8pack_mm(x, q int8 [N, K], scales [N])
    CPU  Int4 (G in 32..256)         torch._weight_int4pack_mm_for_cpu(x, tinygemm pack, G, scale_zeros)
                                     tinygemm computes w = (q - 8) scale + zero, so zero = min + 8 scale
    CPU  Int8 grouped (GGUF Q8_0)    no torch kernel: dequantized to the activation dtype (dense)
    CUDA Int8 / Int4                 w8a16_matmul / w4a16_matmul (engine/quant/triton_w*a16.py);
                                     dense in the activation dtype while those are not installed
    a float tensor                   dense (F.linear), for projections a file keeps unpacked

torch's CPU kernels pay only with bf16/fp16 activations (fp32 activations run 5-10x
slower than a dense fp32 matmul; docs/benchmarks.md), so with fp32 activations the
layer casts x to bf16 around the kernel and the result back. That rounds x, the scales
and zeros and the output to bf16 (a third of the default model's greedy agreement with
the float32 reference): the default path runs engine/quant/q4_fused.py's exact kernels
instead, chosen by engine/quant/calibrate.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from pagedkube.engine.quant.formats import Int4Weight, Int8Weight, QuantizedWeight, dequantize, unpack_int4
from pagedkube.engine.quant.q4_fused import Q4DequantKernel, Q4FusedKernel, Q4Int16Kernel

# group sizes tinygemm's CPU int4 kernel accepts (aten/src/ATen/native/cpu/int4mm_kernel.cpp)
TINYGEMM_GROUP_SIZES = (32, 64, 128, 256)
# tinygemm's CPU packing needs N % 16 == 0 (_convert_weight_to_int4pack_cpu's check)
TINYGEMM_N_MULTIPLE = 16
# activation dtype torch's CPU kernels run in when the engine's is float32 (measured: docs/benchmarks.md)
CPU_KERNEL_DTYPE = torch.bfloat16
# decode20's Triton kernels: module, function
CUDA_KERNELS = {Int8Weight: ("pagedkube.engine.quant.triton_w8a16", "w8a16_matmul"),
                Int4Weight: ("pagedkube.engine.quant.triton_w4a16", "w4a16_matmul")}


@dataclass(frozen=True)
class DenseKernel:
    weight: torch.Tensor                         # [N, K], usually in the activation dtype
    name = "dense"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # a weight in another dtype (bf16 under float32 activations, engine/quant/calibrate.py)
        # computes in its own dtype; .to() of an equal dtype is a no-op
        return F.linear(x.to(self.weight.dtype), self.weight).to(x.dtype)


@dataclass(frozen=True)
class Int8PackKernel:
    qweight: torch.Tensor                        # int8 [N, K]
    scales: torch.Tensor                         # [N] in `dtype`
    dtype: torch.dtype
    name = "int8pack"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch._weight_int8pack_mm(x.to(self.dtype), self.qweight, self.scales).to(x.dtype)


@dataclass(frozen=True)
class Int4PackKernel:
    packed: torch.Tensor                         # tinygemm's CPU layout of q
    scale_zeros: torch.Tensor                    # [K / G, N, 2] (scale, zero) in `dtype`
    group_size: int
    dtype: torch.dtype
    name = "int4pack"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch._weight_int4pack_mm_for_cpu(x.to(self.dtype), self.packed, self.group_size,
                                                 self.scale_zeros).to(x.dtype)


@dataclass(frozen=True)
class SplitKernel:
    """Two kernels of one weight, chosen by measurement for decode-sized and prefill-sized
    batches (engine/quant/calibrate.py): up to `max_decode_rows` rows run `decode`."""
    decode: "Kernel"
    prefill: "Kernel"
    max_decode_rows: int
    name = "split"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (self.decode if x.shape[0] <= self.max_decode_rows else self.prefill)(x)


@dataclass(frozen=True)
class TritonKernel:
    weight: QuantizedWeight                      # on the GPU, as formats.py defines it
    fn: Callable[[torch.Tensor, QuantizedWeight], torch.Tensor]
    name = "triton"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x, self.weight)


Kernel = (DenseKernel | Int8PackKernel | Int4PackKernel | SplitKernel | TritonKernel | Q4FusedKernel | Q4Int16Kernel
          | Q4DequantKernel)


def cpu_kernel_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype in (torch.bfloat16, torch.float16) else CPU_KERNEL_DTYPE


def _cuda_kernel_fn(w: QuantizedWeight):
    module, name = CUDA_KERNELS[type(w)]
    try:
        return getattr(import_module(module), name)
    except ImportError:          # decode20's kernels not installed yet: dense
        return None


def make_kernel(w: torch.Tensor | QuantizedWeight, dtype: torch.dtype, device: torch.device) -> Kernel:
    """The layout this weight runs as on `device` with activations in `dtype`."""
    if isinstance(w, torch.Tensor):
        return DenseKernel(w.to(device=device, dtype=dtype).contiguous())
    if device.type == "cuda":
        fn = _cuda_kernel_fn(w)
        if fn is not None:
            moved = (Int8Weight(w.qweight.to(device), w.scales.to(device), w.group_size) if isinstance(w, Int8Weight)
                     else Int4Weight(w.qweight.to(device), w.scales.to(device), w.mins.to(device), w.group_size))
            return TritonKernel(moved, fn)
        return DenseKernel(dequantize(w).to(device=device, dtype=dtype))
    if device.type != "cpu":
        return DenseKernel(dequantize(w).to(device=device, dtype=dtype))
    kdtype = cpu_kernel_dtype(dtype)
    n, k = w.shape
    if isinstance(w, Int8Weight):
        if w.group_size != k:                    # grouped (Q8_0): no torch kernel
            return DenseKernel(dequantize(w).to(dtype))
        return Int8PackKernel(w.qweight.contiguous(), w.scales.view(n).to(kdtype), kdtype)
    if not tinygemm_fits(w):
        return DenseKernel(dequantize(w).to(dtype))
    return int4pack_kernel(w, kdtype)


def tinygemm_fits(w: Int4Weight) -> bool:
    """Whether torch's CPU int4 kernel takes this weight's group size and row count."""
    return w.group_size in TINYGEMM_GROUP_SIZES and w.shape[0] % TINYGEMM_N_MULTIPLE == 0


def int4pack_kernel(w: Int4Weight, kdtype: torch.dtype) -> Int4PackKernel:
    """tinygemm's CPU layout of w, run with activations (and scales) in kdtype."""
    q = unpack_int4(w.qweight).to(torch.int32)
    packed = torch._convert_weight_to_int4pack_for_cpu(q, 1)   # innerKTiles: unused on CPU
    zeros = w.mins + 8 * w.scales
    scale_zeros = torch.stack((w.scales, zeros), dim=-1).transpose(0, 1).contiguous().to(kdtype)
    return Int4PackKernel(packed, scale_zeros, w.group_size, kdtype)


class QuantLinear(nn.Module):
    """nn.Linear's interface (in_features, out_features, bias) with a packed weight."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.kernel: Kernel | None = None
        self.source = "unset"                    # "Q4_1", "int8", "float", ...: what the weight came as

    def set_weight(self, w: torch.Tensor | QuantizedWeight, dtype: torch.dtype, device: torch.device,
                   source: str, kernel: Kernel | None = None) -> None:
        """kernel: one already built for w (a measured choice); else make_kernel's."""
        shape = tuple(w.shape)
        if shape != (self.out_features, self.in_features):
            raise ValueError(f"weight of shape {shape} for a linear layer of "
                             f"{(self.out_features, self.in_features)}")
        self.kernel = kernel if kernel is not None else make_kernel(w, dtype, device)
        self.source = source

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.kernel is not None, "QuantLinear used before set_weight"
        # the decoder's activations are [T, hidden] already: no reshape calls then
        y = self.kernel(x) if x.dim() == 2 else \
            self.kernel(x.reshape(-1, self.in_features)).view(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        kernel = self.kernel.name if self.kernel is not None else "unset"
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, weight={self.source}, kernel={kernel}")
