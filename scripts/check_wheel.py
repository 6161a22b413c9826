"""Checks an installed (non-editable) pagedkube wheel: the namespace is right,
nothing leaks into site-packages as a bare `operator`, `engine` or `gateway`,
the torch-free parts import without torch, and the built-in model ships."""
import importlib
import importlib.util
import sys
from pathlib import Path

import pagedkube

site = Path(pagedkube.__file__).resolve().parent.parent
for bare in ("engine", "gateway", "operator"):
    assert not (site / bare).exists(), f"bare top-level package {bare!r} installed in {site}"
assert importlib.util.find_spec("torch") is None, "the check venv must not have torch"
for module in ("pagedkube.cli", "pagedkube.hashing", "pagedkube.engine", "pagedkube.engine.sampling_params"):
    importlib.import_module(module)
import operator  # the stdlib one
assert hasattr(operator, "itemgetter")
builtin = Path(pagedkube.__file__).parent / "builtin" / "tiny"
missing = [f for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                       "generation_config.json") if not (builtin / f).is_file()]
assert not missing, f"built-in model files missing from the wheel: {missing}"
print("wheel OK:", pagedkube.__file__, file=sys.stderr)
