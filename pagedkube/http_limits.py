"""BodyLimits: a pure ASGI middleware that bounds what reading a request body may cost.

    BodyLimits(app, *, max_bytes=8 << 20, read_timeout_s=30.0, error=my_error_body)

* Size: a body larger than `max_bytes` is answered 413 before the app runs. A
  Content-Length over the limit is refused without reading a byte; a chunked
  body is refused as soon as the bytes read pass the limit.
* Time: a client that sent its headers but not its whole body within
  `read_timeout_s` seconds is answered 408 (uvicorn, and vLLM behind it, wait
  forever: a connection that sends half a body holds a socket, a task and the
  bytes so far until the client goes). The deadline covers the whole body, not
  each chunk, so a client trickling one byte a second cannot stretch it.
* `error(status, message, code)` builds the JSON body of those two answers, so
  each app keeps its own error shape (OpenAI's `{"error": {...}}` in ours);
  `code` is a string or None.

How: the middleware reads the whole body itself, then hands the app a
`receive` that replays it as one `http.request` message and afterwards passes
through to the server's (so the app still sees `http.disconnect`). The apps it
fronts (the gateway, the engine server) read JSON bodies whole anyway, so the
buffering costs no extra memory beyond one join. Requests without a body (GET)
pass at the cost of one `receive()`. Both answers close the connection: the
rest of the body may still be in flight and is not worth reading.

Pure ASGI, not Starlette's BaseHTTPMiddleware (which runs the app in a task
group and breaks streaming and disconnect handling); torch-free and
dependency-free, so the gateway image can use it.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any, Awaitable, Callable, MutableMapping

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
ErrorBody = Callable[[int, str, "str | None"], dict]

# vLLM's and OpenAI's servers take bodies of tens of MB; 8 MiB is ~2M tokens of text,
# beyond any context this project serves (the gateway's limit since its first version).
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
# uvicorn and vLLM have no body deadline at all. 30 s lets a maximal 8 MiB body arrive
# at ~2.2 Mbit/s (a slow mobile uplink), while a client that stalls mid-body is cut
# well before a kubelet or load balancer would give up on the connection.
DEFAULT_BODY_READ_TIMEOUT_S = 30.0


class _Disconnected(Exception):
    """The client left before its body was complete: nothing to answer."""


class _BodyTooLarge(Exception):
    pass


class BodyLimits:
    def __init__(self, app: ASGIApp, *, max_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 read_timeout_s: float = DEFAULT_BODY_READ_TIMEOUT_S, error: ErrorBody):
        """`error(status, message, code)` -> the JSON object answered with 413 / 408."""
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes <= 0:
            raise ValueError(f"max_bytes must be a positive integer, got {max_bytes!r}")
        if not read_timeout_s > 0:
            raise ValueError(f"read_timeout_s must be > 0, got {read_timeout_s!r}")
        self.app = app
        self.max_bytes = max_bytes
        self.read_timeout_s = float(read_timeout_s)
        self.error = error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _content_length(scope)
        if length is not None and length > self.max_bytes:
            await self._answer(send, 413, self._too_large())
            return
        try:
            async with asyncio.timeout(self.read_timeout_s):   # no extra task, unlike wait_for
                body = await self._read(receive)
        except _BodyTooLarge:
            await self._answer(send, 413, self._too_large())
            return
        except _Disconnected:
            return
        except asyncio.TimeoutError:
            await self._answer(send, 408, f"The request body was not received within {self.read_timeout_s:g} s.")
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read(self, receive: Receive) -> bytes:
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Disconnected()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise _BodyTooLarge()
            if chunk:
                parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)

    def _too_large(self) -> str:
        return f"The request body is larger than the limit of {self.max_bytes} bytes."

    async def _answer(self, send: Send, status: int, message: str) -> None:
        body = json.dumps(self.error(status, message, None)).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


def _content_length(scope: Scope) -> int | None:
    """The Content-Length header, or None when absent or not a number (the server
    rejects a malformed one before the app runs; chunked bodies have none)."""
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive() that yields the buffered body once, then the server's own messages."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
