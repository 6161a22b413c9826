"""OpenAI's error shape and the codes our servers put in it, for the engine and the gateway.

Every failure either server answers is `{"error": {"message", "type", "param", "code"}}`:
the official `openai` client reads those four fields and raises `BadRequestError`,
`AuthenticationError`, `NotFoundError`, ... by status. `type` follows from the status as in
OpenAI's own API; `code` is a string or null, never the status number.

The engine's codes are also a contract with the gateway: an engine answers 503 with
`draining` (after SIGTERM) or `not_ready` (not loaded, or its core unhealthy) before it
starts any work, so a gateway may send that request on to another engine
(`DID_NOT_START`); any other 5xx may have done work and is the client's to see.

Torch-free and dependency-free: the engine server (engine/server/errors.py, with its
FastAPI handlers) and the gateway (gateway/errors.py) each build their answers from here.
"""
from __future__ import annotations

import json
from typing import Any

# HTTP status -> OpenAI error type, where it is not the default of `error_type`.
ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    429: "rate_limit_exceeded",
    503: "service_unavailable",
}

# error.code values (docs/interfaces.md "Processes and flags", docs/server.md).
DRAINING = "draining"                  # engine, 503: after SIGTERM, going away
NOT_READY = "not_ready"                # engine, 503: not loaded yet, or its core is unhealthy
QUEUE_FULL = "queue_full"              # engine, 503: the waiting queue is past --max-waiting
SHUTTING_DOWN = "shutting_down"        # engine, 503: stopped while the request was queued or running
ENGINE_DEAD = "engine_dead"            # engine, 500/503: the engine-core process died
ENGINE_UNHEALTHY = "engine_unhealthy"  # engine /health, 500
NO_TOKENIZER = "no_tokenizer"          # engine /v1/cache/tokenizer, 404: the model has no tokenizer.json
MODEL_NOT_FOUND = "model_not_found"    # 404, both
INVALID_API_KEY = "invalid_api_key"    # 401, both
RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"   # gateway, 429

# The engine's 503s that mean "no work was done here: try another engine" (gateway/proxy.py).
DID_NOT_START = frozenset({DRAINING, NOT_READY})


def error_type(status: int) -> str:
    """OpenAI's `type` for an HTTP status."""
    return ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def error_body(status: int, message: str, code: str | None = None, *, param: str | None = None) -> dict[str, Any]:
    """The JSON object of an error answer. `code` may be positional (pagedkube.http_limits.BodyLimits
    calls `error(status, message, code)`); `param` is keyword-only, so the two cannot swap."""
    assert code is None or isinstance(code, str), code
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}


def sse_error_event(body: dict[str, Any]) -> str:
    """The server-sent event that ends a stream which failed after its headers went out
    (no `data: [DONE]` follows it)."""
    return f"data: {json.dumps(body)}\n\n"
