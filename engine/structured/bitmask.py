"""Token bitmasks: which tokens a grammar allows next, applied to the logits.

Layout (xgrammar's): int32 [rows, ceil(vocab / 32)], token t allowed when bit
t % 32 of word t // 32 is set. Tokens past the mask's width (an embedding
padded beyond the tokenizer's vocabulary) are never allowed.

    word w:   bit 0 .. bit 31   ->   tokens 32w .. 32w+31

`apply_bitmask` writes -inf into the disallowed logits of the constrained rows
only, in place; unconstrained rows are not touched (their tokens are exactly
what they would be alone). On CUDA it runs the Triton kernel below (one program
per (row, block of tokens)), elsewhere the torch reference; both are checked
against each other under TRITON_INTERPRET=1 (tests/engine/test_structured_bitmask.py).
"""
from __future__ import annotations

import torch

BITS = 32


def bitmask_words(vocab_size: int) -> int:
    return -(-vocab_size // BITS)


def allowed_reference(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool [rows, vocab_size]: the mask unpacked (the reference every kernel is checked against)."""
    shifts = torch.arange(BITS, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.to(torch.int32)[:, :, None] >> shifts) & 1
    allowed = bits.reshape(bitmask.shape[0], -1).bool()
    if allowed.shape[1] >= vocab_size:
        return allowed[:, :vocab_size]
    pad = torch.zeros(bitmask.shape[0], vocab_size - allowed.shape[1], dtype=torch.bool, device=bitmask.device)
    return torch.cat([allowed, pad], dim=1)


def apply_bitmask_reference(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """logits[rows[i]] = -inf where bitmask[i] disallows; in place."""
    allowed = allowed_reference(bitmask, logits.shape[1])
    logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))


def _check(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    if logits.dim() != 2 or bitmask.dim() != 2 or rows.dim() != 1:
        raise ValueError(f"logits [N, V], bitmask [R, W] and rows [R] expected, got {tuple(logits.shape)}, "
                         f"{tuple(bitmask.shape)}, {tuple(rows.shape)}")
    if bitmask.dtype != torch.int32 or rows.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"bitmask must be int32 and rows an integer tensor, got {bitmask.dtype}, {rows.dtype}")
    if bitmask.shape[0] != rows.shape[0]:
        raise ValueError(f"{bitmask.shape[0]} bitmask rows for {rows.shape[0]} logit rows")
    if not (bitmask.device == rows.device == logits.device):
        raise ValueError(f"logits, bitmask and rows must share a device, got {logits.device}, {bitmask.device}, "
                         f"{rows.device}")


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """Mask `rows` of `logits` in place: the Triton kernel on CUDA, the torch reference elsewhere."""
    _check(logits, bitmask, rows)
    if rows.numel() == 0:
        return
    if logits.device.type == "cuda":
        from pagedkube.engine.structured.triton_bitmask import apply_bitmask_triton
        apply_bitmask_triton(logits, bitmask, rows)
    else:
        apply_bitmask_reference(logits, bitmask, rows)
