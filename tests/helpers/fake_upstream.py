"""An upstream for the gateway that answers like an engine on the control plane
(ready, cache config, the built-in model's tokenizer, an empty cache feed) and
records when each completion request arrives, so a test can order that against
other events. Served by uvicorn in a thread of the test process."""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from pathlib import Path

import uvicorn

from pagedkube import hashing
from pagedkube.tokenizer import TOKENIZER_FILES

BUILTIN = Path(__file__).resolve().parents[2] / "pagedkube" / "builtin" / "tiny"


class FakeEngine:
    def __init__(self, events: list[str], model: str = "tiny"):
        self.events = events   # shared with the test: "upstream got <size>" is appended on each POST
        self.model = model
        self.files = {n: (BUILTIN / n).read_text() for n in TOKENIZER_FILES if (BUILTIN / n).is_file()}
        self.url = ""
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        path = scope["path"]
        if scope["method"] == "POST":
            size = 0
            while True:
                message = await receive()
                size += len(message.get("body", b""))
                if not message.get("more_body"):
                    break
            self.events.append(f"upstream got {size}")
            body = {"id": "cmpl-fake", "object": "text_completion", "model": self.model, "choices": []}
        elif path == "/v1/cache/config":
            body = hashing.cache_config(16)
        elif path == "/v1/cache/tokenizer":
            body = {"files": self.files}
        elif path == "/v1/cache/events":
            await asyncio.sleep(0.5)   # a short long-poll with nothing new
            body = {"engine_id": "fake", "latest_seq": 0, "events": []}
        elif path == "/v1/models":
            body = {"object": "list", "data": [{"id": self.model, "object": "model"}]}
        else:   # /ready, /metrics
            body = {}
        payload = json.dumps(body).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(payload))]})
        await send({"type": "http.response.body", "body": payload})

    def __enter__(self) -> "FakeEngine":
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(self, host="127.0.0.1", port=port, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the fake engine did not start")
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *_) -> None:
        assert self._server is not None and self._thread is not None
        self._server.should_exit = True
        self._thread.join(timeout=10)
