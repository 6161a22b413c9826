"""Our exact float32 Q4 CPU kernels (engine/quant/q4_fused.py, q4_linear.cpp), against the reference.

The reference is formats.dequantize (the file's values in float32) then a float64 matmul:
q4_dequantize must give dequantize's numbers bit for bit, and q4_linear the product to
float32 accuracy, for every row count the tiles and the GEMM's row blocks split differently
(1..17, 33, 64), an output count the GEMM's tiles of 6 leave a tail of (100), and weights
from each 4-bit GGUF type (Q4_0, Q4_1, Q4_K: groups of 32). Built once into the user's cache
(as the engine builds it) and skipped only where no C++ toolchain is installed.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys

import pytest
import torch

from pagedkube.engine.gguf.packing import pack_gguf
from pagedkube.engine.gguf.prepare import cache_root
from pagedkube.engine.quant import q4_fused
from pagedkube.engine.quant.formats import Int4Weight, dequantize
from pagedkube.engine.quant.quantize import quantize_int4


@pytest.fixture(scope="module")
def ext():
    if not q4_fused._toolchain():
        pytest.skip("no C++ toolchain (make cxx installs one)")
    module = q4_fused.q4_ext(cache_root())
    assert module is not None
    return module


def _gguf_weight(kind: str, n: int, k: int) -> Int4Weight:
    """A random weight stored as the GGUF type `kind` (gguf_factory's bytes), through the loader's packing."""
    import gguf
    import numpy as np
    from gguf_factory import _encode
    rng = np.random.default_rng(0)
    raw, _ = _encode(gguf, rng.normal(0, 0.05, size=(n, k)), kind, rng)
    w = pack_gguf(raw, kind, (n, k))
    assert isinstance(w, Int4Weight) and w.group_size == 32
    return w


@pytest.mark.parametrize(("kind", "n"), [("Q4_0", 96), ("Q4_1", 96), ("Q4_K", 96), ("Q4_1", 100)])
def test_the_kernels_compute_the_reference_for_each_gguf_4bit_type(ext, kind, n):
    w = _gguf_weight(kind, n, 512)
    ref_w = dequantize(w)
    assert torch.equal(ext.q4_dequantize(w.qweight, w.scales, w.mins), ref_w)
    fused, dequant = q4_fused.q4_fused_kernel(w, ext), q4_fused.q4_fused_kernel(w, ext, form="q4deq")
    for rows in (*range(1, 18), 33, 64):
        x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows))
        expected = x.double() @ ref_w.double().T
        for kernel in (fused, dequant):
            y = kernel(x)
            assert y.dtype == torch.float32 and y.shape == (rows, n)
            # float32 sums of 512 products: a few units of float32 rounding, never bf16's 2^-9
            assert float((y.double() - expected).abs().max() / expected.abs().max()) < 1e-5, (kernel.name, rows)


def _int16_reference(w: Int4Weight, x: torch.Tensor) -> torch.Tensor:
    """q4_linear_i16's documented numbers, in float64 after float32 rounding steps as the kernel
    takes them: per group of 32, xi = round(x * (32767 / m)) and s = m / 32767 (m the group's
    largest |x|), codes . xi exactly, times s; the mins' term on x itself."""
    n, k = w.shape
    groups = x.reshape(x.shape[0], k // 32, 32)
    largest = groups.abs().amax(dim=2, keepdim=True)
    # 32767 / m correctly rounded to float32, as C++ divides (torch's float32 division need not be)
    inverse = torch.where(largest > 0, (32767 / torch.where(largest > 0, largest, 1).double()).float(), 0)
    rounded = torch.round(groups * inverse).double() * (largest / 32767).double()
    groups = groups.double()
    codes = dequantize(Int4Weight(w.qweight, torch.ones_like(w.scales), torch.zeros_like(w.mins), 32)).double()
    codes = codes.reshape(n, k // 32, 32)
    dots = torch.einsum("mgj,ngj->mng", rounded, codes)                   # codes . rounded x, per group
    return (dots * w.scales.double()).sum(-1) + groups.sum(-1) @ w.mins.double().T


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q4_K"])
def test_the_int16_kernel_computes_its_rounding_and_the_exact_gemm_from_12_rows(ext, kind):
    w = _gguf_weight(kind, 100, 512)
    int16, fused = q4_fused.q4_fused_kernel(w, ext, form="q4i16"), q4_fused.q4_fused_kernel(w, ext)
    for rows in (*range(1, 14), 33):
        x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows)) * 3
        x[0, :32] = 0                                       # a group of zeros: scale 0, no division by it
        y = int16(x)
        assert y.dtype == torch.float32 and y.shape == (rows, 100)
        if rows >= 12:                                      # q4_linear's GEMM, exact
            assert torch.equal(y, fused(x)), rows
            continue
        expected = _int16_reference(w, x)
        assert float((y.double() - expected).abs().max() / expected.abs().max()) < 1e-5, rows
        exact = x.double() @ dequantize(w).double().T
        error = float((y.double() - exact).norm() / exact.norm())
        assert 1e-7 < error < 1e-3, (rows, error)          # rounded, and far under bf16's ~2e-3


def test_fused_kernel_matches_float32_matmul_closer_than_torch_int4(ext):
    w = quantize_int4(torch.randn(576, 1536, generator=torch.Generator().manual_seed(1)))
    x = torch.randn(1, 1536, generator=torch.Generator().manual_seed(2))
    expected = x.double() @ dequantize(w).double().T
    from pagedkube.engine.quant.linear import int4pack_kernel
    ours = float((q4_fused.q4_fused_kernel(w, ext)(x).double() - expected).norm() / expected.norm())
    torch_int4 = float((int4pack_kernel(w, torch.bfloat16)(x).double() - expected).norm() / expected.norm())
    assert ours < 1e-6 and torch_int4 > 1e-3        # bf16 activations, scales, zeros and output


def test_bad_inputs_raise(ext):
    w = quantize_int4(torch.randn(32, 64))
    with pytest.raises(RuntimeError, match="float32"):
        ext.q4_linear(torch.randn(1, 64, dtype=torch.bfloat16), w.qweight, w.scales, w.mins)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        ext.q4_linear(torch.randn(1, 96), w.qweight, w.scales, w.mins)


def test_a_second_start_loads_the_built_library_without_building(ext, tmp_path, monkeypatch, caplog):
    build_dir = q4_fused._build_dir(cache_root(), q4_fused._cflags())
    assert (build_dir / f"{q4_fused.EXT_NAME}.so").is_file()
    monkeypatch.setattr("torch.utils.cpp_extension.load", lambda *a, **k: pytest.fail("built again"))
    q4_fused.q4_ext.cache_clear()
    with caplog.at_level(logging.INFO, logger="pagedkube.engine.quant.q4_fused"):
        assert q4_fused.q4_ext(cache_root()) is not None
    assert not caplog.records


def test_without_a_toolchain_there_is_no_kernel_and_a_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(q4_fused, "_toolchain", lambda: False)
    monkeypatch.setattr(q4_fused, "_registered", lambda: None)     # as in a fresh process
    with caplog.at_level(logging.WARNING, logger="pagedkube.engine.quant.q4_fused"):
        assert q4_fused.q4_ext(tmp_path) is None
    assert any("no C++ toolchain" in r.getMessage() for r in caplog.records)


def test_a_prebuilt_library_serves_a_process_without_a_toolchain_or_cache(ext, tmp_path):
    """The engine image's case: no compiler, an empty cache, the variants under $PAGEDKUBE_CPU_EXT_DIR."""
    built = q4_fused._build_dir(cache_root(), q4_fused._cflags())
    prebuilt = q4_fused._build_dir(tmp_path / "prebuilt", q4_fused._cflags())
    prebuilt.mkdir(parents=True)
    shutil.copy(built / f"{q4_fused.EXT_NAME}.so", prebuilt)
    probe = ("import torch\n"
             "from pathlib import Path\n"
             "from pagedkube.engine.quant import q4_fused\n"
             "assert not q4_fused._toolchain()\n"
             "ops = q4_fused.q4_ext(Path('%s'))\n"
             "w = torch.zeros(4, 16, dtype=torch.uint8)\n"
             "y = ops.q4_linear(torch.ones(1, 32), w, torch.ones(4, 1), torch.full((4, 1), 0.5))\n"
             "print(y.tolist()[0][:2])\n" % (tmp_path / "cache"))
    env = {**os.environ, q4_fused.PREBUILT_ENV: str(tmp_path / "prebuilt"), "CXX": str(tmp_path / "no-c++"),
           "PAGEDKUBE_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "[16.0, 16.0]"        # 32 inputs x (code 0 x scale 1 + min 0.5)
    assert not (tmp_path / "cache" / "cpu-ext").exists()       # nothing built


def test_q8_0_lm_head_and_embedding_compute_the_reference(ext):
    from pagedkube.engine.quant.packed_vocab import PackedEmbedding, PackedLMHead
    w = _gguf_weight_q8(200, 576)       # 200 outputs: the GEMM's tiles of 6 leave a tail
    ref_w = dequantize(w)
    head, embed = PackedLMHead(w, ext), PackedEmbedding(w)
    for rows in (1, 3, 7, 8, 9, 16, 17, 40):
        x = torch.randn(rows, 576, generator=torch.Generator().manual_seed(rows))
        expected = x.double() @ ref_w.double().T
        assert float((head(x).double() - expected).abs().max() / expected.abs().max()) < 1e-5
    ids = torch.tensor([0, 199, 7, 7])
    assert torch.equal(embed(ids), ref_w[ids])                    # int8 x fp16 scale: exact in float32


def _gguf_weight_q8(n: int, k: int):
    import gguf
    import numpy as np
    from gguf_factory import _encode
    rng = np.random.default_rng(0)
    raw, _ = _encode(gguf, rng.normal(0, 0.05, size=(n, k)), "Q8_0", rng)
    return pack_gguf(raw, "Q8_0", (n, k))
