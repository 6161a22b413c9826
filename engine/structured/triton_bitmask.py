"""Triton: apply a token bitmask to chosen rows of the logits, in place (torch
reference: bitmask.apply_bitmask_reference).

Program (r, b) handles row rows[r], tokens [b * BLOCK, (b + 1) * BLOCK): it
loads the BLOCK / 32 words covering them, expands each bit, and stores -inf
where a bit is 0 (tokens past the mask's words count as 0). Only the masked
rows are read or written.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

BLOCK = 4096


@triton.jit
def _apply_bitmask_kernel(logits_ptr, bitmask_ptr, rows_ptr, stride_logits, stride_mask, vocab_size, num_words,
                          BLOCK: tl.constexpr):
    r = tl.program_id(0)
    b = tl.program_id(1)
    row = tl.load(rows_ptr + r).to(tl.int64)
    tokens = b * BLOCK + tl.arange(0, BLOCK)
    words = tokens // 32
    in_vocab = tokens < vocab_size
    word = tl.load(bitmask_ptr + r * stride_mask + words, mask=in_vocab & (words < num_words), other=0)
    allowed = ((word >> (tokens % 32)) & 1) != 0
    tl.store(logits_ptr + row * stride_logits + tokens, float("-inf"), mask=in_vocab & ~allowed)


def apply_bitmask_triton(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    if logits.device.type != "cuda" and not isinstance(_apply_bitmask_kernel, InterpretedFunction):
        raise ValueError("the Triton bitmask kernel needs CUDA tensors; on CPU set TRITON_INTERPRET=1 "
                         "before importing triton, or use apply_bitmask_reference")
    if logits.stride(1) != 1 or bitmask.stride(1) != 1:
        raise ValueError("logits and bitmask must be contiguous along the vocabulary")
    vocab_size = logits.shape[1]
    grid = (rows.shape[0], triton.cdiv(vocab_size, BLOCK))
    _apply_bitmask_kernel[grid](logits, bitmask, rows, logits.stride(0), bitmask.stride(0), vocab_size,
                                bitmask.shape[1], BLOCK=BLOCK)
