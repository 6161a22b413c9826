"""Byte-level transparency of the proxy, against an upstream whose bytes we fix.

A real engine may merge tokens into fewer SSE events from one run to the next,
so exact bytes are checked against a small ASGI upstream (served by uvicorn in
a thread) that streams unusual but valid SSE: comments, CRLF line ends, no
space after `data:`, events split across writes, non-ASCII text.
"""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from asgi_server import handled_lifespan, read_body, serve_in_thread

pytestmark = pytest.mark.slow  # a real gateway process

CHUNKS = [b": keep-alive comment\r\n\r\n", b'data:{"choices": [{"text": "h', b'\xc3', b'\xa9"}]}\r\n\r\n',
          b'data: {"choices": [], "usage": {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2}}}\n\n',
          b"data: [DONE]\n\n"]
JSON_BODY = b'{"weird":   "spacing",\n "usage": {"prompt_tokens_details": {"cached_tokens": 7}}}'


async def upstream_app(scope, receive, send):
    if await handled_lifespan(scope, receive, send):
        return
    path = scope["path"]
    if scope["method"] == "GET":
        status = 200 if path == "/ready" else 404
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    request = json.loads(await read_body(receive))
    if request.get("stream"):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"x-upstream", b"yes")]})
        # "cut": the stream stops after half an event, with no [DONE] (a clean close all the same).
        for chunk in CHUNKS if not request.get("cut") else CHUNKS[:2]:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await asyncio.sleep(0.01)
        await send({"type": "http.response.body", "body": b""})
    else:
        await send({"type": "http.response.start", "status": 201, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": JSON_BODY})


@pytest.fixture
def upstream():
    with serve_in_thread(upstream_app) as port:
        yield f"http://127.0.0.1:{port}"


def test_stream_bytes_are_untouched(upstream, processes, metric, wait_until):
    gw = processes.gateway([upstream])
    processes.wait_ready(gw)
    body = {"model": "m", "prompt": "abc", "stream": True}
    with httpx.stream("POST", gw.url + "/v1/completions", json=body, timeout=30) as r:
        received = b"".join(r.iter_raw())
        assert r.status_code == 200 and r.headers["x-upstream"] == "yes"
        assert r.headers["content-type"] == "text/event-stream"
        assert r.headers["x-pagedkube-route"] == "fallback"  # this upstream serves no tokenizer
    assert received == b"".join(CHUNKS)
    r = httpx.post(gw.url + "/v1/completions", json={"prompt": "abc"}, timeout=30)
    assert (r.status_code, r.content) == (201, JSON_BODY)
    wait_until(lambda: metric(gw.url, "pagedkube_gateway_realized_cached_tokens_total") == 2 + 7, timeout=10)


def test_a_stream_that_ends_without_done_gets_an_error_event(upstream, processes, metric):
    gw = processes.gateway([upstream])
    processes.wait_ready(gw)
    body = {"model": "m", "prompt": "abc", "stream": True, "cut": True}
    with httpx.stream("POST", gw.url + "/v1/completions", json=body, timeout=30) as r:
        received = b"".join(r.iter_raw())
        assert r.status_code == 200
    # The whole first event, not the half of the second, then the error event; no [DONE].
    first, _, error = received.partition(b"\r\n\r\n")
    assert first + b"\r\n\r\n" == CHUNKS[0] and error.startswith(b"data: {") and error.endswith(b"}\n\n")
    event = json.loads(error[len(b"data: "):])["error"]
    assert event["type"] == "server_error" and "ended the stream without [DONE]" in event["message"]
    assert metric(gw.url, "pagedkube_gateway_stream_errors_total", cause="eof") == 1
    assert metric(gw.url, "pagedkube_gateway_requests_total", code="502") == 1
