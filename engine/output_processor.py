"""Turns sampled tokens into vLLM's cumulative RequestOutputs: text, stop strings, logprobs.

Stop strings live here, not in the scheduler, because they need text. A
sequence stopped by one is ended through Scheduler.finish right after the step
(its blocks are no longer read by anyone). While a request with stop strings
runs, the last len(longest stop) - 1 characters are held back, so the text
of successive outputs only ever grows (the server streams the differences).

Torch-free.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from pagedkube.engine.outputs import CompletionOutput, RequestDelta, RequestOutput, SampleDelta, to_logprobs
from pagedkube.engine.sampling_params import SamplingParams
from pagedkube.engine.scheduler import Scheduler, SeqUpdate
from pagedkube.engine.sequence import Sequence, SequenceStatus
from pagedkube.tokenizer import IncrementalDetokenizer, Tokenizer


class StreamDetokenizer:
    """IncrementalDetokenizer's interface in O(1) per token, with tokenizers'
    DecodeStream (which holds back split UTF-8 characters itself). Decoding the
    whole output every token costs ~1 ms per step per sequence at 2,000 tokens."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        from tokenizers.decoders import DecodeStream
        self.tokenizer = tokenizer
        self.text = ""
        self._raw = tokenizer._tok   # the tokenizers.Tokenizer inside pagedkube's wrapper
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)

    def add(self, token_ids: list[int]) -> str:
        delta = "".join(chunk for t in token_ids if (chunk := self._stream.step(self._raw, t)))
        self.text += delta
        return delta


def make_detokenizer(tokenizer: Tokenizer, skip_special_tokens: bool):
    try:
        return StreamDetokenizer(tokenizer, skip_special_tokens)
    except (ImportError, AttributeError):   # an older tokenizers, or another wrapper
        return IncrementalDetokenizer(tokenizer, skip_special_tokens)


@dataclass
class SampleState:
    seq: Sequence
    detok: StreamDetokenizer | IncrementalDetokenizer | None
    text: str = ""                       # final text once stopped by a stop string
    stop_string_hit: bool = False
    stop_reason: int | str | None = None
    logprobs: list[dict[int, float]] | None = None
    ranks: list[int] | None = None       # of each sampled token (with logprobs)
    cumulative_logprob: float | None = None
    sent_tokens: int = 0                 # what to_delta already reported
    sent_text: int = 0
    sent_final: bool = False

    def new_text(self, params: SamplingParams) -> str:
        """Visible text not yet reported, in O(new characters) while running."""
        if self.detok is None:
            return ""
        if self.seq.status.finished:
            text = self.visible_text(params)   # once per sample: it may decode the whole output
            end = len(text)
        else:
            text = self.detok.text
            end = max(0, len(text) - (max((len(s) for s in params.stop), default=1) - 1))
        piece = text[self.sent_text:end] if end > self.sent_text else ""
        self.sent_text = max(self.sent_text, end)
        return piece

    def delta(self, params: SamplingParams) -> SampleDelta | None:
        """This sample's SampleDelta since the last call, or None if nothing changed."""
        if self.sent_final:
            return None
        status = self.seq.status
        num_tokens = self.seq.num_output_tokens
        if num_tokens == self.sent_tokens and not status.finished:
            return None
        token_ids = self.seq.output_token_ids[self.sent_tokens:]
        logprobs = None if self.logprobs is None else self.logprobs[self.sent_tokens:]
        ranks = None if self.ranks is None else self.ranks[self.sent_tokens:]
        self.sent_tokens = num_tokens
        self.sent_final = status.finished
        return SampleDelta(self.seq.sample_index, token_ids, self.new_text(params), logprobs,
                           self.cumulative_logprob, status.value if status.finished else None,
                           self.stop_reason if status.finished else None, ranks)

    def visible_text(self, params: SamplingParams) -> str:
        if self.detok is None:
            return ""
        if self.stop_string_hit:
            return self.text
        if self.seq.status.finished:
            # Decode it all: flushes a held-back incomplete character. A stop token
            # (EOS or stop_token_ids) is not part of the text.
            ids = self.seq.output_token_ids
            if self.seq.status == SequenceStatus.FINISHED_STOPPED and not params.include_stop_str_in_output:
                ids = ids[:-1]
            return self.detok.tokenizer.decode(ids, params.skip_special_tokens)
        text = self.detok.text
        hold = max((len(s) for s in params.stop), default=1) - 1
        return text[:max(0, len(text) - hold)]


@dataclass
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    samples: list[SampleState]
    metrics: dict = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return all(s.seq.status.finished for s in self.samples)

    @classmethod
    def create(cls, request_id: str, prompt: str | None, seqs: list[Sequence],
               tokenizer: Tokenizer | None) -> "RequestState":
        params = seqs[0].params
        samples = [SampleState(seq, None if tokenizer is None else
                               make_detokenizer(tokenizer, params.skip_special_tokens),
                               logprobs=None if params.logprobs is None else [],
                               ranks=None if params.logprobs is None else [],
                               cumulative_logprob=None if params.logprobs is None else 0.0)
                   for seq in seqs]
        return cls(request_id, prompt, list(seqs[0].prompt_token_ids), params, samples,
                   {"arrival_time": time.monotonic()})

    def apply(self, update: SeqUpdate, scheduler: Scheduler) -> None:
        """Record one sampled token of one sample; end the sample on a stop string."""
        state = self.samples[update.seq.sample_index]
        seq, params, out = update.seq, self.params, update.sample
        now = time.monotonic()
        self.metrics.setdefault("first_token_time", now)
        self.metrics["last_token_time"] = now
        if state.logprobs is not None and out.logprob is not None:
            entry = {out.token_id: out.logprob}
            for token_id, logprob in out.top_logprobs or ():
                entry.setdefault(token_id, logprob)
            state.logprobs.append(entry)
            if state.ranks is not None:
                state.ranks.append(out.rank if out.rank is not None else 0)
            state.cumulative_logprob += out.logprob
        state.stop_reason = update.stop_reason
        if state.detok is None:
            return
        stopped_by_token = seq.status == SequenceStatus.FINISHED_STOPPED
        if stopped_by_token and not params.include_stop_str_in_output:
            return                         # the stop token's text is not part of the output
        before = len(state.detok.text)
        state.detok.add([out.token_id])
        if params.stop and not stopped_by_token and seq.num_output_tokens >= params.min_tokens:
            self._check_stop_strings(state, before, scheduler)

    def _check_stop_strings(self, state: SampleState, before: int, scheduler: Scheduler) -> None:
        params, text = self.params, state.detok.text
        start = max(0, before - max(len(s) for s in params.stop) + 1)
        hits = [(pos, s) for s in params.stop if (pos := text.find(s, start)) >= 0]
        if not hits:
            return
        pos, stop = min(hits)
        state.text = text[:pos + len(stop)] if params.include_stop_str_in_output else text[:pos]
        state.stop_string_hit = True
        state.stop_reason = stop
        if state.seq.status.finished:      # its last token also hit max_tokens: a stop wins
            state.seq.status = SequenceStatus.FINISHED_STOPPED
        else:
            scheduler.finish(state.seq, SequenceStatus.FINISHED_STOPPED)

    def to_delta(self) -> RequestDelta:
        """What every sample added since the last call (the engine core's per-step record)."""
        samples = [d for s in self.samples if (d := s.delta(self.params)) is not None]
        return RequestDelta(self.request_id, samples, self.finished, self.samples[0].seq.num_cached_tokens,
                            self.metrics.get("first_scheduled_time"))

    def to_output(self) -> RequestOutput:
        outputs = []
        for i, state in enumerate(self.samples):
            status = state.seq.status
            outputs.append(CompletionOutput(
                index=i, text=state.visible_text(self.params), token_ids=list(state.seq.output_token_ids),
                finish_reason=status.value if status.finished else None,
                stop_reason=state.stop_reason if status.finished else None,
                logprobs=None if state.logprobs is None else to_logprobs(state.logprobs, state.ranks),
                cumulative_logprob=state.cumulative_logprob))
        finished = self.finished
        if finished:
            self.metrics.setdefault("finished_time", time.monotonic())
        return RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, outputs, finished,
                             self.samples[0].seq.num_cached_tokens, dict(self.metrics))
