"""The paged-KV engine (docs/design.md "Engine").

`LLM` and the model runner need torch; the block pool, prefix cache, scheduler,
sequence and sampling parameters do not, and importing them (or this package)
never imports torch. Hence the lazy attributes below.
"""
from __future__ import annotations

from typing import Any

from pagedkube.engine.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from pagedkube.engine.llm import LLM
        return LLM
    if name in ("RequestOutput", "CompletionOutput"):
        from pagedkube.engine import outputs
        return getattr(outputs, name)
    raise AttributeError(f"module 'pagedkube.engine' has no attribute {name!r}")
