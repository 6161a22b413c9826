"""pagedkube/http_limits.py BodyLimits in front of a small app, served by a real
uvicorn on loopback and spoken to over raw sockets (a client that stops
mid-body cannot be written with an HTTP library)."""
from __future__ import annotations

import asyncio
import json
import socket

import pytest

from asgi_server import handled_lifespan, serve_in_thread
from pagedkube.http_limits import DEFAULT_BODY_READ_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES, BodyLimits

LIMIT = 1000
READ_TIMEOUT_S = 1.0   # the deadline under test: the client below never sends the rest


def error_body(status: int, message: str, code: str | None) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}


async def echo(scope, receive, send):
    """Answers the body it read and whether the server's receive() still gets through after it."""
    if await handled_lifespan(scope, receive, send):
        return
    first = await receive()
    assert first["type"] == "http.request" and first["more_body"] is False   # one message, replayed whole
    body = json.dumps({"method": scope["method"], "size": len(first["body"]),
                       "head": first["body"][:20].decode()}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def server():
    app = BodyLimits(echo, max_bytes=LIMIT, read_timeout_s=READ_TIMEOUT_S, error=error_body)
    with serve_in_thread(app) as port:
        yield port


def exchange(port: int, head: bytes, body: bytes = b"") -> tuple[int, dict, bytes]:
    """Sends `head` + `body` (the head asks the server to close) and reads the answer to the end."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    raw_headers, _, payload = rest.partition(b"\r\n\r\n")
    headers = dict(line.decode().lower().split(": ", 1) for line in raw_headers.split(b"\r\n") if line)
    return int(status_line.split()[1]), headers, payload


def post_head(length: int | None, chunked: bool = False) -> bytes:
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
    if chunked:
        head += b"Transfer-Encoding: chunked\r\n"
    elif length is not None:
        head += b"Content-Length: %d\r\n" % length
    return head + b"\r\n"


def test_a_body_within_the_limits_reaches_the_app_whole(server):
    body = b'{"prompt": "' + b"x" * 900 + b'"}'
    status, _, payload = exchange(server, post_head(len(body)), body)
    assert status == 200 and json.loads(payload) == {"method": "POST", "size": len(body), "head": '{"prompt": "xxxxxxxx'}
    status, _, payload = exchange(server, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status == 200 and json.loads(payload)["size"] == 0


def test_half_a_body_gets_408_after_the_deadline(server):
    # Headers say 600 bytes; 300 arrive and then nothing: without a deadline the server waits forever.
    status, headers, payload = exchange(server, post_head(600), b"x" * 300)
    assert status == 408 and headers["connection"] == "close"
    assert json.loads(payload) == error_body(408, f"The request body was not received within {READ_TIMEOUT_S:g} s.",
                                             None)


def test_a_chunked_body_that_stops_gets_408(server):
    status, _, _ = exchange(server, post_head(None, chunked=True), b"a\r\n0123456789\r\n")
    assert status == 408


def test_a_content_length_over_the_limit_gets_413_without_reading_the_body(server):
    # Only the headers are sent: the answer cannot have waited for the body.
    status, headers, payload = exchange(server, post_head(LIMIT + 1))
    assert status == 413 and headers["connection"] == "close"
    assert json.loads(payload)["error"]["message"] == f"The request body is larger than the limit of {LIMIT} bytes."


def test_a_chunked_body_over_the_limit_gets_413(server):
    chunk = b"x" * 600
    body = b"%x\r\n%s\r\n" % (len(chunk), chunk) * 2 + b"0\r\n\r\n"
    status, _, payload = exchange(server, post_head(None, chunked=True), body)
    assert status == 413 and json.loads(payload)["error"]["code"] is None
    status, _, _ = exchange(server, post_head(None, chunked=True), b"%x\r\n%s\r\n0\r\n\r\n" % (len(chunk), chunk))
    assert status == 200


def test_bad_arguments_are_refused():
    for kwargs, message in (({"max_bytes": 0}, "max_bytes"), ({"max_bytes": 1.5}, "max_bytes"),
                            ({"read_timeout_s": 0}, "read_timeout_s")):
        with pytest.raises(ValueError, match=message):
            BodyLimits(echo, error=error_body, **kwargs)
    limits = BodyLimits(echo, error=error_body)
    assert (limits.max_bytes, limits.read_timeout_s) == (DEFAULT_MAX_BODY_BYTES, DEFAULT_BODY_READ_TIMEOUT_S)


def test_other_scopes_pass_through():
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["type"])

    asyncio.run(BodyLimits(app, max_bytes=1, read_timeout_s=1, error=error_body)({"type": "lifespan"}, None, None))
    assert seen == ["lifespan"]
