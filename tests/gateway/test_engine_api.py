"""What the engines offer besides generation, through the gateway (real processes): the openai
client's models.retrieve, vLLM's /tokenize and /detokenize, /version; answers equal the
engine's own, a model no engine serves is 404, and with API keys each needs one."""
from __future__ import annotations

import httpx
import openai
import pytest

MODEL = "tiny"


@pytest.fixture(scope="module")
def stack(module_processes, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "api-keys.yaml"
    keys.write_text("keys:\n  - name: vet-clinic\n    key: sk-clinic-1\n")
    engine = module_processes.engine("--served-model-name", MODEL, "--max-model-len", "512")
    module_processes.wait_ready(engine)
    gateway = module_processes.gateway([engine.url], "--api-keys", str(keys))
    module_processes.wait_ready(gateway)
    return engine, gateway


AUTH = {"Authorization": "Bearer sk-clinic-1"}


def test_models_retrieve_through_the_gateway(stack):
    engine, gateway = stack
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="sk-clinic-1", max_retries=0)
    card = client.models.retrieve(MODEL)
    assert card.id == MODEL and card.model_dump()["max_model_len"] == 512
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_tokenize_and_detokenize_are_the_engines_answers(stack):
    engine, gateway = stack
    for body in ({"model": MODEL, "prompt": "My dog limps."},
                 {"messages": [{"role": "user", "content": "My dog limps."}], "add_generation_prompt": True}):
        ours = httpx.post(f"{gateway.url}/tokenize", json=body, headers=AUTH)
        theirs = httpx.post(f"{engine.url}/tokenize", json=body)
        assert ours.status_code == theirs.status_code == 200 and ours.json() == theirs.json()
        tokens = ours.json()["tokens"]
        back = httpx.post(f"{gateway.url}/detokenize", json={"model": MODEL, "tokens": tokens}, headers=AUTH)
        assert back.json() == httpx.post(f"{engine.url}/detokenize", json={"tokens": tokens}).json()
    bad = httpx.post(f"{gateway.url}/tokenize", json={"model": MODEL, "prompt": 5}, headers=AUTH)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"    # the engine's 400, passed on
    other = httpx.post(f"{gateway.url}/tokenize", json={"model": "gpt-9", "prompt": "hi"}, headers=AUTH)
    assert other.status_code == 404 and other.json()["error"]["code"] == "model_not_found"


def test_version_and_keys(stack):
    _, gateway = stack
    from pagedkube import __version__

    assert httpx.get(f"{gateway.url}/version", headers=AUTH).json() == {"version": __version__}
    for method, path in (("GET", "/version"), ("POST", "/tokenize"), ("GET", f"/v1/models/{MODEL}")):
        r = httpx.request(method, f"{gateway.url}{path}", json={"prompt": "x"} if method == "POST" else None)
        assert r.status_code == 401, (path, r.text)
