"""Small ASGI apps served for a test: uvicorn in a thread of the test process on a free
loopback port (tests/helpers/fake_upstream.py, tests/gateway/test_gateway_passthrough.py,
tests/pagedkube/test_http_limits.py). A plain module on sys.path (pyproject: pythonpath)."""
from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any, Iterator

import uvicorn

START_TIMEOUT_S = 30.0   # uvicorn binds in milliseconds; a loaded 2-core machine may take seconds


async def handled_lifespan(scope: dict, receive: Any, send: Any) -> bool:
    """Answers a lifespan scope (startup and shutdown complete); False for any other scope."""
    if scope["type"] != "lifespan":
        return False
    while (await receive())["type"] != "lifespan.shutdown":
        await send({"type": "lifespan.startup.complete"})
    await send({"type": "lifespan.shutdown.complete"})
    return True


async def read_body(receive: Any) -> bytes:
    """The whole request body, however many messages it came in."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


@contextlib.contextmanager
def serve_in_thread(app: Any, **config: Any) -> Iterator[int]:
    """Serves `app` on 127.0.0.1 until the block ends; yields the port once uvicorn listens.
    `config`: more uvicorn.Config arguments (`http=` a protocol class)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **config))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError(f"uvicorn did not start serving {app!r}")
            time.sleep(0.02)
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=10)
