"""The engine server's access log, request id and spans (torch-free).

    EngineAccessMiddleware               around the app (engine/server/app.py)
      sets/keeps x-request-id            returns it as X-Request-Id
      _respond -> observe_generation(request, gen)   (openai_routes.py)
         watches the RequestDeltas       first scheduled, first token, cached / prompt / completion tokens
      one EngineAccess line              when the last byte is sent; spans queue, prefill, decode

The engine's timings are read from the deltas the HTTP side already receives
(`first_scheduled_time` is the core's time.monotonic(), one clock per machine),
so the engine loop and core process need no hook.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pagedkube.access_log import REQUEST_ID_HEADER, SCOPE_KEY, AccessLog, ensure_request_id, seconds, set_response_header
from pagedkube.tracing import Tracing

if TYPE_CHECKING:
    from starlette.requests import Request

    from pagedkube.engine.outputs import RequestDelta
    from pagedkube.engine.server.generation import Generation

LOGGER = "pagedkube.engine.access"
PATHS = ("/v1/completions", "/v1/chat/completions")


@dataclass(slots=True)
class EngineAccess:
    """One line per generation request; field order is the line's order."""
    request_id: str
    method: str
    path: str
    status: int | None = None
    completion_id: str | None = None          # the OpenAI response id (cmpl-..., chatcmpl-...)
    prompt_tokens: int | None = None
    cached_tokens: int | None = None          # prefix-cache hit, as in usage.prompt_tokens_details
    completion_tokens: int | None = None
    finish_reason: str | None = None
    queue_s: float | None = None              # submitted -> first scheduled (vllm:request_queue_time_seconds)
    ttft_s: float | None = None               # arrival -> first generated token
    total_s: float | None = None              # arrival -> last byte sent
    _arrival: float = 0.0
    _submitted: float | None = None
    _scheduled: float | None = None
    _first_token: float | None = None
    _finished: float | None = None


def observe_generation(request: Request, gen: Generation) -> None:
    """_respond's hook, before gen.start(): follow the deltas of this generation.

    The deltas go to the streaming and the collecting paths through gen.updates();
    gen.observe() has it call `note` with each one as it passes (unchanged), and
    `note` keeps what the access line needs."""
    record: EngineAccess | None = request.scope.get(SCOPE_KEY)
    if record is None:
        return
    record._submitted = time.monotonic()
    record.completion_id = gen.request_id
    record.prompt_tokens = sum(len(ids) for ids in gen.prepared.prompt_ids)
    record.completion_tokens = 0
    cached: dict[int, int] = {}
    reasons: set[str] = set()

    def note(prompt_idx: int, delta: RequestDelta) -> None:
        now = time.monotonic()
        scheduled = delta.first_scheduled_time
        if scheduled is not None and (record._scheduled is None or scheduled < record._scheduled):
            record._scheduled = scheduled
        new_tokens = sum(len(s.token_ids) for s in delta.samples)
        if new_tokens and record._first_token is None:
            record._first_token = now
        record.completion_tokens = (record.completion_tokens or 0) + new_tokens
        reasons.update(s.finish_reason for s in delta.samples if s.finish_reason)
        record.finish_reason = ",".join(sorted(reasons)) or None
        cached[prompt_idx] = delta.num_cached_tokens or 0
        record.cached_tokens = sum(cached.values())
        if delta.finished:
            record._finished = now

    gen.observe(note)


class EngineAccessMiddleware:
    def __init__(self, app: ASGIApp, access_log: AccessLog, tracing: Tracing | None = None):
        self.app = app
        self.access_log = access_log
        self.tracing = tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") not in PATHS:
            await self.app(scope, receive, send)
            return
        record = EngineAccess(ensure_request_id(scope), scope.get("method", ""), scope["path"],
                              _arrival=time.monotonic())
        scope[SCOPE_KEY] = record

        async def watched_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
                set_response_header(message, REQUEST_ID_HEADER.encode(), record.request_id)
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        finally:
            end = time.monotonic()
            record.queue_s = seconds(record._submitted, record._scheduled)
            record.ttft_s = seconds(record._arrival, record._first_token)
            record.total_s = seconds(record._arrival, end)
            self.access_log.emit(record)
            if self.tracing is not None:
                self._spans(self.tracing, scope, record, end)

    @staticmethod
    def _spans(tracing: Tracing, scope: Scope, record: EngineAccess, end: float) -> None:
        root = tracing.start("engine.request", tracing.extract(scope.get("headers") or []), record._arrival,
                             server=True, attributes={"pagedkube.request_id": record.request_id,
                                                      "pagedkube.completion_id": record.completion_id,
                                                      "url.path": record.path})
        finished = record._finished or end
        tracing.span("queue", root, record._submitted, record._scheduled)
        tracing.span("prefill", root, record._scheduled, record._first_token,
                     {"pagedkube.prompt_tokens": record.prompt_tokens,
                      "pagedkube.cached_tokens": record.cached_tokens})
        tracing.span("decode", root, record._first_token, finished,
                     {"pagedkube.completion_tokens": record.completion_tokens})
        tracing.end(root, end, {"http.response.status_code": record.status,
                                "pagedkube.finish_reason": record.finish_reason},
                    error=record.status is None or record.status >= 500)
