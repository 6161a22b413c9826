"""Tests of torch.compile on CPU need a C++ toolchain: skip without one, except in CI,
which must run them (`make cxx`, a dependency of `make test-fast`, installs g++ and python3-dev)."""
from __future__ import annotations

import os

import pytest

from pagedkube.engine.runner_setup import has_cxx_toolchain


def require_cxx() -> None:
    if not has_cxx_toolchain():
        if os.environ.get("CI"):
            raise RuntimeError("CI must run the torch.compile tests: `make cxx` installs g++ and python3-dev")
        pytest.skip("torch.compile on CPU needs g++ and Python's headers (make cxx installs them)")
