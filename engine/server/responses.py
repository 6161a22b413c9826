"""OpenAI response and stream-chunk shapes for completions and chat completions.

The engine's outputs are cumulative; a formatter remembers, per choice, how much
text and how many tokens it already sent and turns each new output into deltas.
Choice index = prompt index * n + sample index (OpenAI's order for batches).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pagedkube.engine.server.serving import Prepared


@dataclass
class _Sent:
    text: int = 0        # characters of the cumulative text already sent
    tokens: int = 0      # tokens already sent (for logprobs)
    offset: int = 0      # completions text_offset of the next token
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
        self.latest: dict[int, Any] = {}
        self.sent: dict[int, _Sent] = {}

    def token_str(self, token_id: int) -> str:
        if self.tokenizer is None:  # a model without tokenizer.json: vLLM's "token_id:N" spelling
            return f"token_id:{token_id}"
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def usage(self) -> dict:
        prompt = sum(len(ids) for ids in self.prepared.prompt_ids)
        completion = sum(len(c.token_ids) for out in self.latest.values() for c in out.outputs)
        cached = sum(out.num_cached_tokens or 0 for out in self.latest.values())
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached}}

    def chunk(self, choices: list[dict], usage: dict | None = None, include_usage: bool = False) -> dict:
        body = {"id": self.request_id, "object": self.chunk_object, "created": self.created,
                "model": self.model, "choices": choices}
        if include_usage:
            body["usage"] = usage
        return body

    def stream_update(self, prompt_idx: int, out: Any) -> list[dict]:
        """The choice deltas that `out` adds to what was sent."""
        self.latest[prompt_idx] = out
        choices = []
        for completion in out.outputs:
            index = prompt_idx * self.n + completion.index
            sent = self.sent.setdefault(index, _Sent())
            if sent.finished:
                continue
            text = completion.text
            delta = text[sent.text:] if len(text) >= sent.text else ""
            new_tokens = len(completion.token_ids) - sent.tokens
            finish = completion.finish_reason
            if not delta and new_tokens <= 0 and finish is None:
                continue
            logprobs, sent.offset = self.logprobs(completion, sent.tokens, len(completion.token_ids), sent.offset)
            sent.text = max(sent.text, len(text))
            sent.tokens = len(completion.token_ids)
            sent.finished = finish is not None
            if delta or logprobs is not None or finish is not None:  # no empty chunks (held-back text)
                choices.append(self.delta_choice(index, delta, logprobs, completion))
        return choices

    def final(self, outs: dict[int, Any]) -> dict:
        self.latest = dict(outs)
        choices = []
        for prompt_idx in sorted(outs):
            for completion in outs[prompt_idx].outputs:
                index = prompt_idx * self.n + completion.index
                logprobs, _ = self.logprobs(completion, 0, len(completion.token_ids), 0)
                choices.append(self.final_choice(index, prompt_idx, completion, logprobs))
        choices.sort(key=lambda c: c["index"])
        return {"id": self.request_id, "object": self.object_name, "created": self.created, "model": self.model,
                "choices": choices, "usage": self.usage()}

    # Filled in by the two APIs.
    def logprobs(self, completion: Any, start: int, end: int, offset: int) -> tuple[dict | None, int]:
        """Logprobs of output tokens [start, end) and the text offset after them."""
        raise NotImplementedError

    def delta_choice(self, index: int, delta: str, logprobs: dict | None, completion: Any) -> dict:
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

    def logprobs(self, completion: Any, start: int, end: int, offset: int) -> tuple[dict | None, int]:
        if self.num_logprobs is None or completion.logprobs is None:
            return None, offset
        result: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for i in range(start, min(end, len(completion.logprobs))):
            token_id = completion.token_ids[i]
            entry = completion.logprobs[i] or {}
            token = self.token_str(token_id)
            result["tokens"].append(token)
            result["token_logprobs"].append(entry.get(token_id))
            top = {self.token_str(t): lp for t, lp in _top(entry, self.num_logprobs)}
            top.setdefault(token, entry.get(token_id))
            result["top_logprobs"].append(top)
            result["text_offset"].append(offset)
            offset += len(token)
        return result, offset

    def delta_choice(self, index: int, delta: str, logprobs: dict | None, completion: Any) -> dict:
        return {"index": index, "text": delta, "logprobs": logprobs, "finish_reason": completion.finish_reason,
                "stop_reason": completion.stop_reason}

    def final_choice(self, index: int, prompt_idx: int, completion: Any, logprobs: dict | None) -> dict:
        text = (self.prepared.prompt_texts[prompt_idx] if self.echo else "") + completion.text
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": completion.finish_reason,
                "stop_reason": completion.stop_reason}


class ChatFormatter(_Formatter):
    object_name = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def __init__(self, *args: Any, top_logprobs: int | None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.top_logprobs = top_logprobs   # None = logprobs off

    def stream_start(self) -> list[dict]:
        return [{"index": j, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                 "finish_reason": None} for j in range(self.n)]

    def _token_entry(self, token_id: int, logprob: float | None) -> dict:
        token = self.token_str(token_id)
        return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}

    def logprobs(self, completion: Any, start: int, end: int, offset: int) -> tuple[dict | None, int]:
        if self.top_logprobs is None or completion.logprobs is None:
            return None, offset
        content = []
        for i in range(start, min(end, len(completion.logprobs))):
            token_id = completion.token_ids[i]
            entry = completion.logprobs[i] or {}
            item = self._token_entry(token_id, entry.get(token_id))
            item["top_logprobs"] = [self._token_entry(t, lp) for t, lp in _top(entry, self.top_logprobs)]
            content.append(item)
        return {"content": content}, offset

    def delta_choice(self, index: int, delta: str, logprobs: dict | None, completion: Any) -> dict:
        return {"index": index, "delta": {"content": delta} if delta else {}, "logprobs": logprobs,
                "finish_reason": completion.finish_reason, "stop_reason": completion.stop_reason}

    def final_choice(self, index: int, prompt_idx: int, completion: Any, logprobs: dict | None) -> dict:
        return {"index": index, "message": {"role": "assistant", "content": completion.text},
                "logprobs": logprobs, "finish_reason": completion.finish_reason,
                "stop_reason": completion.stop_reason}
