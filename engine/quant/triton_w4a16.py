"""Triton W4A16: out = x @ W.T with W an Int4Weight (4-bit q, fp32 scale and min per group).

Tiling and exactness: engine/quant/triton_common.py. Per K tile (inside one group g):

    acc[m, n] += scales[n, g] * sum_k x[m, k] * q[n, k]  +  mins[n, g] * sum_k x[m, k]

which is sum_k x[m, k] * (q[n, k] * scales[n, g] + mins[n, g]) with the dot on exact 4-bit
values. Column k of the tile is nibble k % 2 of byte k // 2 (low nibble first, formats.py);
each byte is loaded for both of its columns (the second load hits the cache).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedkube.engine.quant import triton_common as common
from pagedkube.engine.quant.formats import Int4Weight


@triton.jit
def _w4a16_kernel(
    x_ptr, q_ptr, s_ptr, mins_ptr, out_ptr,
    M, N, K,
    stride_xm, stride_qn, stride_sn, stride_om,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    UPCAST_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    shift = ((rk % 2) * 4)[:, None]
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * stride_xm
    q_cols = q_ptr + rn.to(tl.int64)[None, :] * stride_qn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):                          # BLOCK_K divides GROUP divides K: no K mask
        x = tl.load(x_rows + (k0 + rk)[None, :], mask=m_ok[:, None], other=0.0)
        packed = tl.load(q_cols + ((k0 + rk) // 2)[:, None], mask=n_ok[None, :], other=0)
        q = (packed.to(tl.int32) >> shift) & 0xF
        g = k0 // GROUP
        s = tl.load(s_ptr + rn * stride_sn + g, mask=n_ok, other=0.0)
        mn = tl.load(mins_ptr + rn * stride_sn + g, mask=n_ok, other=0.0)
        if UPCAST_DOT:  # interpreter only, see triton_common
            x = x.to(tl.float32)
        x_sum = tl.sum(x.to(tl.float32), axis=1)
        acc += tl.dot(x, q.to(x.dtype), input_precision=DOT_PRECISION) * s[None, :] + x_sum[:, None] * mn[None, :]
    out = out_ptr + rm.to(tl.int64)[:, None] * stride_om + rn[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def w4a16_matmul(x: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """x [M, K] fp16/bf16/fp32 on CUDA (or under TRITON_INTERPRET=1) -> [M, N] in x's dtype."""
    if not isinstance(w, Int4Weight):
        raise ValueError(f"w4a16_matmul: expected an Int4Weight, got {type(w).__name__}")
    if w.scales.stride() != w.mins.stride():
        raise ValueError("w4a16_matmul: scales and mins must have the same strides")
    return common.launch("w4a16_matmul", _w4a16_kernel, x, w, (w.qweight, w.scales, w.mins))
