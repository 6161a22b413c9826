"""Token bitmasks: the unpacking reference against hand-built masks, and the Triton kernel
against the reference (under TRITON_INTERPRET=1 here, compiled on CUDA when a GPU is present)."""
from __future__ import annotations

import pytest
import torch

from pagedkube.engine.structured.bitmask import allowed_reference, apply_bitmask, apply_bitmask_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def mask_of(allowed: list[list[int]], vocab: int) -> torch.Tensor:
    words = -(-vocab // 32)
    mask = torch.zeros(len(allowed), words, dtype=torch.int64)
    for row, tokens in enumerate(allowed):
        for t in tokens:
            mask[row, t // 32] |= 1 << (t % 32)
    return mask.to(torch.int32)    # bit 31 set wraps to a negative int32, as xgrammar's words do


def test_reference_unpacks_bits_exactly_including_bit_31_and_the_padded_tail():
    allowed = [[0, 31, 32, 63, 99], [5], []]
    mask = mask_of(allowed, 100)
    assert int(mask[0, 0]) < 0                                  # bit 31: a negative word
    unpacked = allowed_reference(mask, 130)                     # logits wider than the mask's words
    for row, tokens in enumerate(allowed):
        assert unpacked[row].nonzero().flatten().tolist() == tokens


def test_reference_masks_only_the_given_rows():
    logits = torch.arange(3 * 70, dtype=torch.float32).reshape(3, 70)
    before = logits.clone()
    apply_bitmask_reference(logits, mask_of([[1, 69], [0]], 70), torch.tensor([2, 0]))
    assert torch.equal(logits[1], before[1])                    # an unconstrained row is untouched
    assert torch.isfinite(logits[2]).nonzero().flatten().tolist() == [1, 69]
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [0]
    assert logits[2, 69] == before[2, 69]


@pytest.mark.parametrize("vocab, rows, batch, seed", [(1980, 3, 5, 0), (49152, 4, 32, 1), (4100, 1, 1, 2),
                                                      (151936, 2, 3, 3)])
def test_triton_kernel_equals_the_reference(vocab, rows, batch, seed):
    from pagedkube.engine.structured.triton_bitmask import apply_bitmask_triton

    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, vocab, generator=gen)
    words = -(-vocab // 32)
    mask = torch.randint(-2 ** 31, 2 ** 31 - 1, (rows, words), generator=gen, dtype=torch.int64).to(torch.int32)
    picked = torch.randperm(batch, generator=gen)[:rows]
    expected = logits.clone()
    apply_bitmask_reference(expected, mask, picked)
    got = logits.clone().to(DEVICE)
    apply_bitmask_triton(got, mask.to(DEVICE), picked.to(DEVICE))
    assert torch.equal(got.cpu(), expected)


def test_wrapper_checks_shapes_and_dtypes():
    logits = torch.zeros(2, 64)
    with pytest.raises(ValueError, match="int32"):
        apply_bitmask(logits, torch.zeros(1, 2, dtype=torch.int64), torch.tensor([0]))
    with pytest.raises(ValueError, match="bitmask rows"):
        apply_bitmask(logits, torch.zeros(2, 2, dtype=torch.int32), torch.tensor([0]))
