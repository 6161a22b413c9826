"""The gateway's access log, request id and spans, as one ASGI middleware around
the proxied routes plus one hook where the routing decision is made.

    AccessLogMiddleware            around FastPath (gateway/app.py)
      sets/keeps x-request-id      in the scope's headers: the proxy forwards them
      Gateway.handle -> note_route(scope, decision, model)   (queue time, engine, reason)
      watches the response         status, first body byte (TTFT), usage (realized cached tokens)
      one GatewayAccess line       when the last byte is sent, however the request ended

Everything is read at the ASGI boundary so the proxy needs no hook: the chosen
engine after retries is the x-pagedkube-endpoint header it sets (when route
headers are off, the decision's first pick), and realized cached tokens come
from the response bytes as the client receives them.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pagedkube.access_log import (REQUEST_ID_HEADER, SCOPE_KEY, AccessLog, ensure_request_id, header_of, seconds,
                                  set_response_header)
from pagedkube.gateway.metrics import SSEUsageScanner, cached_tokens_of
from pagedkube.gateway.routing.types import Decision
from pagedkube.tracing import Tracing

LOGGER = "pagedkube.gateway.access"
_ENDPOINT_HEADER = b"x-pagedkube-endpoint"


@dataclass(slots=True)
class GatewayAccess:
    """One line per proxied request; field order is the line's order."""
    request_id: str
    method: str
    path: str
    status: int | None = None
    model: str | None = None
    engine: str | None = None
    route: str | None = None                 # the routing reason (affinity, ring, overflow, ...)
    predicted_cached_tokens: int | None = None
    cached_tokens: int | None = None          # realized: usage.prompt_tokens_details.cached_tokens
    queue_s: float | None = None              # arrival -> routing decision (includes a scale-from-zero hold)
    ttft_s: float | None = None               # arrival -> first response body byte
    total_s: float | None = None              # arrival -> last byte sent
    _arrival: float = 0.0
    _routed: float | None = None
    _span: Any = None


def note_route(scope: Scope, decision: Decision, model: str | None) -> None:
    """Gateway.handle's hook, once the engines are picked."""
    record: GatewayAccess | None = scope.get(SCOPE_KEY)
    if record is None:
        return
    record._routed = time.monotonic()
    record.model = model
    record.route = decision.reason
    record.predicted_cached_tokens = decision.predicted_cached_tokens
    record.engine = decision.endpoints[0] if decision.endpoints else None


class _ResponseWatch:
    """Reads status, first-byte time and cached tokens off the ASGI send stream."""

    def __init__(self, record: GatewayAccess, read_usage: bool):
        self.record = record
        self.read_usage = read_usage       # off with --access-log off and no tracing: nothing reads it
        self.scanner: SSEUsageScanner | None = None
        self.body = b""

    def start(self, message: Message) -> None:
        self.record.status = message["status"]
        self.record.engine = header_of(message, _ENDPOINT_HEADER) or self.record.engine
        if self.read_usage and (header_of(message, b"content-type") or "").startswith("text/event-stream"):
            self.scanner = SSEUsageScanner()
        set_response_header(message, REQUEST_ID_HEADER.encode(), self.record.request_id)

    def body_part(self, message: Message) -> None:
        chunk = message.get("body", b"")
        if chunk and self.record.ttft_s is None:
            self.record.ttft_s = seconds(self.record._arrival, time.monotonic())
        if self.scanner is not None:
            self.scanner.feed(chunk)
            self.record.cached_tokens = self.scanner.cached_tokens
        elif self.read_usage and (b"cached_tokens" in chunk or self.body):
            self.body += chunk   # a whole JSON answer comes as one message from the proxy

    def finish(self) -> None:
        if self.scanner is None and self.body and self.record.status and self.record.status < 300:
            try:
                self.record.cached_tokens = cached_tokens_of(json.loads(self.body).get("usage"))
            except (ValueError, AttributeError):
                pass


class AccessLogMiddleware:
    def __init__(self, app: ASGIApp, access_log: AccessLog, tracing: Tracing | None, paths: tuple[str, ...]):
        self.app = app
        self.state = getattr(app, "state", None)   # FastPath exposes the FastAPI app's state
        self.access_log = access_log
        self.tracing = tracing
        self.paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") not in self.paths:
            await self.app(scope, receive, send)
            return
        record = GatewayAccess(ensure_request_id(scope), scope.get("method", ""), scope["path"],
                               _arrival=time.monotonic())
        scope[SCOPE_KEY] = record
        if self.tracing is not None:
            self._start_span(self.tracing, scope, record)
        watch = _ResponseWatch(record, self.access_log.enabled or self.tracing is not None)

        async def watched_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                watch.start(message)
            elif message["type"] == "http.response.body":
                watch.body_part(message)
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        finally:
            end = time.monotonic()
            watch.finish()
            record.queue_s = seconds(record._arrival, record._routed)
            record.total_s = seconds(record._arrival, end)
            self.access_log.emit(record)
            if record._span is not None and self.tracing is not None:
                self._end_span(self.tracing, record, end)

    @staticmethod
    def _start_span(tracing: Tracing, scope: Scope, record: GatewayAccess) -> None:
        parent = tracing.extract(scope.get("headers") or [])
        record._span = tracing.start("gateway.request", parent, record._arrival, server=True,
                                     attributes={"http.request.method": record.method, "url.path": record.path,
                                                 "pagedkube.request_id": record.request_id})
        forward = {k.encode(): v.encode() for k, v in tracing.inject(record._span).items()}
        scope["headers"] = [(k, v) for k, v in scope.get("headers") or [] if k.lower() not in forward] + \
            list(forward.items())

    @staticmethod
    def _end_span(tracing: Tracing, record: GatewayAccess, end: float) -> None:
        tracing.span("route", record._span, record._arrival, record._routed,
                     {"pagedkube.route": record.route, "pagedkube.engine": record.engine,
                      "pagedkube.predicted_cached_tokens": record.predicted_cached_tokens})
        tracing.end(record._span, end, {"http.response.status_code": record.status,
                                        "pagedkube.engine": record.engine,
                                        "pagedkube.cached_tokens": record.cached_tokens},
                    error=record.status is None or record.status >= 500)
