"""HeadLimits: what a request head (request line and headers) and an open connection may cost.

    uvicorn.Config(app, http=limited_http_protocol(HeadLimits(), error=my_error_body), ...)

uvicorn with httptools, as vLLM runs it, bounds none of this: a 16 MB header and
100,000 headers are answered 200, a client that sends its headers one byte a
second holds its connection for as long as it likes (the body deadline of
http_limits.py starts only once the headers are in), and each unfinished header
is buffered whole (ten 50 MB headers raised a gateway from 674 to 1148 MB RSS).
This protocol, httptools' parser under uvicorn's own request handling, adds:

* Size: more than `max_header_bytes` of request target and headers, or more than
  `max_headers` header lines -> 431. The bytes of a head still arriving are
  counted as they are read, so a header that never ends is cut once the limit
  (plus at most one socket read) is buffered, not when it ends.
* Time: a connection that has not sent a complete head `header_read_timeout`
  seconds after it opened (or after its previous response, for the next request
  on a kept-alive connection once its first byte arrives) -> 408.
* Connections: beyond `max_connections` open at once, a new one is answered 503
  (`code: too_many_connections`, Retry-After) and closed before it is read.

The answers are the server's own JSON error shape (`error(status, message, code)`,
as BodyLimits takes). After one, the connection stops parsing, half-closes, and
discards what the client still sends for LINGER_S (the lingering close of Apache
and nginx): closing with unread bytes would send a reset that can destroy the
answer before the client reads it. Discarded bytes are never buffered.

Why a protocol and not ASGI middleware: the app sees a request only after its
whole head was parsed, which is exactly the cost to bound. Why not h11's
`h11_max_incomplete_event_size`: it answers 400, has no deadline, and parses
several times slower than httptools, which both images ship.
"""
from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import dataclass
from typing import Any, Callable

# Node.js's default --max-http-header-size: OpenAI's SDKs send under 1 KiB of headers;
# a JWT bearer token and tracing headers stay well within.
DEFAULT_MAX_HEADER_BYTES = 16 * 1024
# Apache's LimitRequestFields: the SDKs send about 15 headers, proxies add a handful.
DEFAULT_MAX_HEADERS = 100
# A client sends its head in one packet; 10 s is far beyond any real round trip, while a
# slow-header (slowloris) connection is cut long before it matters (Node: 60 s, Apache 20-40 s).
DEFAULT_HEADER_READ_TIMEOUT_S = 10.0
# Open connections per server. Real clients are the gateway's pool (one connection per
# request in flight) or SDKs; 1024 is 4 x the engine's default max_num_seqs and 3 x the
# 300 concurrent clients of the gateway's load test, while heads cost at most
# 1024 x (16 KiB + one 256 KiB read) even when all of them attack at once.
DEFAULT_MAX_CONNECTIONS = 1024
# How long a refused connection's remaining input is read and dropped before closing.
LINGER_S = 2.0

ErrorBody = Callable[[int, str, "str | None"], dict]


@dataclass(slots=True, frozen=True)
class HeadLimits:
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES   # request target + header names and values; 431 above
    max_headers: int = DEFAULT_MAX_HEADERS             # header lines; 431 above
    header_read_timeout: float = DEFAULT_HEADER_READ_TIMEOUT_S   # s to send a whole head; 408 after
    max_connections: int = DEFAULT_MAX_CONNECTIONS     # open at once; a new one beyond gets 503

    def __post_init__(self) -> None:
        for name in ("max_header_bytes", "max_headers", "max_connections"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not self.header_read_timeout > 0:
            raise ValueError(f"header_read_timeout must be > 0, got {self.header_read_timeout!r}")


def add_head_limit_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("connection and header limits (docs/server.md)")
    g.add_argument("--max-header-bytes", type=int, default=DEFAULT_MAX_HEADER_BYTES, metavar="BYTES",
                   help=f"request target + headers; 431 above (default {DEFAULT_MAX_HEADER_BYTES})")
    g.add_argument("--max-headers", type=int, default=DEFAULT_MAX_HEADERS, metavar="N",
                   help=f"header lines per request; 431 above (default {DEFAULT_MAX_HEADERS})")
    g.add_argument("--header-read-timeout", type=float, default=DEFAULT_HEADER_READ_TIMEOUT_S, metavar="SECONDS",
                   help=f"a client gets 408 if its headers are not all in after this (default "
                        f"{DEFAULT_HEADER_READ_TIMEOUT_S:g})")
    g.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS, metavar="N",
                   help=f"open connections; a new one beyond gets 503 (default {DEFAULT_MAX_CONNECTIONS})")


def head_limits_from_args(args: argparse.Namespace) -> HeadLimits:
    return HeadLimits(max_header_bytes=args.max_header_bytes, max_headers=args.max_headers,
                      header_read_timeout=args.header_read_timeout, max_connections=args.max_connections)


class _Refuse(Exception):
    """Raised in a parser callback to stop parsing; data_received answers it."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def limited_http_protocol(limits: HeadLimits, error: ErrorBody) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with `limits`: pass it as uvicorn.Config(http=...)."""
    try:
        import httptools
        from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
    except ImportError as exc:   # both extras pin httptools; a bare install may lack it
        raise RuntimeError(f"the HTTP server needs httptools (pip install httptools): {exc}") from None

    class HeadLimitedProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.in_head = False          # between a message's first byte and its headers' end
            self.head_bytes = 0           # counted by the callbacks: target + names + values
            self.head_read = 0            # read from the socket while the head was unfinished
            self.num_headers = 0
            self.messages_begun = 0
            self.head_deadline: asyncio.TimerHandle | None = None
            self.refused = False
            self.linger: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            if len(self.connections) >= limits.max_connections:
                self.transport = transport
                self.refuse(503, f"The server has {limits.max_connections} connections open, its limit; retry later.",
                            code="too_many_connections", extra=b"retry-after: 1\r\n")
                return
            super().connection_made(transport)
            self.arm_head_deadline()   # a connection that never sends a head is cut too

        def connection_lost(self, exc: Exception | None) -> None:
            self.disarm_head_deadline()
            if self.linger is not None:
                self.linger.cancel()
            if self.refused and self.cycle is None:
                self.connections.discard(self)
                return
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self.refused:
                return   # lingering: read and dropped
            self._unset_keepalive_if_required()
            # A head begun in an earlier read and unfinished after this one: all of this read is head.
            # A head begun within this read is not counted here (at most one read under) but its
            # callbacks are, and the next read counts whole.
            began, was_in_head = self.messages_begun, self.in_head
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserCallbackError as exc:
                if isinstance(exc.__context__, _Refuse):
                    self.refuse(exc.__context__.status, exc.__context__.message)
                    return
                raise
            except httptools.HttpParserError:
                self.logger.warning("Invalid HTTP request received.")
                self.send_400_response("Invalid HTTP request received.")
                return
            except httptools.HttpParserUpgrade:
                if self._should_upgrade():
                    self.handle_websocket_upgrade()
                else:
                    self._unsupported_upgrade_warning()
                return
            if was_in_head and self.in_head and self.messages_begun == began:
                self.head_read += len(data)
                if self.head_read > limits.max_header_bytes:
                    self.refuse(431, self.too_large())

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self.in_head, self.head_bytes, self.head_read, self.num_headers = True, 0, 0, 0
            self.messages_begun += 1
            if self.head_deadline is None:
                self.arm_head_deadline()

        def on_url(self, url: bytes) -> None:
            self.head_bytes += len(url)
            if self.head_bytes > limits.max_header_bytes:
                raise _Refuse(431, self.too_large())
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self.num_headers += 1
            self.head_bytes += len(name) + len(value)
            if self.num_headers > limits.max_headers:
                raise _Refuse(431, f"The request has more than {limits.max_headers} headers, the limit.")
            if self.head_bytes > limits.max_header_bytes:
                raise _Refuse(431, self.too_large())
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self.in_head = False
            self.disarm_head_deadline()
            super().on_headers_complete()

        def too_large(self) -> str:
            return f"The request's headers are larger than the limit of {limits.max_header_bytes} bytes."

        def arm_head_deadline(self) -> None:
            self.head_deadline = self.loop.call_later(limits.header_read_timeout, self.head_timed_out)

        def disarm_head_deadline(self) -> None:
            if self.head_deadline is not None:
                self.head_deadline.cancel()
                self.head_deadline = None

        def head_timed_out(self) -> None:
            self.head_deadline = None
            if not self.refused and not self.transport.is_closing() and (self.in_head or self.cycle is None):
                self.refuse(408, f"The request headers were not received within {limits.header_read_timeout:g} s.")

        def refuse(self, status: int, message: str, code: str | None = None, extra: bytes = b"") -> None:
            """Answers `status` and closes: stop parsing, half-close, drop input for LINGER_S."""
            self.refused = True
            self.disarm_head_deadline()
            self._unset_keepalive_if_required()
            if self.cycle is not None and not self.cycle.response_complete:
                self.transport.close()   # a pipelined head mid-response: no room for an answer
                return
            body = json.dumps(error(status, message, code)).encode()
            self.transport.write(b"".join((
                STATUS_LINE[status], b"content-type: application/json\r\n",
                b"content-length: %d\r\n" % len(body), extra, b"connection: close\r\n\r\n", body)))
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.linger = self.loop.call_later(LINGER_S, self.transport.close)

    return HeadLimitedProtocol
