"""Tests of our C++ CPU kernels (engine/quant/q4_fused.py builds them): the built library, or a
skip where no C++ toolchain builds it or the CPU lacks the attention kernel's AVX2/FMA/F16C."""
from __future__ import annotations

import pytest

from pagedkube.engine.gguf.prepare import cache_root
from pagedkube.engine.quant import q4_fused


def require_cpu_kernels() -> q4_fused.Q4Ops:
    if not q4_fused._toolchain():
        pytest.skip("no C++ toolchain (make cxx installs one)")
    built = q4_fused.q4_ext(cache_root())
    assert built is not None
    if not built.has_attention():
        pytest.skip("this CPU has no AVX2/FMA/F16C: the attention kernel is not built")
    return built
