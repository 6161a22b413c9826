"""Every HTTP response of the engine server, counted once: `http_requests_total`.

The name and labels are those vLLM's server exports (prometheus-fastapi-instrumentator:
`handler` = the route template, `method`, `status` grouped as "2xx" / "4xx" / ...), so
a dashboard of vLLM's request rates and error ratios reads ours. It sits outside
everything else (the body limits' 413 / 408, FastAPI's 404 / 405, the handlers), so no
path answers uncounted. Probes and scrapes are counted too, under their own handler,
as vLLM does. A stream that started with 200 and later carried an error event counts
as 2xx here; the request's failure shows in vllm:request_success_total's absence and
in the gateway's stream_errors_total.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter
from starlette.types import ASGIApp, Receive, Scope, Send

from pagedkube.response_status import call_and_report_status

KNOWN_HANDLERS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize", "/detokenize",
                  "/health", "/ready", "/metrics", "/v1/cache/config", "/v1/cache/events", "/v1/cache/tokenizer")


def handler_label(path: str) -> str:
    """The route template; unknown paths share one label, so a scanner cannot grow the series."""
    if path in KNOWN_HANDLERS:
        return path
    if path.startswith("/v1/models/"):
        return "/v1/models/{model}"
    return "none"


class CountHTTPResponses:
    def __init__(self, app: ASGIApp, registry: CollectorRegistry):
        self.app = app
        self.requests = Counter("http_requests_total", "HTTP responses by handler, method and status class",
                                ["handler", "method", "status"], registry=registry)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        def count(status: int | None, raised: bool) -> None:
            status = status or 500   # an app that never answered: the server sends a 500
            self.requests.labels(handler_label(scope.get("path", "")), scope.get("method", ""),
                                 f"{status // 100}xx").inc()

        await call_and_report_status(self.app, scope, receive, send, count)
