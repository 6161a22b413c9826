"""The gateway proxying to real `pagedkube serve` processes.

Two engines and three gateways (open, with API keys, with a small body limit)
are started once for the module; requests go through the official openai
client or raw httpx and are compared with the same requests sent straight to
an engine.
"""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from pagedkube import hashing
from pagedkube.tokenizer import Tokenizer

pytestmark = pytest.mark.slow  # real processes (engines start in tens of seconds)

MODEL_NAME = "tiny"  # conftest.MODEL_NAME

KEYS = """
keys:
  - {key: sk-a, name: tenant-a}
  - {key: sk-b, name: tenant-b, cache_salt: salt-b}
  - {key: sk-slow, name: slow, requests_per_minute: 2}
"""
PROMPT = "My dog Rex is a 3 year old beagle who loves walks. " * 3 + "How often should I feed him?"


@pytest.fixture(scope="module")
def cluster(module_processes, engine_model_args, tmp_path_factory, wait_until):
    keys = tmp_path_factory.mktemp("keys") / "keys.yaml"
    keys.write_text(KEYS)
    engines = [module_processes.engine(*engine_model_args) for _ in range(2)]
    module_processes.wait_ready(*engines)
    urls = [e.url for e in engines]
    gateways = {
        "open": module_processes.gateway(urls),
        "keys": module_processes.gateway(urls, "--api-keys", str(keys)),
        "small": module_processes.gateway(urls, "--max-body-bytes", "2000", route_headers=False),
    }
    module_processes.wait_ready(*gateways.values())
    for gw in gateways.values():  # the model list and the tokenizer arrive with the first polls
        wait_until(lambda: httpx.get(gw.url + "/v1/models", headers={"authorization": "Bearer sk-a"}).json()["data"]
                   and httpx.get(gw.url + "/ready", headers={"authorization": "Bearer sk-a"}).json()["tokenizer"],
                   timeout=30)
    return engines, gateways


def client(url: str, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)


def _events(stream: bytes) -> tuple[str, list, dict]:
    """(text, finish reasons, usage) of an SSE completion stream; checks its framing."""
    assert stream.endswith(b"data: [DONE]\n\n")
    events = [json.loads(e[len(b"data: "):]) for e in stream.split(b"\n\n")[:-2]]
    text = "".join(c["text"] for e in events for c in e["choices"])
    finish = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
    return text, finish, events[-1]["usage"]


def test_streaming_passes_through(cluster, metric, wait_until):
    """The same stream through the gateway as straight from the engine. (The
    engine may merge tokens into fewer events under load, so two runs compare
    by content; byte-for-byte transparency is test_stream_bytes_are_untouched.)"""
    engines, gateways = cluster
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    warm = httpx.post(gateways["open"].url + "/v1/completions", json=body, timeout=60)
    url = warm.headers["x-pagedkube-endpoint"]  # now the prompt is cached there: both runs below hit it alike
    wait_until(lambda: metric(gateways["open"].url, "pagedkube_gateway_routing_decisions_total") > 0)
    via_gateway = httpx.post(gateways["open"].url + "/v1/completions", json=body, timeout=60)
    direct = httpx.post(url + "/v1/completions", json=body, timeout=60)
    assert via_gateway.headers["x-pagedkube-endpoint"] == url
    assert via_gateway.status_code == direct.status_code == 200
    assert via_gateway.headers["content-type"] == direct.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert _events(via_gateway.content) == _events(direct.content)
    assert _events(via_gateway.content)[2]["prompt_tokens_details"]["cached_tokens"] > 0


def test_usage_passes_through_and_realized_cached_tokens_are_counted(cluster, metric, wait_until):
    _, gateways = cluster
    gw = gateways["open"]
    prompt = "Cats sleep a lot; that is normal. " * 4 + "Should I worry about my cat?"
    before = metric(gw.url, "pagedkube_gateway_realized_cached_tokens_total")
    first = client(gw.url).completions.with_raw_response.create(model=MODEL_NAME, prompt=prompt, max_tokens=4,
                                                                 temperature=0)
    wait_until(lambda: metric(gw.url, "pagedkube_gateway_routing_decisions_total") > 0)
    second = client(gw.url).completions.with_raw_response.create(model=MODEL_NAME, prompt=prompt, max_tokens=4,
                                                                  temperature=0)
    one, two = first.parse(), second.parse()
    assert one.usage.prompt_tokens == two.usage.prompt_tokens > 32
    assert one.usage.prompt_tokens_details.cached_tokens == 0
    cached = two.usage.prompt_tokens_details.cached_tokens
    assert cached == (two.usage.prompt_tokens - 1) // 16 * 16
    assert second.headers["x-pagedkube-endpoint"] == first.headers["x-pagedkube-endpoint"]
    assert metric(gw.url, "pagedkube_gateway_realized_cached_tokens_total") == before + cached
    # Streamed usage counts too.
    stream = client(gw.url).chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": prompt}], max_tokens=3, stream=True,
        stream_options={"include_usage": True})
    usage = [chunk.usage for chunk in stream if chunk.usage][0]
    assert metric(gw.url, "pagedkube_gateway_realized_cached_tokens_total") == (
        before + cached + usage.prompt_tokens_details.cached_tokens)


def test_engine_errors_pass_through_with_their_status(cluster, metric, wait_until):
    engines, gateways = cluster
    body = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 4, "temperature": -1}
    via_gateway = httpx.post(gateways["open"].url + "/v1/completions", json=body, timeout=30)
    direct = httpx.post(engines[0].url + "/v1/completions", json=body, timeout=30)
    assert via_gateway.status_code == direct.status_code == 400
    assert via_gateway.json() == direct.json() and direct.json()["error"]["param"] == "temperature"
    with pytest.raises(openai.BadRequestError):
        client(gateways["open"].url).completions.create(model=MODEL_NAME, prompt="hi", max_tokens=4, temperature=-1)


def _engine_requests(engines, metric) -> float:
    return sum(metric(e.url, "vllm:prompt_tokens_total") for e in engines)


def test_bad_input_is_answered_by_the_gateway_alone(cluster, metric, wait_until):
    engines, gateways = cluster
    before = _engine_requests(engines, metric)
    chat = gateways["small"].url + "/v1/chat/completions"
    cases = [
        (b'{"model": "tiny", "messages": [', 400, "not valid JSON"),
        (json.dumps({"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}).encode(), 404, "gpt-9"),
        (json.dumps({"model": MODEL_NAME, "messages": [{"role": "user", "content": "x" * 5000}]}).encode(),
         413, "2000 bytes"),
        (b'"just a string"', 400, "JSON object"),
    ]
    for body, status, text in cases:
        r = httpx.post(chat, content=body, headers={"content-type": "application/json"}, timeout=30)
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert text in error["message"] and set(error) == {"message", "type", "param", "code"}
        assert "x-pagedkube-endpoint" not in r.headers
    r = httpx.get(chat, timeout=30)
    assert r.status_code == 405 and r.headers["allow"] == "POST" and "use POST" in r.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError):
        client(gateways["small"].url).chat.completions.create(
            model="gpt-9", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert _engine_requests(engines, metric) == before


def test_api_keys_rate_limits_and_tenant_salts(cluster, metric, wait_until):
    engines, gateways = cluster
    gw = gateways["keys"].url
    with pytest.raises(openai.AuthenticationError):
        client(gw).completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2)
    with pytest.raises(openai.AuthenticationError):
        client(gw, "sk-wrong").completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2)
    assert httpx.get(gw + "/v1/models").status_code == 401

    slow = client(gw, "sk-slow")
    for _ in range(2):
        slow.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2)
    with pytest.raises(openai.RateLimitError) as e:
        slow.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2)
    assert int(e.value.response.headers["retry-after"]) >= 1

    # Same prompt, three tenants: each one's second request hits its own cache,
    # nobody's first request hits another tenant's blocks.
    prompt = "Dogs need fresh water every day. " * 4 + "How much water does a puppy need?"
    tenants = [("sk-a", "tenant-a"), ("sk-b", "salt-b")]
    for key, salt in tenants:
        c = client(gw, key)
        # A client-supplied cache_salt is replaced by the tenant's.
        first = c.completions.with_raw_response.create(model=MODEL_NAME, prompt=prompt, max_tokens=2,
                                                       extra_body={"cache_salt": "tenant-a"})
        assert first.parse().usage.prompt_tokens_details.cached_tokens == 0, key
        url = first.headers["x-pagedkube-endpoint"]
        tokenizer = Tokenizer(httpx.get(url + "/v1/cache/tokenizer").json()["files"])
        ids = tokenizer.encode(prompt)
        expected = hashing.to_hex(hashing.block_hashes(ids, 16, cache_salt=salt))
        held = set()
        for ev in httpx.get(url + "/v1/cache/events", params={"after": 0}).json()["events"]:
            held |= set(ev["block_hashes"]) if ev["type"] == "stored" else set()
        assert set(expected) <= held, "the engine stored the tenant-salted hashes the gateway computes"
        wait_until(lambda: metric(gw, "pagedkube_gateway_requests_total") > 0)
        second = c.completions.with_raw_response.create(model=MODEL_NAME, prompt=prompt, max_tokens=2)
        assert second.headers["x-pagedkube-endpoint"] == url and second.headers["x-pagedkube-route"] == "affinity"
        assert second.parse().usage.prompt_tokens_details.cached_tokens > 0


def test_a_keyed_gateway_tells_nothing_about_engines_or_models_without_a_key(cluster):
    _, gateways = cluster
    gw, key = gateways["keys"].url, {"authorization": "Bearer sk-a"}
    ready = httpx.get(gw + "/ready")
    assert (ready.status_code, ready.json()) == (200, {"ready": True})   # what the readiness probe needs, no more
    assert sorted(httpx.get(gw + "/ready", headers=key).json()) == ["endpoints", "feeds", "ready", "tokenizer"]
    assert httpx.get(gw + "/ready", headers={"authorization": "Bearer sk-wrong"}).json() == {"ready": True}

    def model_field(headers=None):
        doc = httpx.get(gw + "/openapi.json", headers=headers).json()
        return doc["paths"]["/v1/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"][
            "properties"]["model"]
    assert model_field() == {"type": "string"} and model_field(key) == {"type": "string", "enum": [MODEL_NAME]}
    assert httpx.get(gw + "/v1/models").status_code == 401


def test_models_health_ready_metrics(cluster, metric, wait_until):
    engines, gateways = cluster
    gw = gateways["open"].url
    models = httpx.get(gw + "/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == [MODEL_NAME]
    assert httpx.get(gw + "/health").status_code == 200
    ready = httpx.get(gw + "/ready").json()
    assert ready["endpoints"] == {"ready": 2, "not_ready": 0, "terminating": 0, "ejected": 0}
    assert ready["ready"] is ready["tokenizer"] is True and sorted(ready["feeds"]) == sorted(e.url for e in engines)
    assert metric(gw, "pagedkube_gateway_endpoints", state="ready") == 2
    assert metric(gw, "pagedkube_gateway_requests_total", model=MODEL_NAME, code="200") > 0


def test_client_disconnect_cancels_the_upstream_request(cluster, metric, wait_until):
    engines, gateways = cluster
    gw = gateways["open"].url
    body = {"model": MODEL_NAME, "prompt": "Tell me about dogs.", "max_tokens": 400, "ignore_eos": True,
            "stream": True}
    before = {e.url: metric(e.url, "vllm:generation_tokens_total") for e in engines}
    with httpx.stream("POST", gw + "/v1/completions", json=body, timeout=60) as r:
        url = r.headers["x-pagedkube-endpoint"]
        next(r.iter_raw())
    # Closed after one chunk: the engine must abort long before 400 tokens.
    wait_until(lambda: metric(url, "vllm:num_requests_running") == 0, timeout=60)
    generated = metric(url, "vllm:generation_tokens_total") - before[url]
    assert generated < 300, f"the engine kept generating after the client left ({generated} tokens)"
    wait_until(lambda: metric(gw, "pagedkube_gateway_endpoint_in_flight") == 0, timeout=10)
