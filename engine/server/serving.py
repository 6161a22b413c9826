"""From a validated request body to engine requests, and back.

`prepare_*` tokenize, check lengths and build SamplingParams (every problem is a
400 naming the field, before anything reaches the engine). `Generation` owns the
engine requests of one HTTP request: it submits them, yields their outputs and,
whatever way the HTTP request ends (done, error, client gone), aborts what is
still running exactly once so the blocks go back to the pool.
"""
from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator

from fastapi import Request

from pagedkube.engine.sampling_params import SamplingParams
from pagedkube.engine.server.streams import RequestStream, StreamAborted, StreamError
from pagedkube.engine.server.errors import APIError, bad_request
from pagedkube.engine.server.protocol import ChatCompletionRequest, CompletionRequest
from pagedkube.engine.server.state import ServerState

# vLLM treats temperatures below this as greedy (dividing logits by ~0 overflows).
MIN_TEMPERATURE = 1e-5


@dataclass
class Prepared:
    prompt_ids: list[list[int]]
    prompt_texts: list[str]
    params: SamplingParams
    cache_salt: str | None


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def _max_tokens(state: ServerState, num_prompt_tokens: int, requested: int | None,
                field: str, prompt_field: str) -> int:
    max_model_len = state.info.max_model_len
    if num_prompt_tokens == 0:
        raise bad_request(f"{prompt_field} must not be empty (it has 0 tokens)", prompt_field)
    if num_prompt_tokens >= max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens, and {prompt_field} has "
            f"{num_prompt_tokens} tokens: no room to generate. Please shorten {prompt_field}.", prompt_field)
    # The KV pool must hold the whole request, alone (the engine rejects it otherwise):
    # every token but the last sampled one needs a slot.
    pool_tokens = state.info.num_kv_blocks * state.info.block_size
    if num_prompt_tokens > pool_tokens:
        raise bad_request(f"{prompt_field} has {num_prompt_tokens} tokens but the KV cache holds only "
                          f"{pool_tokens}", prompt_field)
    room = min(max_model_len - num_prompt_tokens, pool_tokens - num_prompt_tokens + 1)
    if requested is None:
        return room
    if num_prompt_tokens + requested > max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{num_prompt_tokens + requested} tokens ({num_prompt_tokens} in {prompt_field}, {requested} in "
            f"{field}). Please reduce the length of {prompt_field} or {field}.", field)
    if requested > room:
        raise bad_request(f"{field}: {num_prompt_tokens} prompt tokens + {requested} new tokens do not fit in "
                          f"the KV cache ({pool_tokens} tokens); at most {room} new tokens", field)
    return requested


def _sampling_params(state: ServerState, req: CompletionRequest | ChatCompletionRequest,
                     max_tokens: int, logprobs: int | None) -> SamplingParams:
    temperature = 1.0 if req.temperature is None else req.temperature
    if temperature < MIN_TEMPERATURE:
        temperature = 0.0
    vocab_size = state.info.vocab_size
    top_k = req.top_k or 0
    if top_k > vocab_size:
        top_k = 0  # keeping more tokens than the vocabulary has is no filter at all
    try:
        return SamplingParams(
            n=req.n, temperature=temperature, top_p=1.0 if req.top_p is None else req.top_p,
            top_k=top_k, min_p=req.min_p or 0.0, seed=req.seed, stop=req.stop,
            stop_token_ids=req.stop_token_ids, max_tokens=max_tokens, min_tokens=req.min_tokens,
            ignore_eos=req.ignore_eos, logprobs=logprobs,
            include_stop_str_in_output=req.include_stop_str_in_output,
            skip_special_tokens=req.skip_special_tokens)
    except ValueError as exc:
        field = str(exc).split(" ", 1)[0]
        raise bad_request(str(exc), field if field in type(req).model_fields else None) from exc


def _check_token_ids(state: ServerState, ids: list[int], field: str) -> None:
    vocab_size = state.info.vocab_size
    bad = next((t for t in ids if t >= vocab_size), None)
    if bad is not None:
        raise bad_request(f"{field}: token id {bad} is out of range (vocabulary size {vocab_size})", field)


def tokenizer_for(state: ServerState, field: str) -> Any:
    if state.info.tokenizer is None:
        raise bad_request(f"this model has no tokenizer (no tokenizer.json): {field} must be token ids", field)
    return state.info.tokenizer


def prepare_completion(state: ServerState, req: CompletionRequest) -> Prepared:
    tokenizer = state.info.tokenizer
    prompt_ids, prompt_texts = [], []
    for prompt in req.prompts():
        if isinstance(prompt, str):
            ids = tokenizer_for(state, "prompt").encode(prompt, add_special_tokens=req.add_special_tokens)
            text = prompt
        else:
            _check_token_ids(state, prompt, "prompt")
            ids = list(prompt)
            text = tokenizer.decode(prompt, skip_special_tokens=False) if req.echo and tokenizer else ""
        prompt_ids.append(ids)
        prompt_texts.append(text)
    # One SamplingParams for the batch: size max_tokens for the longest prompt.
    longest = max(len(ids) for ids in prompt_ids)
    shortest = min(len(ids) for ids in prompt_ids)
    if shortest == 0:
        raise bad_request("prompt must not be empty (it has 0 tokens)", "prompt")
    max_tokens = _max_tokens(state, longest, req.max_tokens, "max_tokens", "prompt")
    params = _sampling_params(state, req, max_tokens, req.logprobs)
    return Prepared(prompt_ids, prompt_texts, params, req.cache_salt)


def render_chat(state: ServerState, messages: list[dict], add_generation_prompt: bool,
                kwargs: dict | None) -> str:
    try:
        return tokenizer_for(state, "messages").render_chat(messages, add_generation_prompt, **(kwargs or {}))
    except Exception as exc:  # noqa: BLE001 - a template error is the request's fault
        raise bad_request(f"messages could not be rendered with the chat template: {exc}", "messages") from exc


def prepare_chat(state: ServerState, req: ChatCompletionRequest) -> Prepared:
    text = render_chat(state, req.template_messages(), req.add_generation_prompt, req.chat_template_kwargs)
    ids = state.chat_encoder().encode(text)
    requested, field = req.requested_max_tokens
    max_tokens = _max_tokens(state, len(ids), requested, field, "messages")
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    params = _sampling_params(state, req, max_tokens, logprobs)
    return Prepared([ids], [text], params, req.cache_salt)


class Generation:
    """The engine requests behind one HTTP request (one per prompt, each with n samples)."""

    def __init__(self, state: ServerState, request_id: str, prepared: Prepared):
        self.state = state
        self.request_id = request_id
        self.prepared = prepared
        self.engine_ids = [f"{request_id}-{i}" for i in range(len(prepared.prompt_ids))]
        self._pending = set(self.engine_ids)
        self._stream: RequestStream | None = None
        self._closed = False

    def start(self) -> None:
        """Submits the requests; raises APIError 503 when draining or the queue is full."""
        self.state.check_accepting()
        self._stream = RequestStream(asyncio.get_running_loop())
        p = self.prepared
        self.state.engine.add_requests(
            [(rid, ids, p.params, p.cache_salt) for rid, ids in zip(self.engine_ids, p.prompt_ids)],
            self._stream, max_waiting=self.state.config.max_waiting)
        self.state.in_flight += 1

    async def updates(self) -> AsyncIterator[tuple[int, Any]]:
        """Yields (prompt index, cumulative RequestOutput) until every request finished."""
        assert self._stream is not None, "start() first"
        index = {rid: i for i, rid in enumerate(self.engine_ids)}
        while self._pending:
            latest: dict[str, Any] = {}
            for item in await self._stream.get():
                if isinstance(item, StreamError):
                    self._pending.discard(item.request_id)
                    raise item.error
                if isinstance(item, StreamAborted):
                    self._pending.discard(item.request_id)
                    raise APIError(503, "the request was aborted: the server is shutting down",
                                   headers={"Retry-After": "1"})
                latest[item.request_id] = item
            for rid, out in latest.items():
                if out.finished:
                    self._pending.discard(rid)
                yield index[rid], out

    def close(self) -> None:
        """Idempotent: aborts unfinished requests and ends this request's in-flight count."""
        if self._closed or self._stream is None:
            return
        self._closed = True
        if self._pending:
            self.state.engine.abort(sorted(self._pending))
            self._pending.clear()
        self.state.in_flight -= 1


class ClientDisconnected(Exception):
    pass


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def collect(gen: Generation, request: Request) -> dict[int, Any]:
    """Runs a non-streaming generation to the end, aborting it if the client goes away."""
    final: dict[int, Any] = {}

    async def consume() -> None:
        async with contextlib.aclosing(gen.updates()) as updates:
            async for prompt_idx, out in updates:
                final[prompt_idx] = out

    consumer = asyncio.ensure_future(consume())
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({consumer, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (consumer, watcher):
            task.cancel()
        await asyncio.gather(consumer, watcher, return_exceptions=True)
        gen.close()
    if not consumer.cancelled() and consumer.exception() is not None:
        raise consumer.exception()
    if len(final) < len(gen.engine_ids) or not all(o.finished for o in final.values()):
        raise ClientDisconnected()
    return final
