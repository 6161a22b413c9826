"""The 4 MB toy model that ships inside the package (docs/design.md "Models"): `builtin://tiny`.

The tiny pet-care Qwen2 in the folder tiny/ next to this file, made by
scripts/make_tiny_model.py, for fast tests. `--model` values in general (the default
real model, GGUF files) are resolved by pagedkube.model_source, which uses this module
for builtin://tiny. Torch-free.
"""
from __future__ import annotations

from pathlib import Path

TINY = "tiny"
BUILTIN_SCHEME = "builtin://"
BUILTIN_MODELS = (TINY,)
# A Hugging Face model directory is recognised by its config.json.
REQUIRED_FILE = "config.json"


def builtin_model_dir(name: str = TINY) -> Path:
    """The folder of a built-in model (only "tiny" exists)."""
    if name not in BUILTIN_MODELS:
        raise ValueError(f"unknown built-in model {name!r}; built-in models: {', '.join(BUILTIN_MODELS)}")
    return Path(__file__).resolve().parent / name


def resolve_model(model: str | Path | None) -> Path:
    """Maps a --model value to a local Hugging Face directory.

    None, "" and "builtin://NAME" give the built-in model's folder; anything
    else is a path to a model directory. ValueError when the folder is missing
    or is not a model directory.
    """
    if model is None or model == "":
        path = builtin_model_dir()
    elif isinstance(model, str) and model.startswith(BUILTIN_SCHEME):
        path = builtin_model_dir(model[len(BUILTIN_SCHEME):])
    elif isinstance(model, (str, Path)):
        path = Path(model).expanduser()
    else:
        raise ValueError(f"model must be a path, {BUILTIN_SCHEME}NAME or None, got {type(model).__name__}")
    if not path.is_dir():
        raise ValueError(f"model directory {str(path)!r} does not exist (pass a local Hugging Face "
                         f"model directory, or builtin://tiny)")
    if not (path / REQUIRED_FILE).is_file():
        raise ValueError(f"{str(path)!r} is not a Hugging Face model directory: it has no {REQUIRED_FILE}")
    return path.absolute()
