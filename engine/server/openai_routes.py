"""The OpenAI-compatible routes: completions, chat completions, models, tokenize."""
from __future__ import annotations

import contextlib
import json
import logging
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from pagedkube.engine.lora.request import LoRARequest
from pagedkube.engine.server.access_log import observe_generation
from pagedkube.engine.server.errors import APIError, sse_error_event
from pagedkube.engine.server.protocol import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest,
                                              TokenizeChatRequest, TokenizeRequest)
from pagedkube.engine.server.responses import ChatFormatter, CompletionFormatter
from pagedkube.engine.server.lora_routes import adapter_cards
from pagedkube.engine.server.generation import ClientDisconnected, Generation, collect, new_request_id
from pagedkube.engine.server.prepare import Prepared, prepare, render_chat, tokenizer_for, tool_output_parser
from pagedkube.engine.server.state import ServerState
from pagedkube.engine.server.text_check import TextCheckedRoute

logger = logging.getLogger(__name__)
router = APIRouter(route_class=TextCheckedRoute)   # 400 for text that is not Unicode (text_check.py)


def _state(request: Request) -> ServerState:
    return request.app.state.server


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def _stream(gen: Generation, fmt: Any, include_usage: bool, continuous: bool,
                  updates: AsyncIterator[tuple[int, Any]]) -> AsyncIterator[str]:
    try:
        start = "".join(_sse(fmt.chunk([choice], None, include_usage)) for choice in fmt.stream_start())
        if start:
            yield start
        async with contextlib.aclosing(updates):
            async for prompt_idx, out in updates:
                # One chunk per choice (clients read choices[0]), one write per update.
                events = "".join(_sse(fmt.chunk([choice], fmt.usage() if continuous else None, include_usage))
                                 for choice in fmt.stream_update(prompt_idx, out))
                if events:
                    yield events
        if include_usage:
            yield _sse(fmt.chunk([], fmt.usage(), True))
        yield "data: [DONE]\n\n"
    except APIError as exc:
        yield sse_error_event(exc)   # and no [DONE]: the answer is not whole (docs/interfaces.md)
    finally:
        gen.close()


async def _respond(request: Request, gen: Generation, fmt: Any, body: Any) -> Response:
    observe_generation(request, gen)
    gen.start()
    if body.stream:
        async def close() -> None:  # async: runs on the event loop, not in a worker thread
            gen.close()
        updates = gen.updates()
        if gen.prepared.params.structured_outputs is not None:
            updates = await _first_update_before_headers(gen, updates)
        return StreamingResponse(_stream(gen, fmt, body.include_usage, body.continuous_usage, updates),
                                 media_type="text/event-stream", background=BackgroundTask(close))
    try:
        outs = await collect(gen, request)
    except ClientDisconnected:
        return Response(status_code=499)  # nobody reads it; nginx's "client closed request"
    return JSONResponse(fmt.final(outs))


async def _first_update_before_headers(gen: Generation, updates: AsyncIterator[tuple[int, Any]]) \
        -> AsyncIterator[tuple[int, Any]]:
    """A constrained request can still fail before it runs (its grammar did not compile in
    time): wait for its first update, so that failure is a 400 rather than an error event after
    a 200. Returns the updates with the first one put back in front."""
    try:
        first = await anext(updates)
    except StopAsyncIteration:
        first = None
    except BaseException:
        await updates.aclose()
        gen.close()
        raise

    async def chained() -> AsyncIterator[tuple[int, Any]]:
        try:
            if first is not None:
                yield first
                async for item in updates:
                    yield item
        finally:
            await updates.aclose()

    return chained()


async def _checked_and_prepared(request: Request, body: CompletionRequest | ChatCompletionRequest) \
        -> tuple[ServerState, Prepared, LoRARequest | None]:
    """The checks every generation request passes, then its prompt tokenized and its limits applied;
    the adapter the request's `model` names (None: the base model)."""
    state = _state(request)
    state.check_accepting()
    lora = state.check_model(body.model)
    body.check_supported()
    state.warn_unknown_fields(body)
    return state, await prepare(state, body), lora


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request) -> Response:
    state, prepared, lora = await _checked_and_prepared(request, body)
    request_id = new_request_id("cmpl")
    fmt = CompletionFormatter(request_id, lora.lora_name if lora else state.model_name, prepared, state.info.tokenizer, body.n,
                              logprobs=body.logprobs, echo=body.echo)
    return await _respond(request, Generation(state, request_id, prepared, lora), fmt, body)


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    state, prepared, lora = await _checked_and_prepared(request, body)
    request_id = new_request_id("chatcmpl")
    top = (body.top_logprobs or 0) if body.logprobs else None
    last = body.messages[-1].to_template()
    echo = last["content"] if body.echo and last["role"] == "assistant" else ""
    fmt = ChatFormatter(request_id, lora.lora_name if lora else state.model_name, prepared, state.info.tokenizer, body.n, top_logprobs=top,
                        echo=echo, tool_parser=tool_output_parser(state, body))
    return await _respond(request, Generation(state, request_id, prepared, lora), fmt, body)


def _model_card(state: ServerState) -> dict:
    return {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "pagedkube",
            "root": state.config.engine.model or state.info.model_name, "parent": None,
            "max_model_len": state.info.max_model_len}


@router.get("/version")
async def version() -> dict:
    """vLLM's /version: the server's version."""
    from pagedkube import __version__
    return {"version": __version__}


@router.get("/v1/models")
async def list_models(request: Request) -> dict:
    state = _state(request)
    return {"object": "list", "data": [_model_card(state), *adapter_cards(state)]}


@router.get("/v1/models/{model:path}")
async def retrieve_model(model: str, request: Request) -> dict:
    state = _state(request)
    if state.check_model(model) is not None:
        return next(card for card in adapter_cards(state) if card["id"] == model)
    return _model_card(state)


def _loaded_state(request: Request, model: str | None) -> ServerState:
    """The server state once the model is loaded (`state.info` answers 503 before), `model` checked."""
    state = _state(request)
    state.info                       # 503 not_ready until the engine is built  # noqa: B018
    state.check_model(model)
    return state


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> dict:
    """vLLM's shape: {"count", "max_model_len", "tokens", "token_strs"}."""
    state = _loaded_state(request, body.model)
    tokenizer = tokenizer_for(state, "messages" if isinstance(body, TokenizeChatRequest) else "prompt")
    if isinstance(body, TokenizeChatRequest):
        text = render_chat(state, [m.to_template() for m in body.messages], body.add_generation_prompt,
                           body.template_kwargs())
    else:
        text = body.prompt
    tokens = tokenizer.encode(text, add_special_tokens=body.add_special_tokens)
    token_strs = [tokenizer.id_to_token(t) for t in tokens] if body.return_token_strs else None
    return {"count": len(tokens), "max_model_len": state.info.max_model_len, "tokens": tokens,
            "token_strs": token_strs}


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> dict:
    state = _loaded_state(request, body.model)
    tokenizer = tokenizer_for(state, "tokens")
    bad = next((t for t in body.tokens if t >= state.info.vocab_size), None)
    if bad is not None:
        raise APIError(400, f"tokens: token id {bad} is out of range (vocabulary size {state.info.vocab_size})",
                       param="tokens")
    return {"prompt": tokenizer.decode(body.tokens, skip_special_tokens=False)}
