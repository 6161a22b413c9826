"""Per-request sampling parameters, validated on construction (vLLM's names)."""
from __future__ import annotations

from dataclasses import dataclass

from pagedkube.engine.structured.params import StructuredOutputsParams


@dataclass(slots=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0          # 0 = greedy (vLLM's default is 1.0 too)
    top_p: float = 1.0                # in (0, 1]
    top_k: int = 0                    # 0 or -1 = disabled
    min_p: float = 0.0                # in [0, 1]
    seed: int | None = None           # per-request generator; None = engine's stream
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    max_tokens: int | None = 16       # None = up to max_model_len
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: int | None = None       # None = off; k >= 0 = sampled token + top-k
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    # Penalties (vLLM's / OpenAI's meaning, applied in engine/penalties.py):
    repetition_penalty: float = 1.0   # > 0; seen tokens (prompt and output): logit / p if > 0 else * p
    presence_penalty: float = 0.0     # [-2, 2]; minus this once for every token already in the output
    frequency_penalty: float = 0.0    # [-2, 2]; minus this times the token's count in the output
    logit_bias: dict[int, float] | None = None   # token id -> added to its logit, in [-100, 100]
    # The output must match this JSON Schema / regex / choice / grammar (engine/structured/).
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1, got {self.n!r}")
        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (disabled) or a positive integer, got {self.top_k!r}")
        if not isinstance(self.min_p, (int, float)) or not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p!r}")
        if self.max_tokens is not None and (
                isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens!r}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) must be <= max_tokens ({self.max_tokens})")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or self.logprobs < 0):
            raise ValueError(f"logprobs must be an integer >= 0, got {self.logprobs!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("stop must be a list of non-empty strings")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise ValueError("stop_token_ids must be non-negative integers")
        if not isinstance(self.repetition_penalty, (int, float)) or not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not -2 <= value <= 2:
                raise ValueError(f"{name} must be in [-2, 2], got {value!r}")
        if self.logit_bias is not None:
            bias = {}
            for key, value in dict(self.logit_bias).items():
                try:
                    token_id = int(key)
                except (TypeError, ValueError):
                    raise ValueError(f"logit_bias keys must be token ids, got {key!r}") from None
                if token_id < 0 or not isinstance(value, (int, float)) or not -100 <= value <= 100:
                    raise ValueError(f"logit_bias: token {key!r} -> {value!r}: ids >= 0, biases in [-100, 100]")
                bias[token_id] = float(value)
            self.logit_bias = bias or None
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise ValueError("structured_outputs must be a StructuredOutputsParams")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Whether any penalty or bias changes this request's logits."""
        return (self.repetition_penalty != 1 or self.presence_penalty != 0 or self.frequency_penalty != 0
                or bool(self.logit_bias))
