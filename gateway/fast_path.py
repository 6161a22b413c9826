"""The two proxied routes served straight from ASGI, in front of the FastAPI app.

POST /v1/chat/completions and /v1/completions are the gateway's hot path. Going
through FastAPI costs a middleware stack per request (error and exception
middleware, an exit stack, telemetry, the router, dependency solving): about a
tenth of the gateway's own time per request. These two routes take no
parameters FastAPI would parse, so they are dispatched here; everything else
(/v1/models, /health, /ready, /metrics, lifespan) goes to the app as before.
"""
from __future__ import annotations

import logging
from typing import Awaitable, Callable

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from pagedkube.gateway.errors import GatewayError, internal_error

log = logging.getLogger("pagedkube.gateway")

Handler = Callable[[Request, str], Awaitable[Response]]
PROXIED = ("/v1/chat/completions", "/v1/completions")


class FastPath:
    def __init__(self, app: FastAPI, handle: Handler):
        self.app = app
        self.state = app.state
        self.handle = handle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path")
        if scope["type"] != "http" or path not in PROXIED:
            await self.app(scope, receive, send)
            return
        try:
            if scope.get("method") != "POST":
                raise GatewayError(405, f"Method {scope.get('method')} is not allowed on {path}; use POST.",
                                   headers={"Allow": "POST"})
            response = await self.handle(Request(scope, receive, send), path)
        except GatewayError as exc:
            response = exc.response()
        except Exception as exc:  # as the app's own handler: an OpenAI-shaped 500, the server goes on
            log.exception("unhandled error")
            response = internal_error(exc).response()
        await response(scope, receive, send)
