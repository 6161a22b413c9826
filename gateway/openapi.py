"""The gateway's OpenAPI document: FastAPI's (models, health, ready, metrics) plus
the two proxied routes, which bypass FastAPI (gateway/fast_path.py) and so would
be missing from it.

The request bodies say what the gateway itself reads (the model, the prompt or
messages, stream, cache_salt) and allow every other field: the engine validates
the rest, and its answers pass through. A client generator or a fuzzer
(tests/gateway/test_fuzz_gateway.py) reads this document.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}}

_TOKEN_IDS = {"type": "array", "items": {"type": "integer"}}
_COMMON = {
    "model": {"type": "string"},
    "stream": {"type": ["boolean", "null"]},
    "max_tokens": {"type": ["integer", "null"]},
    "cache_salt": {"type": "string"},
}
COMPLETION_REQUEST = {
    "type": "object", "required": ["prompt"], "additionalProperties": True,
    "properties": {**_COMMON, "prompt": {"anyOf": [
        {"type": "string"}, {"type": "array", "items": {"type": "string"}}, _TOKEN_IDS,
        {"type": "array", "items": _TOKEN_IDS}]}},
}
CHAT_REQUEST = {
    "type": "object", "required": ["messages"], "additionalProperties": True,
    "properties": {**_COMMON, "messages": {"type": "array", "minItems": 1, "items": {
        "type": "object", "required": ["role"], "additionalProperties": True,
        "properties": {"role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
                       "content": {"anyOf": [{"type": "string"}, {"type": "null"}, {"type": "array", "items": {
                           "type": "object", "properties": {"type": {"type": "string"},
                                                            "text": {"type": "string"}}}}]},
                       "name": {"type": "string"}}}},
        "add_generation_prompt": {"type": "boolean"},
        "chat_template_kwargs": {"type": "object"}},
}


def _with_models(schema: dict, models: list[str]) -> dict:
    """`model` restricted to the models the engines serve now (another gets 404)."""
    if not models:
        return schema
    return {**schema, "properties": {**schema["properties"], "model": {"type": "string", "enum": models}}}


def _operation(summary: str, schema: dict) -> dict:
    error = {"content": {"application/json": {"schema": _ERROR}}}
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
        "responses": {
            "200": {"description": "The engine's answer, passed through (JSON, or SSE with stream: true)",
                    "content": {"application/json": {"schema": {"type": "object"}},
                                "text/event-stream": {"schema": {"type": "string"}}}},
            **{code: {"description": text, **error} for code, text in (
                ("400", "Bad request (the gateway's or the engine's)"), ("401", "Missing or wrong API key"),
                ("404", "Unknown model"), ("408", "The body did not arrive in time"),
                ("413", "Body too large"), ("429", "Rate limited"),
                ("502", "No engine reachable, or an engine failed"), ("503", "No engine ready"),
                ("504", "The engine did not answer in time"))},
        },
    }}


def install(app: FastAPI, models: Callable[[], Iterable[str] | None],
            authorized: Callable[[Request], bool] = lambda _: True) -> None:
    """Serves /openapi.json (the app must be made with openapi_url=None) with the proxied
    routes; `models()` names the models the engines serve (None while unknown), shown only
    to a request `authorized` says holds a key: without one the document names no model.
    Built on each call, as the models change: the document is rarely asked for."""

    def openapi(with_models: bool = True) -> dict[str, Any]:
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        known = sorted(models() or ()) if with_models else []
        schema.setdefault("paths", {}).update({
            "/v1/completions": _operation("Completions, routed to an engine",
                                          _with_models(COMPLETION_REQUEST, known)),
            "/v1/chat/completions": _operation("Chat completions, routed to an engine",
                                               _with_models(CHAT_REQUEST, known)),
        })
        return schema

    async def document(request: Request) -> Response:
        return JSONResponse(openapi(with_models=authorized(request)))

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend the schema
    app.add_route("/openapi.json", document, include_in_schema=False)
