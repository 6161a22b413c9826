"""Triton W8A16 / W4A16 matmuls against x @ dequantize(w).T (engine/quant/formats.py's reference).

On CPU the kernels run under TRITON_INTERPRET=1 (tests/conftest.py sets it when the machine has
no GPU); on a GPU machine the same cases run compiled on CUDA. Shapes are small: the interpreter
runs every program in numpy.

The reference is computed in float64 from the weight dequantized in float32 (exact: q * scale
and q * scale + min are single roundings of exact products) and x as given. Tolerance (max abs
error, outputs are O(sqrt(K) * |w| * |x|) ~ O(1) here):
    float32   atol 1e-4, rtol 1e-4    (fp32 accumulation order, one rounding of each scale product)
    float16   atol 2e-3, rtol 2e-3    (output rounding to fp16: eps 9.8e-4)
    bfloat16  atol 2e-2, rtol 2e-2    (output rounding to bf16: eps 7.8e-3; the interpreter truncates)
Inputs are exact in every dtype (x is rounded to the dtype before the reference sees it).
"""
from __future__ import annotations

import pytest
import torch

from pagedkube.engine.quant.formats import Int4Weight, Int8Weight, dequantize, pack_int4

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCES = {
    torch.float32: dict(atol=1e-4, rtol=1e-4),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}


def _kernels():
    from pagedkube.engine.quant.triton_w4a16 import w4a16_matmul
    from pagedkube.engine.quant.triton_w8a16 import w8a16_matmul
    return w8a16_matmul, w4a16_matmul


def random_int8(n: int, k: int, group: int, gen: torch.Generator) -> Int8Weight:
    q = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    scales = torch.rand(n, k // group, generator=gen) * 0.02 / k ** 0.5 * 16 + 1e-4
    return Int8Weight(q.to(DEVICE), scales.to(DEVICE), group)


def random_int4(n: int, k: int, group: int, gen: torch.Generator) -> Int4Weight:
    q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    scales = (torch.rand(n, k // group, generator=gen) + 0.05) * 2.0 / k ** 0.5 / 8
    mins = -8 * scales * (0.8 + 0.4 * torch.rand(n, k // group, generator=gen))   # Q4_0/Q4_1-like
    return Int4Weight(pack_int4(q).to(DEVICE), scales.to(DEVICE), mins.to(DEVICE), group)


def reference(x: torch.Tensor, w) -> torch.Tensor:
    return x.double() @ dequantize(w).double().T


# (M, N, K, G, dtype): every M in {1, 3, 17, 64}, G in {32, 128, K}, every dtype; N not a
# multiple of the 32/64 tile; one G (48) whose K tile is 16, one (40) with no K tile (fallback).
CASES = [
    (1, 40, 128, 32, torch.float32),
    (1, 72, 256, 256, torch.bfloat16),
    (3, 33, 256, 128, torch.float16),
    (3, 64, 96, 48, torch.bfloat16),
    (17, 48, 128, 128, torch.float32),
    (17, 24, 64, 32, torch.bfloat16),
    (64, 70, 160, 32, torch.float16),
    (64, 40, 192, 192, torch.float32),
    (3, 16, 80, 40, torch.float32),
]


def _id(case):
    m, n, k, g, dtype = case
    return f"M{m}-N{n}-K{k}-G{g}-{str(dtype).removeprefix('torch.')}"


@pytest.mark.parametrize("case", CASES, ids=_id)
@pytest.mark.parametrize("kind", ["w8a16", "w4a16"])
def test_quantized_matmul_matches_dequantized(kind, case):
    m, n, k, g, dtype = case
    gen = torch.Generator().manual_seed(hash((kind, case)) % 2**31)
    w = (random_int8 if kind == "w8a16" else random_int4)(n, k, g, gen)
    x = torch.randn(m, k, generator=gen).to(dtype).to(DEVICE)
    w8a16, w4a16 = _kernels()
    out = (w8a16 if kind == "w8a16" else w4a16)(x, w)
    assert out.dtype == dtype and tuple(out.shape) == (m, n)
    ref = reference(x, w)
    assert ref.abs().max() > 0.5     # the check is not vacuous: outputs are O(1)
    torch.testing.assert_close(out.double(), ref, **TOLERANCES[dtype])


def test_strided_x_and_empty_batch():
    gen = torch.Generator().manual_seed(7)
    w = random_int4(24, 64, 32, gen)
    wide = torch.randn(5, 128, generator=gen).to(DEVICE)
    x = wide[:, ::2]                                     # a non-contiguous view
    _, w4a16 = _kernels()
    torch.testing.assert_close(w4a16(x, w).double(), reference(x, w), **TOLERANCES[torch.float32])
    assert tuple(w4a16(wide[:0, :64], w).shape) == (0, 24)


def test_bad_input_is_a_value_error():
    gen = torch.Generator().manual_seed(3)
    w8, w4 = random_int8(16, 64, 32, gen), random_int4(16, 64, 32, gen)
    w8a16, w4a16 = _kernels()
    x = torch.randn(2, 64).to(DEVICE)
    with pytest.raises(ValueError, match="K = 64"):
        w8a16(torch.randn(2, 32).to(DEVICE), w8)
    with pytest.raises(ValueError, match="dtype"):
        w4a16(x.double(), w4)
    with pytest.raises(ValueError, match="expected an Int4Weight"):
        w4a16(x, w8)
    with pytest.raises(ValueError, match=r"\[M, K\]"):
        w8a16(x[0], w8)
