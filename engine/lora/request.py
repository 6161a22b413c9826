"""LoRARequest: which adapter a request runs under, in vLLM's shape.

    from pagedkube.engine import LLM, LoRARequest
    llm = LLM("builtin://tiny", enable_lora=True, max_lora_rank=16)
    llm.generate(prompts, params, lora_request=LoRARequest("vet-notes", 1, "/adapters/vet-notes"))

`lora_int_id` tells adapters apart inside the engine (its host-memory cache and device
slots are keyed by it), `lora_name` is the adapter's public name: the request's `model`
on the server and part of every block hash (pagedkube/hashing.py). Torch-free.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str
    base_model_name: str | None = None   # vLLM's JSON --lora-modules field: the model it was trained on

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError("lora_name must be a non-empty string")
        if isinstance(self.lora_int_id, bool) or not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be an integer >= 1 (vLLM's rule), got {self.lora_int_id!r}")
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise ValueError("lora_path must be a non-empty string")
