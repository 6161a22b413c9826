"""What the Triton W8A16 and W4A16 matmuls share: input checks, tile sizes, interpreter flags.

Both kernels compute out[M, N] = x[M, K] @ W[N, K].T with W packed as engine/quant/formats.py
says, one program per (BLOCK_M x BLOCK_N) output tile walking K in tiles of BLOCK_K. BLOCK_K
divides the group size, so every K tile lies inside one group and its scale (and min) is one
number per output column: the tile's dot product runs on the exact integer values (int8 and
the 4-bit q are exact in fp16, bf16 and fp32) with fp32 accumulation, and the scale is applied
to the tile's partial sum, never rounded into the weight. A group size that is not a multiple
of MIN_BLOCK_K has no such tile; `matmul_fallback` dequantizes it in torch instead.

Interpreter note (as in engine/attention/triton_attention.py): triton 3.9's interpreter runs
tl.dot as a numpy matmul on the raw storage and keeps bfloat16 as uint16, so a bf16 tl.dot
multiplies bit patterns. Under the interpreter bf16 operands are widened to fp32 before tl.dot
(UPCAST_DOT), which is what a bf16 MMA with fp32 accumulation computes. Compiled kernels never
set it. The interpreter also truncates fp32 -> bf16 on store (a compiled kernel rounds).
"""
from __future__ import annotations

import torch

try:
    import triton  # (fail here, with the message below, when triton is missing)
    from triton.runtime.interpreter import InterpretedFunction
except ImportError as exc:  # pragma: no cover - exercised only where triton is absent
    raise ImportError("the Triton W8A16/W4A16 kernels need the `triton` package "
                      "(installed with torch on Linux x86_64 CUDA wheels)") from exc

from pagedkube.engine.quant.formats import QuantizedWeight, dequantize

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MIN_BLOCK_K = 16     # tl.dot's smallest inner dimension
MAX_BLOCK_K = 128    # 128 int8 columns x BLOCK_N 64 = one 8 KiB weight tile per K step
DECODE_BLOCK_N = 32  # M <= 16 reads the weights once: narrower tiles give more programs to spread them
PREFILL_BLOCK_N = 64


def block_k_for(group_size: int) -> int | None:
    """The largest power of two in [MIN_BLOCK_K, MAX_BLOCK_K] that divides the group size."""
    block = MAX_BLOCK_K
    while block >= MIN_BLOCK_K:
        if group_size % block == 0:
            return block
        block //= 2
    return None


def block_m_for(m: int) -> int:
    return 16 if m <= 16 else 32 if m <= 32 else 64


def check_inputs(name: str, kernel, x: torch.Tensor, w: QuantizedWeight) -> torch.Tensor:
    """x as the kernel reads it (contiguous rows), after every check a launch needs."""
    if x.dim() != 2:
        raise ValueError(f"{name}: x must be [M, K], got shape {list(x.shape)}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{name}: x dtype must be one of {SUPPORTED_DTYPES}, got {x.dtype}")
    n, k = w.shape
    if x.shape[1] != k:
        raise ValueError(f"{name}: x has {x.shape[1]} columns, the weight has K = {k}")
    tensors = [w.qweight, w.scales] + ([w.mins] if hasattr(w, "mins") else [])
    for t in tensors:
        if t.device != x.device:
            raise ValueError(f"{name}: x is on {x.device}, the weight on {t.device}")
        if t.stride(1) != 1:
            raise ValueError(f"{name}: the weight's tensors must be contiguous along K")
    if x.device.type != "cuda" and not isinstance(kernel, InterpretedFunction):
        raise ValueError(f"{name}: Triton kernels need CUDA tensors, got {x.device}; "
                         "on CPU set TRITON_INTERPRET=1 before importing triton, or use torch's kernels")
    return x if x.stride(1) == 1 else x.contiguous()


def dot_flags(kernel, dtype: torch.dtype) -> dict:
    upcast = dtype == torch.bfloat16 and isinstance(kernel, InterpretedFunction)
    return dict(UPCAST_DOT=upcast,
                DOT_PRECISION="ieee" if dtype == torch.float32 or upcast else "tf32")


def matmul_fallback(x: torch.Tensor, w: QuantizedWeight) -> torch.Tensor:
    """A group size with no K tile inside it (not a multiple of 16): dequantize, then matmul."""
    return (x.to(torch.float32) @ dequantize(w).T).to(x.dtype)


def launch(name: str, kernel, x: torch.Tensor, w: QuantizedWeight, weights: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Checks x, picks the tiles and runs `kernel(x, *weights, out, M, N, K, strides...)`: the
    launch both W8A16 and W4A16 share (weights: the tensors between x and out, qweight first).
    Groups no tile fits take the dequantize-then-matmul fallback."""
    x = check_inputs(name, kernel, x, w)
    block_k = block_k_for(w.group_size)
    if block_k is None:
        return matmul_fallback(x, w)
    m, k = x.shape
    n = w.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    block_m = block_m_for(m)
    block_n = DECODE_BLOCK_N if m <= 16 else PREFILL_BLOCK_N
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    kernel[grid](
        x, *weights, out, m, n, k,
        x.stride(0), w.qweight.stride(0), w.scales.stride(0), out.stride(0),
        GROUP=w.group_size, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        **dot_flags(kernel, x.dtype),
    )
    return out
