"""OpenAI response and stream-chunk shapes for completions and chat completions.

Streams are formatted from RequestDeltas as they come (only the new tokens and
text of a step), so the work per step is O(new tokens), whatever the length so
far; whole responses from the accumulated outputs (generation.collect).
Choice index = prompt index * n + sample index (OpenAI's order for batches).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pagedkube.engine.outputs import RequestDelta
from pagedkube.engine.server.prepare import Prepared
from pagedkube.engine.server.tool_parsers import ToolParser
from pagedkube.engine.server.tool_stream import ToolCallStream, finish_reason, tool_message


@dataclass
class _Choice:
    offset: int = 0          # completions' text_offset of the next token
    finished: bool = False


def _top(entry: dict[int, float] | None, k: int) -> list[tuple[int, float]]:
    if not entry:
        return []
    return sorted(entry.items(), key=lambda kv: kv[1], reverse=True)[:k]


class _Formatter:
    object_name = ""
    chunk_object = ""

    def __init__(self, request_id: str, model: str, prepared: Prepared, tokenizer: Any, n: int):
        self.request_id = request_id
        self.model = model
        self.created = int(time.time())
        self.prepared = prepared
        self.tokenizer = tokenizer
        self.n = n
        self.choices: dict[int, _Choice] = {}
        self.num_completion_tokens = 0
        self.num_cached: dict[int, int] = {}        # prompt index -> cached prompt tokens
        self.tokens_formatted = 0                   # tokens whose chunks were built (tests: O(new) per step)

    def token_str(self, token_id: int) -> str:
        if self.tokenizer is None:  # a model without tokenizer.json: vLLM's "token_id:N" spelling
            return f"token_id:{token_id}"
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def usage(self) -> dict:
        prompt = sum(len(ids) for ids in self.prepared.prompt_ids)
        completion = self.num_completion_tokens
        cached = sum(self.num_cached.values())
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached}}

    def chunk(self, choices: list[dict], usage: dict | None = None, include_usage: bool = False) -> dict:
        body = {"id": self.request_id, "object": self.chunk_object, "created": self.created,
                "model": self.model, "choices": choices}
        if include_usage:
            body["usage"] = usage
        return body

    def stream_update(self, prompt_idx: int, delta: RequestDelta) -> list[dict]:
        """The choice deltas of one step of one prompt's request."""
        self.num_cached[prompt_idx] = delta.num_cached_tokens or 0
        choices = []
        for sample in delta.samples:
            index = prompt_idx * self.n + sample.index
            choice = self.choices.setdefault(index, _Choice())
            if choice.finished:
                continue
            self.num_completion_tokens += len(sample.token_ids)
            self.tokens_formatted += len(sample.token_ids)
            logprobs, choice.offset = self.logprobs(sample.token_ids, sample.logprobs, choice.offset)
            choice.finished = sample.finish_reason is not None
            if sample.text or logprobs is not None or choice.finished:  # no empty chunks (held-back text)
                built = self.delta_choice(index, sample.text, logprobs, sample)
                if built is not None:
                    choices.append(built)
        return choices

    def final(self, outs: dict[int, Any]) -> dict:
        choices = []
        self.num_completion_tokens = sum(len(c.token_ids) for out in outs.values() for c in out.outputs)
        self.num_cached = {i: out.num_cached_tokens or 0 for i, out in outs.items()}
        for prompt_idx in sorted(outs):
            for completion in outs[prompt_idx].outputs:
                index = prompt_idx * self.n + completion.index
                entries = None if completion.logprobs is None else \
                    [{t: lp.logprob for t, lp in entry.items()} for entry in completion.logprobs]
                logprobs, _ = self.logprobs(completion.token_ids, entries, 0)
                choices.append(self.final_choice(index, prompt_idx, completion, logprobs))
        choices.sort(key=lambda c: c["index"])
        return {"id": self.request_id, "object": self.object_name, "created": self.created, "model": self.model,
                "choices": choices, "usage": self.usage()}

    # Filled in by the two APIs.
    def logprobs(self, token_ids: list[int], entries: list[dict[int, float]] | None,
                 offset: int) -> tuple[dict | None, int]:
        """Logprobs of these output tokens (entries: one per token, or None when off) and
        the text offset after them."""
        raise NotImplementedError

    def delta_choice(self, index: int, text: str, logprobs: dict | None, sample: Any) -> dict | None:
        """A stream chunk's choice, or None when it would carry nothing."""
        raise NotImplementedError

    def final_choice(self, index: int, prompt_idx: int, completion: Any, logprobs: dict | None) -> dict:
        raise NotImplementedError


class CompletionFormatter(_Formatter):
    object_name = "text_completion"
    chunk_object = "text_completion"

    def __init__(self, *args: Any, logprobs: int | None, echo: bool, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.num_logprobs = logprobs
        self.echo = echo

    def stream_start(self) -> list[dict]:
        if not self.echo:
            return []
        return [{"index": p * self.n + j, "text": text, "logprobs": None, "finish_reason": None}
                for p, text in enumerate(self.prepared.prompt_texts) for j in range(self.n)]

    def logprobs(self, token_ids: list[int], entries: list[dict[int, float]] | None,
                 offset: int) -> tuple[dict | None, int]:
        if self.num_logprobs is None or entries is None:
            return None, offset
        result: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for token_id, entry in zip(token_ids, entries):
            entry = entry or {}
            token = self.token_str(token_id)
            result["tokens"].append(token)
            result["token_logprobs"].append(entry.get(token_id))
            top = {self.token_str(t): lp for t, lp in _top(entry, self.num_logprobs)}
            top.setdefault(token, entry.get(token_id))
            result["top_logprobs"].append(top)
            result["text_offset"].append(offset)
            offset += len(token)
        return result, offset

    def delta_choice(self, index: int, text: str, logprobs: dict | None, sample: Any) -> dict:
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": sample.finish_reason,
                "stop_reason": sample.stop_reason}

    def final_choice(self, index: int, prompt_idx: int, completion: Any, logprobs: dict | None) -> dict:
        text = (self.prepared.prompt_texts[prompt_idx] if self.echo else "") + completion.text
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": completion.finish_reason,
                "stop_reason": completion.stop_reason}


class ChatFormatter(_Formatter):
    object_name = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def __init__(self, *args: Any, top_logprobs: int | None, echo: str = "",
                 tool_parser: ToolParser | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.top_logprobs = top_logprobs   # None = logprobs off
        self.echo = echo                   # vLLM's chat echo: the last assistant message, repeated first
        self.tool_parser = tool_parser     # reads tool calls out of the answer (tool_stream.py); None = plain text
        self.tool_streams: dict[int, ToolCallStream] = {}

    def stream_start(self) -> list[dict]:
        return [{"index": j, "delta": {"role": "assistant", "content": self.echo}, "logprobs": None,
                 "finish_reason": None} for j in range(self.n)]

    def _token_entry(self, token_id: int, logprob: float | None) -> dict:
        token = self.token_str(token_id)
        return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}

    def logprobs(self, token_ids: list[int], entries: list[dict[int, float]] | None,
                 offset: int) -> tuple[dict | None, int]:
        if self.top_logprobs is None or entries is None:
            return None, offset
        content = []
        for token_id, entry in zip(token_ids, entries):
            entry = entry or {}
            item = self._token_entry(token_id, entry.get(token_id))
            item["top_logprobs"] = [self._token_entry(t, lp) for t, lp in _top(entry, self.top_logprobs)]
            content.append(item)
        return {"content": content}, offset

    def delta_choice(self, index: int, text: str, logprobs: dict | None, sample: Any) -> dict | None:
        finish = sample.finish_reason
        if self.tool_parser is None:
            delta = {"content": text} if text else {}
        else:
            stream = self.tool_streams.setdefault(index, ToolCallStream(self.tool_parser))
            delta = stream.feed(text, final=finish is not None)
            finish = finish_reason(finish, stream.made_calls)
            if not delta and logprobs is None and finish is None:
                return None
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish,
                "stop_reason": sample.stop_reason}

    def final_choice(self, index: int, prompt_idx: int, completion: Any, logprobs: dict | None) -> dict:
        message: dict[str, Any] = {"role": "assistant", "content": self.echo + completion.text}
        finish = completion.finish_reason
        if self.tool_parser is not None:
            message, made_calls = tool_message(self.tool_parser, self.echo + completion.text)
            finish = finish_reason(finish, made_calls)
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish,
                "stop_reason": completion.stop_reason}
