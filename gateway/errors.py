"""OpenAI-shaped error bodies: {"error": {"message", "type", "param", "code"}}, with
the `type` strings OpenAI's API (and our engine server, engine/server/errors.py) uses.
`code` is a string or null, as OpenAI's and the engine's are (never the status number)."""
from __future__ import annotations

import json

from starlette.responses import Response

from pagedkube.echo import echo

# HTTP status -> OpenAI error type, as engine/server/errors.py ERROR_TYPES (the gateway
# must import without the engine, so the few it answers itself are repeated here).
ERROR_TYPES = {401: "authentication_error", 429: "rate_limit_exceeded", 503: "service_unavailable"}


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> dict:
    """The JSON object of an error answer; also BodyLimits' `error` callable."""
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}


class GatewayError(Exception):
    """An error the gateway answers itself, without an engine."""

    def __init__(self, status: int, message: str, type: str | None = None,  # noqa: A002
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        assert code is None or isinstance(code, str), code
        self.status = status
        self.message = message
        self.type = type or error_type(status)
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> Response:
        return Response(json.dumps(self.body()), status_code=self.status, headers=self.headers,
                        media_type="application/json")


def bad_request(message: str, param: str | None = None) -> GatewayError:
    return GatewayError(400, message, "invalid_request_error", param)


def unauthorized() -> GatewayError:
    return GatewayError(401, "Incorrect or missing API key: pass 'Authorization: Bearer <key>'.",
                        "authentication_error", None, "invalid_api_key",
                        headers={"WWW-Authenticate": "Bearer"})


def model_not_found(model: str) -> GatewayError:
    return GatewayError(404, f"The model `{echo(model)}` does not exist.", "invalid_request_error", "model",
                        "model_not_found")


def rate_limited(name: str, retry_after: str) -> GatewayError:
    return GatewayError(429, f"Rate limit reached for key '{name}'; retry after {retry_after} s.",
                        "rate_limit_exceeded", None, "rate_limit_exceeded", headers={"Retry-After": retry_after})


def no_endpoint() -> GatewayError:
    return GatewayError(503, "No engine is ready to serve this request.", "service_unavailable")


def internal_error(exc: Exception) -> GatewayError:
    """An unexpected error in the gateway itself: a 500 naming only the exception's type."""
    return GatewayError(500, f"Internal gateway error: {type(exc).__name__}", "server_error")


def upstream_unreachable(detail: str) -> GatewayError:
    return GatewayError(502, f"Could not reach an engine: {detail}", "server_error")


def upstream_timeout(seconds: float) -> GatewayError:
    return GatewayError(504, f"The engine did not answer within {seconds:g} s.", "server_error")


def stream_broken(detail: str) -> GatewayError:
    """Sent as the last event of a stream whose engine failed after the first byte."""
    return GatewayError(502, f"The engine failed mid-stream: {detail}; the answer is incomplete.", "server_error")


def route_error(status: int, message: str, headers: dict | None = None) -> GatewayError:
    """404 / 405 for paths and methods the gateway does not serve."""
    return GatewayError(status, message, headers=headers)
