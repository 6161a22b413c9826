"""Triton: the batched LoRA delta of punica.py, one token per program row, as Punica's BGMV
(each token reads its own slot's weights; tokens of the base model, slot -1, return at once).

    shrink   program (t, n):  v[t, n*BN : (n+1)*BN] = lora_a[slot_t, rows, :] @ x[t, :]
    expand   program (t, n):  y[t, off + n*BN : ...] += (lora_b[slot_t, rows, :R] @ v[t, c : c+R]) * scale[slot_t]

A step on CUDA is mostly decodes: T small, one row each, so the per-token form wastes
nothing; a long prefill re-reads its adapter's weights once per token, which L2 absorbs at
these sizes (R <= 64). Torch reference: punica.lora_delta_reference; the test runs both
under TRITON_INTERPRET=1 on CPU and compiled on CUDA.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

BLOCK_N = 32
BLOCK_K = 64


@triton.jit
def _shrink_kernel(x_ptr, a_ptr, slots_ptr, v_ptr, K, NR, stride_x, stride_as, stride_an, stride_v,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    if slot < 0:
        return
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        xk = tl.load(x_ptr + t * stride_x + k, mask=k < K, other=0.0).to(tl.float32)
        a = tl.load(a_ptr + slot * stride_as + n[:, None] * stride_an + k[None, :],
                    mask=(n[:, None] < NR) & (k[None, :] < K), other=0.0).to(tl.float32)
        acc += tl.sum(a * xk[None, :], axis=1)
    tl.store(v_ptr + t * stride_v + n, acc, mask=n < NR)


@triton.jit
def _expand_kernel(v_ptr, b_ptr, slots_ptr, scales_ptr, y_ptr, N, R, v_col, y_col, slice_index, num_slices,
                   stride_v, stride_bs, stride_bn, stride_y, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(slots_ptr + t).to(tl.int64)
    if slot < 0:
        return
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    r = tl.arange(0, BLOCK_R)
    v = tl.load(v_ptr + t * stride_v + v_col + r, mask=r < R, other=0.0)
    b = tl.load(b_ptr + slot * stride_bs + n[:, None] * stride_bn + r[None, :],
                mask=(n[:, None] < N) & (r[None, :] < R), other=0.0).to(tl.float32)
    scale = tl.load(scales_ptr + slot * num_slices + slice_index)
    delta = tl.sum(b * v[None, :], axis=1) * scale
    out = y_ptr + t * stride_y + y_col + n
    y = tl.load(out, mask=n < N, other=0.0)
    tl.store(out, (y.to(tl.float32) + delta).to(y.dtype), mask=n < N)


def add_lora_triton(y: torch.Tensor, x: torch.Tensor, token_slots: torch.Tensor, lora_a: torch.Tensor,
                    lora_b: list[torch.Tensor], scales: torch.Tensor, offsets: list[int], max_rank: int) -> None:
    """y += the delta of every token under its slot, in place (shapes as punica.py's)."""
    if x.device.type != "cuda" and not isinstance(_shrink_kernel, InterpretedFunction):
        raise ValueError("the Triton LoRA kernels need CUDA tensors; on CPU set TRITON_INTERPRET=1 "
                         "before importing triton, or use punica.add_lora_grouped")
    T, K = x.shape
    S, NR, K_a = lora_a.shape
    if K_a != K or NR != len(lora_b) * max_rank:
        raise ValueError(f"lora_a {tuple(lora_a.shape)} does not fit x {tuple(x.shape)} and "
                         f"{len(lora_b)} slices of rank {max_rank}")
    if token_slots.shape != (T,) or token_slots.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"token_slots must be int32/int64 of shape ({T},), got {token_slots.dtype} "
                         f"{tuple(token_slots.shape)}")
    if scales.shape != (S, len(lora_b)) or scales.dtype != torch.float32 or not scales.is_contiguous():
        raise ValueError(f"scales must be contiguous float32 [{S}, {len(lora_b)}]")
    if x.stride(1) != 1 or y.stride(1) != 1 or lora_a.stride(2) != 1 or any(b.stride(2) != 1 for b in lora_b):
        raise ValueError("x, y, lora_a and lora_b must be contiguous along their last dimension")
    if T == 0:
        return
    v = torch.zeros(T, NR, dtype=torch.float32, device=x.device)
    _shrink_kernel[(T, triton.cdiv(NR, BLOCK_N))](x, lora_a, token_slots, v, K, NR, x.stride(0),
                                                  lora_a.stride(0), lora_a.stride(1), v.stride(0),
                                                  BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
    block_r = triton.next_power_of_2(max_rank)
    for i, b in enumerate(lora_b):
        n_out = b.shape[1]
        if b.shape != (S, n_out, max_rank) or offsets[i] + n_out > y.shape[1]:
            raise ValueError(f"lora_b[{i}] {tuple(b.shape)} does not fit y {tuple(y.shape)} at offset {offsets[i]}")
        _expand_kernel[(T, triton.cdiv(n_out, BLOCK_N))](v, b, token_slots, scales, y, n_out, max_rank,
                                                         i * max_rank, offsets[i], i, len(lora_b), v.stride(0),
                                                         b.stride(0), b.stride(1), y.stride(0),
                                                         BLOCK_N=BLOCK_N, BLOCK_R=block_r)
