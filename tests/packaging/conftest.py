"""Fixtures shared by the packaging tests: the repository root and pinned binaries."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_module(path: Path) -> ModuleType:
    """Loads a plain helper module by path (tests are not a package here)."""
    name = f"_pagedkube_test_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def binaries() -> ModuleType:
    return load_module(ROOT / "tests" / "tools" / "binaries.py")


@pytest.fixture(scope="session")
def helm(binaries) -> Path:
    return binaries.helm_path()


@pytest.fixture(scope="session")
def kubectl(binaries) -> Path:
    return binaries.kubectl_path()


@pytest.fixture(scope="session")
def hadolint(binaries) -> Path:
    return binaries.hadolint_path()


@pytest.fixture(scope="session")
def dockerfile_replay() -> ModuleType:
    return load_module(ROOT / "tests" / "packaging" / "dockerfile_replay.py")
