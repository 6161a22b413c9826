"""The request id and the one access-log line per request, shared by the gateway
and the engine server (torch-free).

    client --x-request-id?--> gateway --x-request-id--> engine
           <--X-Request-Id--          <--X-Request-Id--

The gateway takes the client's `x-request-id` when it is a plain token (what
nginx, Envoy and vLLM pass along) and makes one otherwise; it forwards it to the
engine and both return it. Each process logs one line per proxied or served
request carrying the id, so `grep ID` over both logs follows the request:

    gateway: request_id=ID status=200 engine=http://10.0.0.7:8000 route=affinity predicted_cached_tokens=32 ...
    engine:  request_id=ID status=200 completion_id=cmpl-... cached_tokens=32 queue_s=0.002 ttft_s=0.041 ...

The line is logfmt (`key=value`) by default or one JSON object (`--access-log
json`); `--access-log off` drops it. An id that is not a plain token (spaces,
quotes, over 128 characters) is replaced, not logged: a client must not be able
to forge or break log lines through it.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import re
import uuid
from typing import Any, MutableMapping

REQUEST_ID_HEADER = "x-request-id"
_HEADER_BYTES = REQUEST_ID_HEADER.encode()
# 128: room for a UUID, a W3C trace id or an Envoy id with a prefix, small enough for a log line.
MAX_REQUEST_ID_LEN = 128
_TOKEN = re.compile(r"[A-Za-z0-9._:/+=@-]{1,%d}" % MAX_REQUEST_ID_LEN)
ACCESS_LOG_FORMATS = ("text", "json", "off")
DEFAULT_ACCESS_LOG = "text"   # on, readable; as uvicorn's and vLLM's request logs are on by default
# Where the middlewares keep a request's record for the handlers' hooks (an ASGI scope extension key).
SCOPE_KEY = "pagedkube.access"


def new_request_id() -> str:
    return uuid.uuid4().hex


def valid_request_id(value: str) -> bool:
    return _TOKEN.fullmatch(value) is not None


def ensure_request_id(scope: MutableMapping[str, Any]) -> str:
    """The request's id: the client's `x-request-id` if it is a plain token, else a
    new one, written into the scope's headers so that whatever reads or forwards
    the request headers downstream (the gateway's proxy) sees the same id."""
    headers = scope.get("headers") or []
    given = [v for k, v in headers if k.lower() == _HEADER_BYTES]
    if len(given) == 1:
        value = given[0].decode("latin-1")
        if valid_request_id(value):
            return value
    request_id = new_request_id()
    scope["headers"] = [(k, v) for k, v in headers if k.lower() != _HEADER_BYTES] + \
        [(_HEADER_BYTES, request_id.encode())]
    return request_id


def set_response_header(message: MutableMapping[str, Any], name: bytes, value: str) -> None:
    """Sets one header on an http.response.start message, replacing any of that name
    (a proxied engine response already carries the engine's X-Request-Id)."""
    headers = [(k, v) for k, v in message.get("headers") or [] if k.lower() != name]
    headers.append((name, value.encode("latin-1")))
    message["headers"] = headers


def header_of(message: MutableMapping[str, Any], name: bytes) -> str | None:
    for k, v in message.get("headers") or []:
        if k.lower() == name:
            return v.decode("latin-1")
    return None


def _logfmt_value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6f}".rstrip("0").rstrip(".") or "0"
    text = str(value)
    if not text or any(c in text for c in ' "=\\') or not text.isprintable():
        return json.dumps(text)
    return text


class AccessLog:
    """Writes one record (a dataclass) per request to `logger_name` at INFO."""

    def __init__(self, logger_name: str, fmt: str = DEFAULT_ACCESS_LOG):
        if fmt not in ACCESS_LOG_FORMATS:
            raise ValueError(f"--access-log must be one of {', '.join(ACCESS_LOG_FORMATS)}, got {fmt!r}")
        self.fmt = fmt
        self.logger = logging.getLogger(logger_name)

    @property
    def enabled(self) -> bool:
        return self.fmt != "off"

    def format(self, record: Any) -> str:
        fields = {f.name: getattr(record, f.name) for f in dataclasses.fields(record) if not f.name.startswith("_")}
        if self.fmt == "json":
            return json.dumps(fields, separators=(",", ":"))
        return " ".join(f"{k}={_logfmt_value(v)}" for k, v in fields.items())

    def emit(self, record: Any) -> None:
        """Never raises: a request must not fail because its log line did."""
        if self.enabled and self.logger.isEnabledFor(logging.INFO):
            try:
                line = self.format(record)
            except Exception:
                self.logger.exception("access log: cannot format %r", type(record).__name__)
                return
            self.logger.info("%s", line)


def seconds(start: float | None, end: float | None) -> float | None:
    """end - start rounded to microseconds, or None when either is unknown."""
    if start is None or end is None:
        return None
    return round(max(0.0, end - start), 6)
