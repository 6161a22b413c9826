"""Triton W8A16: out = x @ W.T with W an Int8Weight (int8 values, fp32 scale per group).

Tiling and exactness: engine/quant/triton_common.py. Per K tile (inside one group g):

    acc[m, n] += scales[n, g] * sum_k x[m, k] * q[n, k]        (dot on exact int8 values)
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from pagedkube.engine.quant import triton_common as common
from pagedkube.engine.quant.formats import Int8Weight


@triton.jit
def _w8a16_kernel(
    x_ptr, q_ptr, s_ptr, out_ptr,
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
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * stride_xm
    q_cols = q_ptr + rn.to(tl.int64)[None, :] * stride_qn     # the weight tile is read as [BLOCK_K, BLOCK_N]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):                          # BLOCK_K divides GROUP divides K: no K mask
        x = tl.load(x_rows + (k0 + rk)[None, :], mask=m_ok[:, None], other=0.0)
        q = tl.load(q_cols + (k0 + rk)[:, None], mask=n_ok[None, :], other=0)
        s = tl.load(s_ptr + rn * stride_sn + k0 // GROUP, mask=n_ok, other=0.0)
        if UPCAST_DOT:  # interpreter only, see triton_common
            x = x.to(tl.float32)
        w = q.to(x.dtype)
        acc += tl.dot(x, w, input_precision=DOT_PRECISION) * s[None, :]
    out = out_ptr + rm.to(tl.int64)[:, None] * stride_om + rn[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def w8a16_matmul(x: torch.Tensor, w: Int8Weight) -> torch.Tensor:
    """x [M, K] fp16/bf16/fp32 on CUDA (or under TRITON_INTERPRET=1) -> [M, N] in x's dtype."""
    if not isinstance(w, Int8Weight):
        raise ValueError(f"w8a16_matmul: expected an Int8Weight, got {type(w).__name__}")
    return common.launch("w8a16_matmul", _w8a16_kernel, x, w, (w.qweight, w.scales))
