"""Reads and checks a request body before any engine sees it.

The body's size and read deadline are checked before this, by
pagedkube.http_limits.BodyLimits in front of the whole app (413 / 408).
The gateway checks only what it needs to route and what it can answer alone
(JSON, the model name, the fields it reads); the engine validates the
rest and its 400s pass through unchanged.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Container

from pagedkube.gateway.errors import bad_request, model_not_found
from pagedkube.unicode_text import MESSAGE as TEXT_NOT_UNICODE
from pagedkube.unicode_text import field_path, lone_surrogate

KINDS = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}


@dataclass(slots=True)
class ParsedRequest:
    kind: str            # "chat" | "completion"
    raw: bytes           # the body as received (forwarded as is unless a field is set)
    body: dict
    model: str | None
    stream: bool

    def forward_body(self, cache_salt: str | None) -> bytes:
        """The body to send upstream: the tenant's cache salt replaces any the client sent."""
        if cache_salt is None:
            return self.raw
        body = dict(self.body)
        body["cache_salt"] = cache_salt
        return json.dumps(body).encode()


def parse_request(path: str, raw: bytes, known_models: Container[str] | None) -> ParsedRequest:
    """`known_models`: the models the engines serve, or None while unknown
    (then any model name is forwarded and the engine decides)."""
    kind = KINDS[path]
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"request body is not valid JSON: {e}") from None
    except RecursionError:   # the C parser's depth guard: [[[[...]]]] thousands deep
        raise bad_request("request body is not valid JSON: nested too deeply") from None
    if not isinstance(body, dict):
        raise bad_request(f"request body must be a JSON object, got {type(body).__name__}")
    if (loc := lone_surrogate(raw, body)) is not None:   # before anything encodes it (pagedkube/unicode_text.py)
        raise bad_request(f"{field_path(loc)}: {TEXT_NOT_UNICODE}", field_path(loc))
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_request("'model' must be a string", "model")
    if model is not None and known_models is not None and model not in known_models:
        raise model_not_found(model)
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean", "stream")
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise bad_request("'messages' must be a non-empty list", "messages")
        if not all(isinstance(m, dict) for m in messages):
            raise bad_request("each message must be an object", "messages")
    else:
        if "prompt" not in body:
            raise bad_request("'prompt' is required", "prompt")
    salt = body.get("cache_salt")
    if salt is not None and not isinstance(salt, str):
        raise bad_request("'cache_salt' must be a string", "cache_salt")
    return ParsedRequest(kind=kind, raw=raw, body=body, model=model, stream=stream)
