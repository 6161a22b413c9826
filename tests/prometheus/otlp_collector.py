"""An in-process OTLP/HTTP trace collector: the endpoint the gateway's and the
engines' --otlp-traces-endpoint point at in the Prometheus tier.

It accepts POST /v1/traces (protobuf ExportTraceServiceRequest, as the SDK's
OTLP/HTTP exporter sends) on loopback and keeps every span as a plain
CollectedSpan, so a test can follow one request's trace across processes.
"""
from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                       ExportTraceServiceResponse)


@dataclass(slots=True)
class CollectedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int
    attributes: dict = field(default_factory=dict)


def _value(any_value) -> object:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


class Collector:
    def __init__(self) -> None:
        self.spans: list[CollectedSpan] = []
        self.lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest.FromString(body)
                collector.add(request)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="otlp")
        self.thread.start()

    def add(self, request: ExportTraceServiceRequest) -> None:
        with self.lock:
            for resource_spans in request.resource_spans:
                resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for s in scope_spans.spans:
                        self.spans.append(CollectedSpan(
                            str(resource.get("service.name")), s.name, s.trace_id.hex(), s.span_id.hex(),
                            s.parent_span_id.hex(), s.start_time_unix_nano, s.end_time_unix_nano,
                            {a.key: _value(a.value) for a in s.attributes}))

    def snapshot(self) -> list[CollectedSpan]:
        with self.lock:
            return list(self.spans)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
