"""The engine server's HTTP edges: body limits (413 / 408), client mistakes as 4xx in
OpenAI's shape with a string or null code, and every response counted."""
from __future__ import annotations

import json
import socket

import pytest

from .conftest import metric_value


def test_oversized_body_is_413(server, http):
    r = http.post("/v1/completions", content=b'{"prompt": "' + b"a" * (17 << 20) + b'"}',
                  headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["type"] == "invalid_request_error"


def test_half_a_body_is_408(tmp_path):
    from .conftest import ServerProcess
    server = ServerProcess(tmp_path, "--body-read-timeout", "1", "--max-model-len", "128", name="slow-body").start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{\"prompt\": ")
            # the server closes the connection after the 408: read to the end, not one segment
            # (the headers and the JSON body can arrive in two)
            answer = b"".join(iter(lambda: s.recv(65536), b"")).decode()
        assert answer.startswith("HTTP/1.1 408"), answer
        error = json.loads(answer.partition("\r\n\r\n")[2])["error"]
        assert error["type"] == "invalid_request_error"   # the client was slow, not the server
    finally:
        server.stop()


@pytest.mark.parametrize("body", [b"[" * 100_000 + b"]" * 100_000, b'{"prompt": [4294967296]}',
                                  b'{"prompt": [-1]}', b'{"prompt": "hi", "n": 1000}'])
def test_client_mistakes_are_4xx_with_string_or_null_code(http, body):
    r = http.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500, r.text[:300]
    error = r.json()["error"]
    assert error["code"] is None or isinstance(error["code"], str)


def test_unknown_routes_and_methods_are_openai_shaped_and_counted(http):
    before = http.get("/metrics").text

    def count(handler: str, method: str, status: str, text: str) -> float:
        try:
            return metric_value(text, "http_requests_total", handler=handler, method=method, status=status)
        except KeyError:
            return 0.0
    assert http.get("/v1/nope").status_code == 404
    r = http.get("/v1/completions")
    assert r.status_code == 405 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    after = http.get("/metrics").text
    assert count("none", "GET", "4xx", after) == count("none", "GET", "4xx", before) + 1
    assert count("/v1/completions", "GET", "4xx", after) == count("/v1/completions", "GET", "4xx", before) + 1
