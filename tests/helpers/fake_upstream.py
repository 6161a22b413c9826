"""An upstream for the gateway that answers like an engine on the control plane
(ready, cache config, the built-in model's tokenizer, an empty cache feed) and
records when each completion request arrives, so a test can order that against
other events. Served by uvicorn in a thread of the test process."""
from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

from pagedkube import hashing
from pagedkube.tokenizer import TOKENIZER_FILES

from asgi_server import handled_lifespan, read_body, serve_in_thread

BUILTIN = Path(__file__).resolve().parents[2] / "pagedkube" / "builtin" / "tiny"


class FakeEngine:
    def __init__(self, events: list[str], model: str = "tiny"):
        self.events = events   # shared with the test: "upstream got <size>" is appended on each POST
        self.model = model
        self.files = {n: (BUILTIN / n).read_text() for n in TOKENIZER_FILES if (BUILTIN / n).is_file()}
        self.url = ""
        self._serving: contextlib.ExitStack | None = None

    async def __call__(self, scope, receive, send) -> None:
        if await handled_lifespan(scope, receive, send):
            return
        path = scope["path"]
        if scope["method"] == "POST":
            self.events.append(f"upstream got {len(await read_body(receive))}")
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
        self._serving = contextlib.ExitStack()
        port = self._serving.enter_context(serve_in_thread(self))
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *_) -> None:
        assert self._serving is not None
        self._serving.close()
