"""OpenTelemetry spans for the gateway and the engine, optional (torch-free).

Off unless `--otlp-traces-endpoint URL` is given; then the OpenTelemetry SDK
(the `otel` extra) must be installed, or start-up fails with the pip line.

    gateway.request  (gateway, SERVER)          arrival .............. last byte
      route          (gateway)                  arrival .. decision
      engine.request (engine, SERVER)                    arrival ....... finished
        queue                                            arrival .. scheduled
        prefill                                          scheduled .. 1st token
        decode                                           1st token .. finished

The context crosses the hop as a W3C `traceparent` header (the gateway replaces
the client's with its own span, whose parent is the client's). The engine's
spans are made when a request ends, from the timestamps it recorded, as vLLM
does: a span per scheduler step would cost more than the step. Each app builds
its own TracerProvider (no global provider), so two apps in a process share
nothing, and a test can hand one an in-memory exporter.
"""
from __future__ import annotations

import time
from typing import Any, Iterable, Mapping

_NEEDS_OTEL = ("--otlp-traces-endpoint needs the OpenTelemetry SDK: pip install 'pagedkube[otel]' ({})")


class Tracing:
    def __init__(self, service_name: str, endpoint: str | None = None, exporter: Any = None):
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError as e:
            raise RuntimeError(_NEEDS_OTEL.format(e)) from None
        if exporter is None:
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            except ImportError as e:
                raise RuntimeError(_NEEDS_OTEL.format(e)) from None
            exporter = OTLPSpanExporter(endpoint=endpoint)
            processor: SpanProcessor = BatchSpanProcessor(exporter)   # OTEL_BSP_* environment variables tune it
        else:
            processor = SimpleSpanProcessor(exporter)  # tests: spans visible as soon as they end
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self.provider.add_span_processor(processor)
        self.tracer = self.provider.get_tracer("pagedkube")
        self.propagator = TraceContextTextMapPropagator()
        # Timestamps are taken with time.monotonic() (as the engine's metrics are) and turned
        # into epoch nanoseconds with one offset, so spans that share a boundary share its value.
        self._epoch_offset_ns = time.time_ns() - time.monotonic_ns()

    def ns(self, monotonic: float) -> int:
        return self._epoch_offset_ns + int(monotonic * 1e9)

    def extract(self, headers: Iterable[tuple[bytes, bytes]]) -> Any:
        carrier = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in headers}
        return self.propagator.extract(carrier)

    def inject(self, span: Any) -> dict[str, str]:
        """The headers that make `span` the parent on the other side of a hop."""
        from opentelemetry import trace

        carrier: dict[str, str] = {}
        self.propagator.inject(carrier, context=trace.set_span_in_context(span))
        return carrier

    def start(self, name: str, parent: Any, start: float, attributes: Mapping[str, Any] | None = None,
              server: bool = False) -> Any:
        """A span begun at monotonic time `start`, child of context or span `parent`."""
        from opentelemetry import trace

        if parent is not None and not isinstance(parent, dict) and hasattr(parent, "get_span_context"):
            parent = trace.set_span_in_context(parent)
        kind = trace.SpanKind.SERVER if server else trace.SpanKind.INTERNAL
        return self.tracer.start_span(name, context=parent, kind=kind, start_time=self.ns(start),
                                      attributes={k: v for k, v in (attributes or {}).items() if v is not None})

    def span(self, name: str, parent: Any, start: float | None, end: float | None,
             attributes: Mapping[str, Any] | None = None) -> None:
        """A finished child span from two monotonic timestamps (skipped if either is unknown)."""
        if start is None or end is None:
            return
        self.start(name, parent, start, attributes).end(end_time=self.ns(max(start, end)))

    def end(self, span: Any, end: float, attributes: Mapping[str, Any] | None = None, error: bool = False) -> None:
        from opentelemetry.trace import Status, StatusCode

        for k, v in (attributes or {}).items():
            if v is not None:
                span.set_attribute(k, v)
        if error:
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=self.ns(end))

    def shutdown(self) -> None:
        self.provider.shutdown()   # flushes the batch processor


def build_tracing(service_name: str, endpoint: str | None) -> Tracing | None:
    return Tracing(service_name, endpoint) if endpoint else None
