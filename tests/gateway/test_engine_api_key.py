"""A gateway in front of engines started with --api-key: --engine-api-key
carries the engines' key on the cache feed, the probes and every forwarded
request, so routing keeps its tokenizer and feed, and tenants never see it."""
from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.slow  # real processes

MODEL_NAME = "tiny"  # conftest.MODEL_NAME
PROMPT = "My dog Rex is a 3 year old beagle who loves long walks in the park. " * 4 + "Food?"


def complete(url: str, key: str) -> httpx.Response:
    return httpx.post(url + "/v1/completions", headers={"authorization": f"Bearer {key}"}, timeout=60,
                      json={"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 4, "temperature": 0})


def test_keyed_engines_behind_a_gateway(processes, engine_model_args, tmp_path, wait_until):
    keys = tmp_path / "keys.yaml"
    keys.write_text("keys:\n  - {key: sk-tenant, name: tenant}\n")
    engine = processes.engine(*engine_model_args, "--api-key", "sk-engine")
    processes.wait_ready(engine)
    keyed = processes.gateway([engine.url], "--engine-api-key", "sk-engine", "--api-keys", str(keys))
    unkeyed = processes.gateway([engine.url])
    processes.wait_ready(keyed, unkeyed)

    # The keyed gateway fetched the tokenizer and follows the feed through the engine's key.
    tenant = {"authorization": "Bearer sk-tenant"}   # /ready's details are for key holders
    wait_until(lambda: httpx.get(keyed.url + "/ready", headers=tenant).json()["tokenizer"], timeout=30)
    first = complete(keyed.url, "sk-tenant")
    assert first.status_code == 200, first.text
    wait_until(lambda: httpx.get(keyed.url + "/ready", headers=tenant).json()["feeds"].get(engine.url, 0) > 0,
               timeout=30)
    second = complete(keyed.url, "sk-tenant")
    assert second.status_code == 200 and second.headers["x-pagedkube-route"] == "affinity"
    assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 64
    assert second.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
    # Tenants use their own key; the engine's key is not theirs to use at the gateway.
    assert complete(keyed.url, "sk-engine").status_code == 401

    # Without --engine-api-key the gateway cannot read the feed or the tokenizer: routing
    # falls back to raw text, and the engine answers only clients that carry its key.
    assert httpx.get(unkeyed.url + "/ready").json()["tokenizer"] is False
    assert complete(unkeyed.url, "sk-tenant").status_code == 401
    fallback = complete(unkeyed.url, "sk-engine")
    assert fallback.status_code == 200 and fallback.headers["x-pagedkube-route"] == "fallback"
    assert httpx.get(engine.url + "/v1/models").status_code == 401  # the engine itself still wants its key
