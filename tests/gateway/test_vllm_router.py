"""vLLM's own router (`vllm-router` from PyPI, a Rust binary) in front of two of our
engines: a vLLM user changes nothing but the base URL. The router adds vLLM and
SGLang extension fields to each request (`skip_special_tokens`, `no_stop_trim`,
...); the engine must accept them (docs/design.md "Engine server")."""
from __future__ import annotations

import httpx
import openai
import pytest

pytestmark = pytest.mark.slow  # real processes

MODEL_NAME = "tiny"  # conftest.MODEL_NAME
START_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def engines(module_processes, engine_model_args):
    pair = [module_processes.engine(*engine_model_args) for _ in range(2)]
    module_processes.wait_ready(*pair)
    return pair


@pytest.fixture(params=["cache_aware", "round_robin"])
def router(request, engines, module_processes, wait_until):
    proc = module_processes.vllm_router([e.url for e in engines], "--policy", request.param)

    def up() -> bool:
        assert proc.popen.poll() is None, f"vllm-router exited {proc.popen.returncode}:\n{proc.log_tail()}"
        try:
            return httpx.get(proc.url + "/v1/models", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, timeout=START_TIMEOUT_S, interval=0.2)
        yield proc, request.param
    finally:
        proc.stop()


def _served(engines, metric) -> list[float]:
    return [metric(e.url, "vllm:request_success_total") for e in engines]


def test_chat_and_completions_through_vllm_router(router, engines, metric):
    proc, policy = router
    client = openai.OpenAI(base_url=proc.url + "/v1", api_key="none", max_retries=0, timeout=120)
    before = _served(engines, metric)
    messages = [{"role": "user", "content": "How often should I feed my puppy?"}]
    for i in range(2):   # round_robin: one of each kind on each engine
        chat = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=6, temperature=0)
        assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content
        assert chat.usage.completion_tokens > 0
        chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=6,
                                                     temperature=0, stream=True))
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == chat.choices[0].message.content   # greedy: the same answer, streamed or not
        text = client.completions.create(model=MODEL_NAME, prompt="My dog Rex", max_tokens=6, temperature=0)
        assert text.choices[0].text and text.choices[0].finish_reason in ("length", "stop")
        pieces = list(client.completions.create(model=MODEL_NAME, prompt="My dog Rex", max_tokens=6,
                                                temperature=0, stream=True))
        assert "".join(p.choices[0].text for p in pieces if p.choices) == text.choices[0].text
    after = _served(engines, metric)
    served = [a - b for a, b in zip(after, before)]
    assert sum(served) == 8, served
    if policy == "round_robin":
        assert served == [4, 4], served
