"""What LLM.generate and LLMEngine.step return (vLLM's shapes)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass(slots=True)
class Logprob:
    """vLLM's: a token's log probability, its rank in the vocabulary (1 = the likeliest) and its text."""
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


def to_logprobs(entries: list[dict[int, float]], ranks: list[int] | None,
                decode: Callable[[int], str] | None = None) -> list[dict[int, Logprob]]:
    """The engine's compact entries ({token id: logprob}, the sampled token first, then the top
    ones) as vLLM's {token id: Logprob}. The sampled token's rank is the sampler's (over the whole
    vocabulary); a top token's is its place among the top ones."""
    out = []
    for j, entry in enumerate(entries):
        sampled = next(iter(entry), None)
        by_value = sorted(entry, key=entry.__getitem__, reverse=True)
        place = {token_id: n for n, token_id in enumerate(by_value, 1)}
        out.append({token_id: Logprob(logprob, ranks[j] if token_id == sampled and ranks else place[token_id],
                                      decode(token_id) if decode is not None else None)
                    for token_id, logprob in entry.items()})
    return out


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None          # "stop" | "length" | "abort" | None while running
    stop_reason: int | str | None = None      # the stop string or token id that ended it
    logprobs: list[dict[int, Logprob]] | None = None  # per output token: {token_id: Logprob}, sampled one first
    cumulative_logprob: float | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    num_cached_tokens: int = 0
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class SampleDelta:
    """What one sample (of n) added in one engine step: only the new part."""
    index: int
    token_ids: list[int]                      # new token ids
    text: str                                 # new text (held-back characters come later)
    logprobs: list[dict[int, float]] | None   # one entry per new token, or None when logprobs are off
    cumulative_logprob: float | None
    finish_reason: str | None = None          # set on the sample's last delta
    stop_reason: int | str | None = None
    ranks: list[int] | None = None            # the sampled tokens' ranks, beside logprobs


@dataclass(slots=True)
class RequestDelta:
    """One request's progress in one engine step: the record the engine core sends
    over the process boundary and the server's formatters consume as it is. Its size
    is O(new tokens), never O(tokens so far) (docs/engine.md "Outputs")."""
    request_id: str
    samples: list[SampleDelta]                # the samples that progressed this step
    finished: bool                            # every sample has finished
    num_cached_tokens: int
    first_scheduled_time: float | None = None
    error: str | None = None                  # the request failed before running (e.g. its grammar did not compile)


class OutputAccumulator:
    """Builds vLLM's cumulative RequestOutput from a request's deltas, for callers that
    want the whole answer at once (LLM.generate, non-streamed HTTP requests).

    Appends only: text pieces are joined once, in result()."""

    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                 decode: Callable[[int], str] | None = None):
        """`decode`: a token id's text, for Logprob.decoded_token (None: left out)."""
        self.request_id = request_id
        self.decode = decode
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.finished = False
        self.num_cached_tokens = 0
        self.metrics: dict[str, float] = {}
        self._samples: dict[int, tuple[CompletionOutput, list[str]]] = {}

    def add(self, delta: RequestDelta) -> None:
        assert delta.request_id == self.request_id, (delta.request_id, self.request_id)
        self.finished = delta.finished
        self.num_cached_tokens = delta.num_cached_tokens
        if delta.first_scheduled_time is not None:
            self.metrics.setdefault("first_scheduled_time", delta.first_scheduled_time)
        for s in delta.samples:
            if s.index not in self._samples:
                self._samples[s.index] = (CompletionOutput(s.index, "", [], logprobs=None), [])
            out, texts = self._samples[s.index]
            out.token_ids.extend(s.token_ids)
            texts.append(s.text)
            if s.logprobs is not None:
                if out.logprobs is None:
                    out.logprobs = []
                out.logprobs.extend(to_logprobs(s.logprobs, s.ranks, self.decode))
            out.cumulative_logprob = s.cumulative_logprob
            out.finish_reason, out.stop_reason = s.finish_reason, s.stop_reason

    @property
    def num_output_tokens(self) -> int:
        return sum(len(out.token_ids) for out, _ in self._samples.values())

    def result(self) -> RequestOutput:
        outputs = []
        for index in sorted(self._samples):
            out, texts = self._samples[index]
            out.text = "".join(texts)
            outputs.append(out)
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, outputs, self.finished,
                             self.num_cached_tokens, dict(self.metrics))
