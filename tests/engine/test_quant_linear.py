"""QuantLinear's CPU kernels against the dequantized float matmul (engine/quant/linear.py).

Random packed weights in both formats, several M (1 = a decode step), N, K and group
sizes, with float32 and bfloat16 activations. The reference is x (float32) @ dequantize(W)^T.
torch's CPU kernels run in bf16 (with fp32 activations the layer casts around them), so
the stated tolerance is bf16's: each output is a K-term dot product whose inputs, scales
and result are rounded to bf16 (2^-8 relative each), so |y - ref| <= TOL * sum_k |x_k| |W_nk|
with TOL = 2^-6 (a 4x margin over the three roundings, still 100x below int4's own
quantization error). Dense layers (grouped int8 with fp32 activations) are exact.
"""
from __future__ import annotations

import pytest
import torch

from pagedkube.engine.quant.formats import Int4Weight, Int8Weight, dequantize, pack_int4
from pagedkube.engine.quant.linear import QuantLinear
from pagedkube.engine.quant.quantize import INT4_GROUP_SIZE, quantize_int4, quantize_int8

TOL = 2 ** -6
MS = (1, 3, 17)
SHAPES = [(16, 64), (48, 96), (64, 576), (160, 1536)]      # N x K; 576 and 1536: SmolLM2's hidden and MLP


def random_int8(n: int, k: int, group_size: int, gen: torch.Generator) -> Int8Weight:
    q = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    scales = torch.rand(n, k // group_size, generator=gen) * 0.02 + 1e-4
    return Int8Weight(q, scales, group_size)


def random_int4(n: int, k: int, group_size: int, gen: torch.Generator) -> Int4Weight:
    q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    scales = torch.rand(n, k // group_size, generator=gen) * 0.02 + 1e-4
    mins = -8 * scales + (torch.rand(n, k // group_size, generator=gen) - 0.5) * 0.05
    return Int4Weight(pack_int4(q), scales, mins, group_size)


def _layer(w, dtype, bias: torch.Tensor | None = None) -> QuantLinear:
    n, k = w.shape
    layer = QuantLinear(k, n, bias=bias is not None, dtype=dtype)
    if bias is not None:
        layer.bias.data.copy_(bias)
    layer.set_weight(w, dtype, torch.device("cpu"), "test")
    return layer


def _check(layer: QuantLinear, w, x: torch.Tensor, bias: torch.Tensor | None = None, exact: bool = False):
    dense = dequantize(w) if not isinstance(w, torch.Tensor) else w.float()
    y = layer(x)
    assert y.dtype == x.dtype and y.shape == (x.shape[0], dense.shape[0])
    ref = x.float() @ dense.T + (0 if bias is None else bias.float())
    bound = x.float().abs() @ dense.abs().T
    err = (y.float() - ref).abs()
    if exact:
        torch.testing.assert_close(y.float(), ref, rtol=1e-5, atol=1e-5)
    else:
        assert (err <= TOL * bound + 1e-6).all(), (err / bound).max().item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("shape", "group_size"),
                         [(s, g) for s in SHAPES for g in (32, 64, "K") if g == "K" or s[1] % g == 0])
def test_int4_matches_the_dequantized_matmul(shape, group_size, dtype):
    n, k = shape
    g = k if group_size == "K" else group_size
    gen = torch.Generator().manual_seed(n * k + (g if isinstance(g, int) else 0))
    w = random_int4(n, k, g, gen)
    layer = _layer(w, dtype)
    expected = "int4pack" if g in (32, 64, 128, 256) else "dense"
    assert layer.kernel.name == expected, (g, layer.kernel)
    for m in MS:
        _check(layer, w, torch.randn(m, k, generator=gen).to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("group_size", [32, "K"])
def test_int8_matches_the_dequantized_matmul(shape, group_size, dtype):
    """Per channel (G = K): torch's int8pack kernel. Grouped (GGUF Q8_0): dense in the activation dtype."""
    n, k = shape
    g = k if group_size == "K" else group_size
    gen = torch.Generator().manual_seed(n + k + g)
    w = random_int8(n, k, g, gen)
    bias = torch.randn(n, generator=gen).to(dtype)
    layer = _layer(w, dtype, bias)
    assert layer.kernel.name == ("int8pack" if g == k else "dense")
    for m in MS:
        _check(layer, w, torch.randn(m, k, generator=gen).to(dtype), bias,
               exact=g != k and dtype == torch.float32)


def test_tinygemm_needs_whole_16_row_tiles_else_dense():
    """N % 16 != 0 has no tinygemm layout: the layer runs dense (still the same numbers)."""
    gen = torch.Generator().manual_seed(1)
    w = random_int4(24, 64, 32, gen)
    layer = _layer(w, torch.float32)
    assert layer.kernel.name == "dense"
    _check(layer, w, torch.randn(5, 64, generator=gen), exact=True)


def test_quantize_at_load_error_is_within_half_a_step():
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(96, 576, generator=gen) * 0.05
    w8 = quantize_int8(w)
    assert w8.group_size == 576 and w8.scales.shape == (96, 1)
    assert ((dequantize(w8) - w).abs() <= w8.scales / 2 + 1e-7).all()
    w4 = quantize_int4(w)
    assert w4.group_size == INT4_GROUP_SIZE == 32
    step = w4.scales.repeat_interleave(32, dim=1)
    assert ((dequantize(w4) - w).abs() <= step / 2 + 1e-7).all()
    zero = quantize_int4(torch.zeros(16, 64))                    # a constant group: scale 1, exact
    assert torch.equal(dequantize(zero), torch.zeros(16, 64))


def test_wrong_weight_shape_is_a_value_error():
    layer = QuantLinear(64, 32, bias=False)
    with pytest.raises(ValueError, match=r"weight of shape \(16, 64\) for a linear layer of \(32, 64\)"):
        layer.set_weight(torch.zeros(16, 64), torch.float32, torch.device("cpu"), "test")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_cuda_layer_matches_the_dequantized_matmul(fmt):
    """On CUDA the layer calls the Triton W8A16/W4A16 kernels (dense until they exist), bf16 activations."""
    gen = torch.Generator().manual_seed(3)
    n, k = 256, 576
    w = random_int8(n, k, k, gen) if fmt == "int8" else random_int4(n, k, 32, gen)
    layer = QuantLinear(k, n, bias=False)
    layer.set_weight(w, torch.bfloat16, torch.device("cuda"), "test")
    assert layer.kernel.name in ("triton", "dense")
    for m in MS:
        x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
        y = layer(x.cuda()).float().cpu()
        dense = dequantize(w)
        err = (y - x.float() @ dense.T).abs()
        assert (err <= TOL * (x.float().abs() @ dense.abs().T) + 1e-6).all()
