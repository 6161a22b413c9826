"""OpenAI-shaped error bodies: {"error": {"message", "type", "param", "code"}}, with
the `type` strings OpenAI's API (and our engine server, engine/server/errors.py) uses."""
from __future__ import annotations

import json

from starlette.responses import Response


class GatewayError(Exception):
    """An error the gateway answers itself, without an engine."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",  # noqa: A002
                 param: str | None = None, code: str | int | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code if code is not None else status
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
    return GatewayError(404, f"The model `{model}` does not exist.", "invalid_request_error", "model", "model_not_found")


def body_too_large(limit: int) -> GatewayError:
    return GatewayError(413, f"Request body is larger than the gateway's limit of {limit} bytes.",
                        "invalid_request_error", None, 413)


def rate_limited(name: str, retry_after: str) -> GatewayError:
    return GatewayError(429, f"Rate limit reached for key '{name}'; retry after {retry_after} s.",
                        "rate_limit_exceeded", None, 429, headers={"Retry-After": retry_after})


def no_endpoint() -> GatewayError:
    return GatewayError(503, "No engine is ready to serve this request.", "service_unavailable", None, 503)


def internal_error(exc: Exception) -> GatewayError:
    """An unexpected error in the gateway itself: a 500 naming only the exception's type."""
    return GatewayError(500, f"Internal gateway error: {type(exc).__name__}", "server_error")


def upstream_unreachable(detail: str) -> GatewayError:
    return GatewayError(502, f"Could not reach an engine: {detail}", "server_error", None, 502)


def upstream_timeout(seconds: float) -> GatewayError:
    return GatewayError(504, f"The engine did not answer within {seconds:g} s.", "server_error", None, 504)
