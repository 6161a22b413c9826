"""The request id, the access-log line and the span helpers (pagedkube/access_log.py,
pagedkube/tracing.py, pagedkube/observability.py), without servers; the Prometheus
tier follows real requests through real processes (tests/prometheus)."""
from __future__ import annotations

import argparse
import json
import logging
from dataclasses import dataclass

import pytest

from pagedkube.access_log import AccessLog, ensure_request_id, set_response_header, valid_request_id
from pagedkube.observability import ObservabilityConfig, add_observability_args, observability_from_args


@dataclass
class Line:
    request_id: str
    status: int | None = None
    engine: str | None = None
    ttft_s: float | None = None
    note: str | None = None
    _private: object = None


def test_a_plain_client_id_is_kept_and_left_in_the_headers():
    scope = {"headers": [(b"content-type", b"application/json"), (b"x-request-id", b"req-42:a/b")]}
    assert ensure_request_id(scope) == "req-42:a/b"
    assert scope["headers"] == [(b"content-type", b"application/json"), (b"x-request-id", b"req-42:a/b")]


@pytest.mark.parametrize("given", [None, [b""], [b"has space"], [b'quote"'], [b"x" * 129], [b"a", b"b"],
                                   ["é".encode()]])
def test_an_absent_or_unsafe_id_is_replaced_in_the_headers(given):
    scope = {"headers": [(b"accept", b"*/*")] + [(b"X-Request-Id", v) for v in given or []]}
    made = ensure_request_id(scope)
    assert valid_request_id(made) and len(made) == 32
    assert scope["headers"] == [(b"accept", b"*/*"), (b"x-request-id", made.encode())]


def test_the_response_header_is_set_once():
    message = {"type": "http.response.start", "status": 200,
               "headers": [(b"content-type", b"text/plain"), (b"x-request-id", b"engine-made")]}
    set_response_header(message, b"x-request-id", "abc")
    assert message["headers"] == [(b"content-type", b"text/plain"), (b"x-request-id", b"abc")]


def test_text_line_is_logfmt_with_quoting_and_dashes(caplog):
    log = AccessLog("pagedkube.test.access", "text")
    with caplog.at_level(logging.INFO, logger="pagedkube.test.access"):
        log.emit(Line("id-1", 200, "http://10.0.0.7:8000", 0.0421, 'said "hi" = ok'))
    assert caplog.messages == [
        'request_id=id-1 status=200 engine=http://10.0.0.7:8000 ttft_s=0.0421 note="said \\"hi\\" = ok"']
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pagedkube.test.access"):
        log.emit(Line("id-2"))
    assert caplog.messages == ["request_id=id-2 status=- engine=- ttft_s=- note=-"]


def test_json_line_and_off(caplog):
    with caplog.at_level(logging.INFO, logger="pagedkube.test.access"):
        AccessLog("pagedkube.test.access", "json").emit(Line("id-1", 503, ttft_s=1.5))
        AccessLog("pagedkube.test.access", "off").emit(Line("id-2"))
    assert [json.loads(m) for m in caplog.messages] == [
        {"request_id": "id-1", "status": 503, "engine": None, "ttft_s": 1.5, "note": None}]


def test_options_validate_and_parse():
    with pytest.raises(ValueError, match="--access-log must be one of text, json, off"):
        ObservabilityConfig(access_log="xml")
    with pytest.raises(ValueError, match="--otlp-traces-endpoint must be an http"):
        ObservabilityConfig(otlp_traces_endpoint="grpc://collector:4317")
    p = argparse.ArgumentParser()
    add_observability_args(p)
    assert observability_from_args(p.parse_args([])) == ObservabilityConfig("text", None)
    args = p.parse_args(["--access-log", "json", "--otlp-traces-endpoint", "http://c:4318/v1/traces"])
    assert observability_from_args(args) == ObservabilityConfig("json", "http://c:4318/v1/traces")


def test_spans_share_boundaries_and_cross_a_hop_by_traceparent():
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from pagedkube.tracing import Tracing

    gateway_spans, engine_spans = InMemorySpanExporter(), InMemorySpanExporter()
    gateway = Tracing("pagedkube-gateway", exporter=gateway_spans)
    engine = Tracing("pagedkube-engine", exporter=engine_spans)
    root = gateway.start("gateway.request", None, 100.0, server=True, attributes={"a": 1, "skipped": None})
    headers = gateway.inject(root)
    assert list(headers) == ["traceparent"]
    gateway.span("route", root, 100.0, 100.002)
    parent = engine.extract([(b"traceparent", headers["traceparent"].encode())])
    request = engine.start("engine.request", parent, 100.003, server=True)
    engine.span("queue", request, 100.003, 100.01)
    engine.span("prefill", request, 100.01, 100.05)
    engine.span("decode", request, 100.05, 100.2)
    engine.span("never", request, None, 100.2)            # an unknown time: no span
    engine.end(request, 100.2, {"http.response.status_code": 200})
    gateway.end(root, 100.21, error=True)

    spans = {s.name: s for s in gateway_spans.get_finished_spans() + engine_spans.get_finished_spans()}
    assert set(spans) == {"gateway.request", "route", "engine.request", "queue", "prefill", "decode"}
    trace_id = spans["gateway.request"].context.trace_id
    assert all(s.context.trace_id == trace_id for s in spans.values())
    assert spans["route"].parent.span_id == spans["gateway.request"].context.span_id
    assert spans["engine.request"].parent.span_id == spans["gateway.request"].context.span_id
    for name in ("queue", "prefill", "decode"):
        assert spans[name].parent.span_id == spans["engine.request"].context.span_id
    assert spans["queue"].end_time == spans["prefill"].start_time
    assert spans["prefill"].end_time == spans["decode"].start_time
    assert spans["decode"].end_time - spans["queue"].start_time == 197_000_000
    assert dict(spans["gateway.request"].attributes) == {"a": 1}
    assert spans["gateway.request"].status.status_code.name == "ERROR"
    assert spans["engine.request"].resource.attributes["service.name"] == "pagedkube-engine"
    gateway.shutdown()
    engine.shutdown()
