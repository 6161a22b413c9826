"""OpenAI-shaped errors: every failure the server returns is `{"error": {...}}`.

The official `openai` client reads `message`, `type`, `param` and `code` from this
object and raises `BadRequestError`, `AuthenticationError`, `NotFoundError`, ...
by status code. Validation errors name the field in both `param` and `message`,
so a user sees which argument to fix.
"""
from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)

# error.code of the 503s an engine answers before a request starts (docs/interfaces.md): it
# did no work, so a gateway sends the request on to another engine (gateway/proxy.py).
DRAINING = "draining"     # after SIGTERM: this engine is going away
NOT_READY = "not_ready"   # not loaded yet, or its core is unhealthy

# HTTP status -> OpenAI error type (the strings OpenAI's API itself returns).
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",   # the client was too slow: its request, not the server, failed
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    431: "invalid_request_error",
    429: "rate_limit_exceeded",
    500: "server_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """An error to return to the client; raise it from any handler."""

    def __init__(self, status_code: int, message: str, *, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


def error_body(status_code: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status_code, "server_error"),
                      "param": param, "code": code}}


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(error_body(err.status_code, err.message, err.param, err.code),
                        status_code=err.status_code, headers=err.headers)


def sse_error_event(err: APIError) -> str:
    """The event a stream sends when it fails after its headers went out."""
    return f"data: {json.dumps(error_body(err.status_code, err.message, err.param, err.code))}\n\n"


def _field_path(loc: tuple[Any, ...]) -> str:
    # loc is ("body", "messages", 0, "content") -> "messages[0].content"; union members
    # add the member type or tag name ("list[int]", "Chat"), which tells a user nothing:
    # drop them (API field names are lower case).
    parts: list[str] = []
    for item in loc[1:] if loc and loc[0] in ("body", "query", "path") else loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif "[" in str(item) or str(item)[:1].isupper() or str(item).startswith(("function-", "literal[")) or str(item) in (
                "str", "int", "float", "bool", "dict", "list", "none"):
            continue
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts)


def validation_error(exc: RequestValidationError) -> APIError:
    errors = exc.errors()
    if not errors:
        return bad_request("invalid request body")
    first = errors[0]
    kind = first.get("type", "")
    if kind == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return bad_request(f"Malformed JSON body: {detail}".rstrip(": "))
    field = _field_path(tuple(first.get("loc", ())))
    if kind == "extra_forbidden":
        return bad_request(f"Unrecognized request argument supplied: {field}", param=field)
    if kind == "missing" and not field:
        return bad_request("Request body is required (a JSON object)")
    if kind == "model_attributes_type" and not field:
        return bad_request("Request body must be a JSON object")
    msg = first.get("msg", "invalid value")
    return bad_request(f"{field}: {msg}" if field else msg, param=field or None)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        if exc.status_code == 404:
            message = "Not Found: no such route"
        return error_response(APIError(exc.status_code, message, headers=getattr(exc, "headers", None)))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error")
        return error_response(APIError(500, f"Internal server error: {type(exc).__name__}"))
