"""pagedkube_gateway_* metrics (docs/interfaces.md "Metric names").

One CollectorRegistry per app (no module-level singletons), so two gateways in
one process (tests) keep separate counts.
"""
from __future__ import annotations

import json
from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from pagedkube.gateway.endpoints import STATES
from pagedkube.gateway.routing.types import REASONS

# Proxy latency spans a cached 1 ms answer to a several-minute generation.
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 10, 20, 40, 80)


class GatewayMetrics:
    def __init__(self, endpoint_states: Callable[[], dict[str, int]],
                 endpoint_loads: Callable[[], dict[str, tuple[int, int]]]):
        """`endpoint_loads()` maps each endpoint to (in flight here, other replicas' requests as last scraped)."""
        self.registry = CollectorRegistry()
        p = "pagedkube_gateway_"
        r = self.registry
        self.requests = Counter(p + "requests", "Requests answered, by model and status code",
                                ["model", "code"], registry=r)
        self.request_duration = Histogram(p + "request_duration_seconds", "Time from request to last byte",
                                          ["model"], buckets=_LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram(p + "time_to_first_token_seconds",
                              "Time from request to the first streamed chunk (streaming requests)",
                              ["model"], buckets=_TTFT_BUCKETS, registry=r)
        self.routing_decisions = Counter(p + "routing_decisions", "Routing decisions by reason",
                                         ["reason"], registry=r)
        for reason in REASONS:
            self.routing_decisions.labels(reason)
        self.predicted_cached_tokens = Counter(p + "predicted_cached_tokens",
                                               "Prompt tokens the gateway expected the chosen engine to hold",
                                               registry=r)
        self.realized_cached_tokens = Counter(p + "realized_cached_tokens",
                                              "Prompt tokens the engines served from cache (usage.prompt_tokens_details)",
                                              registry=r)
        self.stream_errors = Counter(p + "stream_errors", "Streams that failed after their first byte and ended "
                                     "with an error event, by cause (broken, timeout, eof)", ["cause"], registry=r)
        self.retries = Counter(p + "upstream_retries", "Attempts moved to the next engine", ["cause"], registry=r)
        self.endpoints = Gauge(p + "endpoints", "Engine endpoints by state", ["state"], registry=r)
        self.endpoint_in_flight = Gauge(p + "endpoint_in_flight", "Requests this gateway has open per endpoint",
                                        ["endpoint"], registry=r)
        self.endpoint_others = Gauge(p + "endpoint_other_requests",
                                     "Other replicas' requests on each engine at the last scrape (its running + waiting "
                                     "less this gateway's own); routing load = in flight + this", ["endpoint"], registry=r)
        self._endpoint_states = endpoint_states
        self._endpoint_loads = endpoint_loads

    def render(self) -> bytes:
        for state in STATES:
            self.endpoints.labels(state).set(0)
        for state, n in self._endpoint_states().items():
            self.endpoints.labels(state).set(n)
        self.endpoint_in_flight.clear()
        self.endpoint_others.clear()
        for url, (in_flight, others) in self._endpoint_loads().items():
            self.endpoint_in_flight.labels(url).set(in_flight)
            self.endpoint_others.labels(url).set(others)
        return generate_latest(self.registry)


def cached_tokens_of(usage: object) -> int | None:
    """usage.prompt_tokens_details.cached_tokens, or None when absent."""
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    if not isinstance(details, dict):
        return None
    value = details.get("cached_tokens")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class SSEUsageScanner:
    """Finds the usage chunk in an SSE stream as it passes through, without
    changing it: only complete `data:` lines that mention cached_tokens are parsed.
    Also notes whether the stream said `data: [DONE]` or sent an error event."""

    def __init__(self) -> None:
        self._tail = b""
        self.cached_tokens: int | None = None
        self.done = False
        self.error = False

    def feed(self, chunk: bytes) -> None:
        data = self._tail + chunk
        lines = data.split(b"\n")
        self._tail = lines.pop()
        if len(self._tail) > 1 << 20:  # no newline for 1 MiB: not SSE we can read
            self._tail = b""
        for line in lines:
            if line.startswith(b"data:"):
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    self.done = True
                elif payload.startswith(b'{"error"'):
                    self.error = True
            if b"cached_tokens" in line and line.startswith(b"data:"):
                try:
                    event = json.loads(line[5:].strip())
                except ValueError:
                    continue
                value = cached_tokens_of(event.get("usage") if isinstance(event, dict) else None)
                if value is not None:
                    self.cached_tokens = value
