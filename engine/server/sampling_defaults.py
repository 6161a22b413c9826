"""`--generation-config`: the model's recommended sampling settings as request defaults, as vLLM does.

    auto    (default) generation_config.json beside the model: its temperature, top_p, top_k,
            min_p, repetition_penalty and max_new_tokens fill what a request leaves out
    vllm    none: a request's omitted fields take the API's defaults (temperature 1, ...)
    FOLDER  that folder's generation_config.json

A field the request sets always wins. Torch-free (the server's HTTP process reads it).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Mapping

GENERATION_CONFIG = "generation_config.json"
# generation_config.json's name -> (the request field it gives a default for, the values that
# field accepts). vLLM's selection; a value out of range is left out, not made every request's 400.
_FIELDS: dict[str, tuple[str, Callable[[float], bool]]] = {
    "temperature": ("temperature", lambda v: v >= 0),
    "top_p": ("top_p", lambda v: 0 < v <= 1),
    "top_k": ("top_k", lambda v: v == int(v) and v >= -1),
    "min_p": ("min_p", lambda v: 0 <= v <= 1),
    "repetition_penalty": ("repetition_penalty", lambda v: v > 0),
    "max_new_tokens": ("max_tokens", lambda v: v == int(v) and v >= 1),
}


def read_generation_config(setting: str) -> str | None:
    """The text of a FOLDER setting's file (None for auto / vllm); ValueError if it is not there."""
    if setting in ("auto", "vllm"):
        return None
    path = Path(setting).expanduser() / GENERATION_CONFIG
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"--generation-config {setting!r}: cannot read {path}: {e.strerror or e}") from None


def sampling_defaults(setting: str, tokenizer_files: Mapping[str, str] | None) -> dict[str, float | int]:
    """Request defaults under `setting` (the module docstring). ValueError on a broken file."""
    if setting == "vllm":
        return {}
    text = (tokenizer_files or {}).get(GENERATION_CONFIG) if setting == "auto" else read_generation_config(setting)
    try:
        raw = json.loads(text or "{}")
    except json.JSONDecodeError as e:
        raise ValueError(f"{GENERATION_CONFIG} is not JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{GENERATION_CONFIG} is not a JSON object")
    out: dict[str, float | int] = {}
    for theirs, (ours, valid) in _FIELDS.items():
        value = raw.get(theirs)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and valid(value):
            out[ours] = value
    return out
