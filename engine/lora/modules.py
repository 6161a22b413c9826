"""--lora-modules values, as vLLM takes them (torch-free: the CLI parses them in any image):

    --lora-modules vet-notes=/adapters/vet-notes cat-care=/adapters/cat-care
    --lora-modules '{"name": "vet-notes", "path": "/adapters/vet-notes", "base_model_name": "smollm2"}'
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

# what an adapter may be called: it is a `model` name in requests and part of metric labels
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")


@dataclass(frozen=True, slots=True)
class LoRAModule:
    name: str
    path: str
    base_model_name: str | None = None

    def __post_init__(self) -> None:
        check_lora_name(self.name)
        if not isinstance(self.path, str) or not self.path:
            raise ValueError(f"LoRA module {self.name!r}: path must be a non-empty string")
        if self.base_model_name is not None and not isinstance(self.base_model_name, str):
            raise ValueError(f"LoRA module {self.name!r}: base_model_name must be a string")


def check_lora_name(name: object) -> str:
    if not isinstance(name, str) or not NAME.match(name):
        raise ValueError(f"LoRA adapter name {name!r}: 1-128 letters, digits and ._:/@+- , starting with a "
                         "letter or digit")
    return name


def parse_lora_module(text: str) -> LoRAModule:
    """One --lora-modules value: name=path, or vLLM's JSON object form (ValueError if neither)."""
    text = text.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"--lora-modules: not valid JSON: {e}") from None
        unknown = set(data) - {"name", "path", "base_model_name"}
        if not isinstance(data, dict) or unknown or "name" not in data or "path" not in data:
            raise ValueError(f"--lora-modules: a JSON module is {{\"name\", \"path\"[, \"base_model_name\"]}}, "
                             f"got {text!r}")
        return LoRAModule(data["name"], data["path"], data.get("base_model_name"))
    name, sep, path = text.partition("=")
    if not sep:
        raise ValueError(f"--lora-modules: expected name=path or a JSON object, got {text!r}")
    return LoRAModule(name.strip(), path.strip())
