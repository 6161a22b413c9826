"""pagedkube/http_head_limits.py: a small app served by a real uvicorn with the limited
protocol, attacked over raw sockets. The servers themselves (gateway and engine
processes, with memory measured) are in tests/gateway/test_head_limits.py."""
from __future__ import annotations

import asyncio
import json
import socket

import pytest

from asgi_server import handled_lifespan, serve_in_thread
from head_attacks import HEAD, big_header, get, many_headers, parse, send_head, slow_head
from pagedkube.http_head_limits import (DEFAULT_HEADER_READ_TIMEOUT_S, DEFAULT_MAX_CONNECTIONS,
                                        DEFAULT_MAX_HEADER_BYTES, DEFAULT_MAX_HEADERS, HeadLimits,
                                        limited_http_protocol)

LIMITS = HeadLimits(max_header_bytes=4096, max_headers=20, header_read_timeout=1.0, max_connections=30)


def error_body(status: int, message: str, code: str | None) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}


async def hello(scope, receive, send):
    if await handled_lifespan(scope, receive, send):
        return
    body = json.dumps({"headers": len(scope["headers"])}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def port():
    with serve_in_thread(hello, http=limited_http_protocol(LIMITS, error_body)) as port:
        yield port


def test_a_head_within_the_limits_is_served(port):
    head = HEAD + b"".join(b"X-H%d: v\r\n" % i for i in range(LIMITS.max_headers - 4)) + b"Content-Length: 0\r\n\r\n"
    answer = asyncio.run(send_head(port, head.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1)))
    assert (answer.status, json.loads(answer.body)) == (200, {"headers": LIMITS.max_headers})


@pytest.mark.parametrize("head, message", [
    (big_header(1 << 20), "The request's headers are larger than the limit of 4096 bytes."),
    (big_header(5000), "The request's headers are larger than the limit of 4096 bytes."),
    (b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", "The request's headers are larger than the limit of 4096 bytes."),
    (many_headers(10_000), "The request has more than 20 headers, the limit."),
    (many_headers(21), "The request has more than 20 headers, the limit."),
])
def test_an_oversized_head_gets_431(port, head, message):
    answer = asyncio.run(send_head(port, head))
    assert answer.status == 431 and json.loads(answer.body) == error_body(431, message, None)
    assert answer.sent == len(head)   # the lingering close read it all: the answer was not lost to a reset


def test_a_header_that_never_ends_is_cut_at_the_limit_not_at_its_end(port):
    # 64 MiB of header value offered; the server answers after reading the limit (plus one socket read).
    answer = asyncio.run(send_head(port, HEAD + b"X-Big: " + b"a" * (64 << 20), chunk=1 << 20))
    assert answer.status == 431


def test_slow_headers_get_408_and_others_are_served_meanwhile(port):
    async def attack():
        slow = [asyncio.create_task(slow_head(port, interval_s=0.1, give_up_after=300)) for _ in range(20)]
        await asyncio.sleep(0.3)
        served = await asyncio.to_thread(get, port)
        return served, await asyncio.gather(*slow)

    served, answers = asyncio.run(attack())
    assert served == 200
    assert [a.status for a in answers] == [408] * 20
    assert json.loads(answers[0].body)["error"]["message"] == "The request headers were not received within 1 s."
    assert max(a.sent for a in answers) < len(HEAD) + 8 + 300   # cut by the server, never by giving up


def test_a_connection_that_sends_nothing_gets_408(port):
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert parse(data)[0] == 408


def test_the_next_request_on_a_kept_alive_connection_is_limited_too(port):
    ok = HEAD + b"Content-Length: 0\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(ok)
        first = s.recv(65536)
        s.sendall(big_header(5000))
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    assert parse(first)[0] == 200 and parse(data)[0] == 431


def test_connections_beyond_the_cap_get_503_and_later_ones_are_served(port):
    held = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(LIMITS.max_connections)]
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        status, body = parse(data)
        assert status == 503 and json.loads(body)["error"]["code"] == "too_many_connections"
        assert b"retry-after: 1" in data.lower()
    finally:
        for s in held:
            s.close()
    assert get(port) == 200   # held connections are gone (their close was seen before this one's accept)


def test_defaults_and_bad_values():
    assert HeadLimits() == HeadLimits(DEFAULT_MAX_HEADER_BYTES, DEFAULT_MAX_HEADERS, DEFAULT_HEADER_READ_TIMEOUT_S,
                                      DEFAULT_MAX_CONNECTIONS)
    assert (DEFAULT_MAX_HEADER_BYTES, DEFAULT_MAX_HEADERS, DEFAULT_HEADER_READ_TIMEOUT_S,
            DEFAULT_MAX_CONNECTIONS) == (16384, 100, 10.0, 1024)
    for kwargs, name in (({"max_header_bytes": 0}, "max_header_bytes"), ({"max_headers": 1.5}, "max_headers"),
                         ({"max_connections": True}, "max_connections"), ({"header_read_timeout": 0}, "header_read")):
        with pytest.raises(ValueError, match=name):
            HeadLimits(**kwargs)
