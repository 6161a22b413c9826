"""Observability options shared by `pagedkube gateway`, `pagedkube serve` and
`pagedkube up`: the access log and OpenTelemetry tracing (torch-free)."""
from __future__ import annotations

import argparse
import importlib.util
from dataclasses import dataclass

from pagedkube.access_log import ACCESS_LOG_FORMATS, DEFAULT_ACCESS_LOG


@dataclass(slots=True)
class ObservabilityConfig:
    access_log: str = DEFAULT_ACCESS_LOG      # text | json | off (pagedkube/access_log.py)
    # OTLP/HTTP collector for traces, e.g. http://otel-collector:4318/v1/traces (vLLM's flag name);
    # None = no tracing, and the OpenTelemetry SDK is never imported.
    otlp_traces_endpoint: str | None = None

    def __post_init__(self) -> None:
        if self.access_log not in ACCESS_LOG_FORMATS:
            raise ValueError(f"--access-log must be one of {', '.join(ACCESS_LOG_FORMATS)}, got {self.access_log!r}")
        if self.otlp_traces_endpoint is not None and not self.otlp_traces_endpoint.startswith(("http://", "https://")):
            raise ValueError("--otlp-traces-endpoint must be an http(s):// URL of an OTLP/HTTP collector, "
                             f"e.g. http://localhost:4318/v1/traces; got {self.otlp_traces_endpoint!r}")
        if self.otlp_traces_endpoint is not None and not otel_installed():
            raise ValueError("--otlp-traces-endpoint needs the OpenTelemetry SDK and OTLP exporter: "
                             "pip install 'pagedkube[otel]'")


def otel_installed() -> bool:
    """The `otel` extra is importable (checked at start-up, so a missing SDK is a clear error)."""
    try:
        return all(importlib.util.find_spec(m) is not None
                   for m in ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http.trace_exporter"))
    except ModuleNotFoundError:   # a parent package is missing
        return False


def add_observability_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("observability (docs/observability.md)")
    g.add_argument("--access-log", choices=ACCESS_LOG_FORMATS, default=DEFAULT_ACCESS_LOG,
                   help="one line per request with its x-request-id: logfmt text, JSON, or off (default text)")
    g.add_argument("--otlp-traces-endpoint", metavar="URL", default=None,
                   help="export OpenTelemetry spans over OTLP/HTTP to this collector URL "
                        "(needs pip install 'pagedkube[otel]'; default: off)")


def observability_from_args(args: argparse.Namespace) -> ObservabilityConfig:
    return ObservabilityConfig(access_log=getattr(args, "access_log", DEFAULT_ACCESS_LOG),
                               otlp_traces_endpoint=getattr(args, "otlp_traces_endpoint", None))
