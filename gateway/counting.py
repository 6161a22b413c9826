"""CountResponses: every response the gateway sends is counted once, in one place.

`pagedkube_gateway_requests_total{model,code}` and `_request_duration_seconds`
are observed here, outside everything else (the body limits' 413 / 408, the
fast path's 405, FastAPI's 404, the proxy's answers), so no path can answer
without being counted. Not counted: GET /health, /ready and /metrics, the
probes and scrapes (counting a kubelet's probes as traffic would swamp the
request rate and the 5xx ratio the dashboards draw from this counter).

Handlers fill in the request's Outcome (found under OUTCOME in the ASGI scope):
the model once it is known, and `code` when the status line does not tell the
end of the story (a stream that started 200 and was cut by the engine).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from starlette.datastructures import State
from starlette.types import ASGIApp, Receive, Scope, Send

from pagedkube.gateway.metrics import GatewayMetrics
from pagedkube.response_status import call_and_report_status

OUTCOME = "pagedkube.outcome"   # ASGI scope key (extension keys are namespaced by convention)
UNCOUNTED = frozenset({"/health", "/ready", "/metrics"})   # for GET only


@dataclass(slots=True)
class Outcome:
    model: str = "unknown"
    code: int | None = None   # replaces the status sent: 502 for a stream the engine broke off


def outcome_of(scope: Scope) -> Outcome:
    """The request's Outcome (a throwaway one when the request is not counted)."""
    return scope.get(OUTCOME) or Outcome()


class CountResponses:
    def __init__(self, app: ASGIApp, metrics: GatewayMetrics):
        self.app = app
        self.metrics = metrics
        self.state = State()   # create_app puts the FastAPI app's here, for whoever holds only this outermost app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (scope.get("method") == "GET" and scope.get("path") in UNCOUNTED):
            await self.app(scope, receive, send)
            return
        outcome = scope[OUTCOME] = Outcome()
        started = time.monotonic()

        def count(status: int | None, raised: bool) -> None:
            # No response: 500 from the server for an app that raised before answering, else
            # the client left first (499, nginx's "client closed request").
            code = outcome.code if outcome.code is not None else (status or (500 if raised else 499))
            self.metrics.requests.labels(outcome.model, str(code)).inc()
            self.metrics.request_duration.labels(outcome.model).observe(time.monotonic() - started)

        await call_and_report_status(self.app, scope, receive, send, count)
