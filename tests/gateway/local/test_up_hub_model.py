"""`pagedkube up --model ORG/NAME` with two engines, against the local Hub mirror
(tests/helpers/hfhub.py): `up` fetches the model once, before the engines start, and both
engines then find it in the cache; the gateway answers a chat for the repo's name."""
from __future__ import annotations

import re

import httpx
import pytest
from hfhub import HubRepo, HubServer
from model_factory import BUILTIN_TINY
from up_process import START_TIMEOUT_S, Up, assert_stopped_cleanly

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = "pagedkube-test/tiny-chat"


def test_up_fetches_a_hub_model_once_for_both_engines(tmp_path) -> None:
    hub = HubServer([HubRepo.of(REPO, BUILTIN_TINY)]).start()
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": hub.url, "HF_HUB_DISABLE_TELEMETRY": "1",
           "HF_HUB_OFFLINE": "0", "PAGEDKUBE_CACHE_DIR": str(tmp_path / "pagedkube")}
    up = Up(tmp_path, "--replicas", "2", "--num-kv-blocks", "64", "--max-model-len", "256", model=REPO, env=env)
    try:
        for name in ("engine-0", "engine-1"):
            up.wait_for(lambda: up.engine_url(name), START_TIMEOUT_S, f"{name} ready")
        up.wait_for(lambda: httpx.get(f"{up.url}/ready", timeout=5).status_code == 200, 60, "the gateway ready")
        r = httpx.post(f"{up.url}/v1/chat/completions", timeout=120,
                       json={"model": REPO, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
        assert r.status_code == 200, r.text
        assert r.json()["model"] == REPO
        assert_stopped_cleanly(up, 2)
    finally:
        up.stop()
        hub.close()
    text = up.text()
    got = sorted(p.rsplit("/", 1)[1] for m, p in hub.seen() if m == "GET" and "/resolve/" in p)
    assert got == ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                   "tokenizer_config.json"]                       # each file once, for both engines
    assert len(re.findall(rf"^{re.escape(REPO)}: downloaded \d+ bytes in ", text, re.M)) == 1, text
    for name in ("engine-0", "engine-1"):
        assert re.search(rf"^{name} \|.*{re.escape(REPO)}: using the cached .* \(no Hub request\)", text, re.M), text
