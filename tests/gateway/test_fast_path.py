"""gateway/fast_path.py: the proxied routes bypass FastAPI, everything else reaches it,
and an unexpected error in the handler is an OpenAI-shaped 500, not a dropped connection."""
import asyncio

import httpx
from fastapi import FastAPI
from starlette.responses import JSONResponse

from pagedkube.gateway.fast_path import FastPath


def serve(handle):
    app = FastAPI()
    app.get("/health")(lambda: {"status": "ok"})
    front = FastPath(app, handle)
    assert front.state is app.state
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=front), base_url="http://gw")


async def _calls():
    seen = []

    async def handle(request, path):
        seen.append((path, await request.body()))
        if path == "/v1/completions":
            raise RuntimeError("boom")
        return JSONResponse({"ok": path})

    async with serve(handle) as client:
        ok = await client.post("/v1/chat/completions", content=b'{"x": 1}')
        boom = await client.post("/v1/completions", content=b"{}")
        wrong = await client.get("/v1/chat/completions")
        health = await client.get("/health")
        missing = await client.get("/nope")
        again = await client.post("/v1/chat/completions", content=b"{}")
    return seen, ok, boom, wrong, health, missing, again


def test_routes_errors_and_the_rest():
    seen, ok, boom, wrong, health, missing, again = asyncio.run(_calls())
    assert ok.status_code == 200 and ok.json() == {"ok": "/v1/chat/completions"}
    assert seen[0] == ("/v1/chat/completions", b'{"x": 1}')
    assert boom.status_code == 500
    assert boom.json()["error"] == {"message": "Internal gateway error: RuntimeError", "type": "server_error",
                                    "param": None, "code": None}
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    assert wrong.json()["error"]["code"] is None and len(seen) == 3  # the handler never saw the GET
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert missing.status_code == 404
    assert again.status_code == 200  # still serving after the error
