"""The gateway under faults and hostile input (issue 14): a stream cut by a dying
engine is an error the `openai` client raises, a multi-megabyte prompt does not
stop the gateway answering, client mistakes are 4xx in OpenAI's shape, and every
answer is counted in pagedkube_gateway_requests_total."""
from __future__ import annotations

import json
import socket

import httpx
import openai
import pytest

from fake_upstream import FakeEngine

pytestmark = pytest.mark.slow  # real processes

MODEL_NAME = "tiny"  # conftest.MODEL_NAME
MAX_BODY = 4096


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)


def test_an_engine_killed_mid_stream_is_an_error_the_openai_client_raises(processes, engine_model_args, metric):
    engine = processes.engine(*engine_model_args)
    processes.wait_ready(engine)
    gw = processes.gateway([engine.url])
    processes.wait_ready(gw)
    stream = client(gw.url).completions.create(model=MODEL_NAME, prompt="Tell me about dogs.", max_tokens=2000,
                                               extra_body={"ignore_eos": True}, stream=True)
    chunks = iter(stream)
    first = next(chunks)
    assert first.choices and first.model == MODEL_NAME   # a real answer was flowing
    engine.kill()   # SIGKILL: no goodbye from the engine, the connection just breaks
    with pytest.raises(openai.APIError, match="failed mid-stream") as raised:
        for _ in chunks:
            pass
    assert raised.value.body["type"] == "server_error" and raised.value.body["code"] is None
    assert metric(gw.url, "pagedkube_gateway_stream_errors_total", cause="broken") == 1
    assert metric(gw.url, "pagedkube_gateway_requests_total", model=MODEL_NAME, code="502") == 1
    assert metric(gw.url, "pagedkube_gateway_requests_total", model=MODEL_NAME, code="200") == 0


def test_health_answers_while_a_big_prompt_is_tokenized(processes, wait_until):
    """Ordered events, no clocks: the gateway is sent a ~7.6 MB chat; /health is then asked
    again and again, and must answer many times before the upstream receives the chat
    (which the gateway forwards only once it has tokenized and hashed it)."""
    events: list[str] = []
    with FakeEngine(events) as engine:
        gw = processes.gateway([engine.url])
        processes.wait_ready(gw)
        wait_until(lambda: httpx.get(gw.url + "/ready").json()["tokenizer"], timeout=60)
        content = "My dog Rex is a 3 year old beagle who loves walks. " * 150_000
        body = json.dumps({"model": MODEL_NAME, "messages": [{"role": "user", "content": content}]}).encode()
        assert 7 << 20 < len(body) < 8 << 20   # under the gateway's default limit of 8 MiB
        port = int(gw.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=300) as big, httpx.Client(timeout=60) as http:
            big.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n"
                        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            events.append("big sent")
            while not any(e.startswith("upstream got") for e in events):
                assert http.get(gw.url + "/health").status_code == 200
                events.append("health")
            answer = b""
            while chunk := big.recv(65536):
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    forwarded = next(i for i, e in enumerate(events) if e.startswith("upstream got"))
    assert events[forwarded] == f"upstream got {len(body)}"
    healths = events[events.index("big sent"):forwarded].count("health")
    # Tokenized on the event loop, /health answered 7 times in that window (while the body
    # was still arriving), then not until the chat was forwarded; in the pool, thousands.
    assert healths >= 50, events[:forwarded + 1]


@pytest.fixture(scope="module")
def gateway_and_engine(module_processes, engine_model_args):
    engine = module_processes.engine(*engine_model_args)
    module_processes.wait_ready(engine)
    gw = module_processes.gateway([engine.url], "--max-body-bytes", str(MAX_BODY), "--body-read-timeout", "1")
    module_processes.wait_ready(gw)
    return gw, engine


def _counts(metric, url: str) -> dict[tuple[str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        for s in family.samples:
            if s.name == "pagedkube_gateway_requests_total":
                out[(s.labels["model"], s.labels["code"])] = s.value
    return out


def _check_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and (error["code"] is None or isinstance(error["code"], str))
    return error


def test_client_mistakes_are_4xx_in_openais_shape_and_all_counted(gateway_and_engine, metric, wait_until):
    gw, _ = gateway_and_engine
    wait_until(lambda: httpx.get(gw.url + "/v1/models").json()["data"], timeout=30)
    before = _counts(metric, gw.url)
    completions = gw.url + "/v1/completions"
    # Token ids outside what a block hash encodes (u32) once raised OverflowError in the gateway: a 500.
    for ids in ([-1], [2 ** 32], [5, 2 ** 40]):
        error = _check_error(httpx.post(completions, json={"model": MODEL_NAME, "prompt": ids, "max_tokens": 1}), 400)
        assert (error["param"] or "").startswith("prompt"), error
    deep = b'{"model": "tiny", "prompt": ' + b"[" * 2000 + b"]" * 2000 + b"}"
    assert "nested too deeply" in _check_error(httpx.post(completions, content=deep), 400)["message"]
    error = _check_error(httpx.get(gw.url + "/v1/nope"), 404)
    assert error["message"] == "Unknown route GET /v1/nope." and error["type"] == "invalid_request_error"
    r = httpx.post(gw.url + "/v1/models")
    assert _check_error(r, 405)["message"] == "Method POST is not allowed on /v1/models." and r.headers["allow"] == "GET"
    _check_error(httpx.get(completions), 405)
    _check_error(httpx.post(completions, json={"model": MODEL_NAME, "prompt": "x" * MAX_BODY}), 413)
    with pytest.raises(openai.NotFoundError) as e:
        client(gw.url).completions.create(model="gpt-9", prompt="hi", max_tokens=1)
    assert e.value.body["code"] == "model_not_found"
    with socket.create_connection(("127.0.0.1", int(gw.url.rsplit(":", 1)[1])), timeout=60) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n" + b'{"prompt": "half a bod')
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408") and json.loads(payload)["error"]["message"].endswith("within 1 s.")
    expected = {(MODEL_NAME, "400"): 3, ("unknown", "400"): 1, ("unknown", "404"): 2, ("unknown", "405"): 2,
                ("unknown", "413"): 1, ("unknown", "408"): 1}
    after = _counts(metric, gw.url)
    assert {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)
            if after.get(k, 0) != before.get(k, 0)} == expected
