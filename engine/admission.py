"""The one admission check: can a request ever finish, and with how many new tokens?

Used by the Scheduler (and through it LLMEngine and LLM) and by the HTTP server,
which holds only the engine's facts (AdmissionLimits), not the engine. A request
is admitted iff, alone in the pool, it can run to its end:

    prompt < max_model_len                       (room for one new token)
    prompt + max_tokens <= max_model_len
    blocks(prompt + max_tokens - 1) <= num_kv_blocks   (the last sampled token needs no KV)

`max_tokens=None` means "as many as fit": the room left by both bounds.
Torch-free.
"""
from __future__ import annotations

from dataclasses import dataclass


class AdmissionError(ValueError):
    """A request that can never run; `param` names the field to fix."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    max_model_len: int
    num_kv_blocks: int
    block_size: int

    @property
    def pool_tokens(self) -> int:
        return self.num_kv_blocks * self.block_size

    @property
    def max_seq_len(self) -> int:
        """The longest a sequence may grow (prompt + output)."""
        return min(self.max_model_len, self.pool_tokens + 1)

    def num_blocks(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)


def allowed_max_tokens(limits: AdmissionLimits, num_prompt_tokens: int, requested: int | None, *,
                       prompt_field: str = "prompt", tokens_field: str = "max_tokens") -> int:
    """The max_tokens the request runs with (`requested`, or all the room when None);
    AdmissionError with the reason when it could never finish."""
    n, max_len = num_prompt_tokens, limits.max_model_len
    if n < 1:
        raise AdmissionError(f"the {prompt_field} is empty (0 tokens)", prompt_field)
    if n >= max_len:
        raise AdmissionError(f"the {prompt_field} has {n} tokens, more than max_model_len ({max_len}) - 1: "
                             f"it must be shorter than max_model_len to leave room for output", prompt_field)
    if requested is not None and n + requested > max_len:
        raise AdmissionError(f"This model's maximum context length is {max_len} tokens: {prompt_field} "
                             f"({n} tokens) + {tokens_field} ({requested}) exceeds max_model_len ({max_len}); "
                             f"reduce {prompt_field} or {tokens_field}", tokens_field)
    room = limits.max_seq_len - n
    kv_tokens = n + (room if requested is None else requested) - 1
    needed = limits.num_blocks(max(kv_tokens, n))
    if needed > limits.num_kv_blocks:
        at_most = f"; at most {room} new tokens fit" if room > 0 else ""
        raise AdmissionError(f"the request needs {needed} KV blocks but the pool has only {limits.num_kv_blocks} "
                             f"({limits.pool_tokens} tokens){at_most}: shorten {prompt_field} or {tokens_field}",
                             tokens_field if room > 0 and requested is not None else prompt_field)
    return room if requested is None else requested
