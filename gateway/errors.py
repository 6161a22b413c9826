"""Errors the gateway answers itself, without an engine: `GatewayError` and its constructors.

The shape, each status's OpenAI `type` and the codes are pagedkube/openai_errors.py's, the
same module the engine server builds its answers from (the gateway imports nothing of the
engine server).
"""
from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response

from pagedkube.echo import echo
from pagedkube.openai_errors import INVALID_API_KEY, MODEL_NOT_FOUND, RATE_LIMIT_EXCEEDED, error_body

class GatewayError(Exception):
    """An error the gateway answers itself, without an engine."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.code, param=self.param)

    def response(self) -> Response:
        return Response(json.dumps(self.body()), status_code=self.status, headers=self.headers,
                        media_type="application/json")


def bad_request(message: str, param: str | None = None) -> GatewayError:
    return GatewayError(400, message, param=param)


def unauthorized() -> GatewayError:
    return GatewayError(401, "Incorrect or missing API key: pass 'Authorization: Bearer <key>'.",
                        code=INVALID_API_KEY, headers={"WWW-Authenticate": "Bearer"})


def model_not_found(model: str) -> GatewayError:
    return GatewayError(404, f"The model `{echo(model)}` does not exist.", param="model",
                        code=MODEL_NOT_FOUND)


def rate_limited(name: str, retry_after: str) -> GatewayError:
    return GatewayError(429, f"Rate limit reached for key '{name}'; retry after {retry_after} s.",
                        code=RATE_LIMIT_EXCEEDED, headers={"Retry-After": retry_after})


def no_endpoint() -> GatewayError:
    return GatewayError(503, "No engine is ready to serve this request.")


def internal_error(exc: Exception) -> GatewayError:
    """An unexpected error in the gateway itself: a 500 naming only the exception's type."""
    return GatewayError(500, f"Internal gateway error: {type(exc).__name__}")


def upstream_unreachable(detail: str) -> GatewayError:
    return GatewayError(502, f"Could not reach an engine: {detail}")


def upstream_timeout(seconds: float) -> GatewayError:
    return GatewayError(504, f"The engine did not answer within {seconds:g} s.")


def stream_broken(detail: str) -> GatewayError:
    """Sent as the last event of a stream whose engine failed after the first byte."""
    return GatewayError(502, f"The engine failed mid-stream: {detail}; the answer is incomplete.")


def route_error(status: int, message: str, headers: dict | None = None) -> GatewayError:
    """404 / 405 for paths and methods the gateway does not serve."""
    return GatewayError(status, message, headers=headers)
