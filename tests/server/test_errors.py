"""Every error is OpenAI-shaped JSON with the right status, and the server keeps answering."""
from __future__ import annotations

import httpx
import openai
import pytest

from .conftest import API_KEY, MODEL_NAME, metric_value, wait_until

CHAT = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMPLETION = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2}

BAD_REQUESTS = [
    # (path, body, field the message must name)
    ("/v1/completions", {**COMPLETION, "max_tokens": 600}, "max_tokens"),
    ("/v1/completions", {**COMPLETION, "prompt": "cat " * 600}, "prompt"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 100000}, "max_completion_tokens"),
    ("/v1/completions", {**COMPLETION, "max_tokens": "ten"}, "max_tokens"),
    ("/v1/completions", {**COMPLETION, "prompt": 12.5}, "prompt"),
    ("/v1/chat/completions", {**CHAT, "messages": "hi"}, "messages"),
    ("/v1/chat/completions", {**CHAT, "messages": []}, "messages"),
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    # Unknown fields (`frobnicate`, the deprecated `functions`) are ignored with a warning now, as
    # vLLM does: tests/server/test_vllm_fields.py.
    ("/v1/chat/completions", {**CHAT, "use_beam_search": True}, "use_beam_search"),
    ("/v1/completions", {**COMPLETION, "temperature": -0.5}, "temperature"),
    ("/v1/completions", {**COMPLETION, "top_p": 1.5}, "top_p"),
    ("/v1/completions", {**COMPLETION, "top_k": -2}, "top_k"),
    ("/v1/completions", {**COMPLETION, "min_p": 2}, "min_p"),
    ("/v1/completions", {**COMPLETION, "n": 0}, "n"),
    ("/v1/completions", {**COMPLETION, "logprobs": 100}, "logprobs"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 3}, "top_logprobs"),
    ("/v1/completions", {**COMPLETION, "seed": 2 ** 70}, "seed"),
    ("/v1/completions", {**COMPLETION, "prompt": [10 ** 6]}, "prompt"),
    ("/v1/completions", {**COMPLETION, "prompt": [True, False]}, "prompt"),   # not token ids 1 and 0
    ("/v1/completions", {**COMPLETION, "stop_token_ids": [True]}, "stop_token_ids"),
    ("/v1/completions", {**COMPLETION, "stream": "yes"}, "stream"),            # as the gateway refuses it
    ("/v1/chat/completions", {**CHAT, "stream": 1}, "stream"),
    ("/v1/completions", {**COMPLETION, "stop_token_ids": [-1]}, "stop_token_ids"),
    ("/v1/completions", {**COMPLETION, "min_tokens": 5}, "min_tokens"),
    ("/v1/completions", {**COMPLETION, "presence_penalty": 2.5}, "presence_penalty"),   # [-2, 2]; 0.5 is honoured
    # tools with tool_choice "auto" (the default) on a model whose template shows no tool-call format
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice"),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "f g"}}]}, "tools"),
    ("/v1/chat/completions", {**CHAT, "tools": [{"type": "function", "function": {"name": "f"}}],
                              "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
    ("/v1/chat/completions", {**CHAT, "tool_choice": "required"}, "tool_choice"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "xml"}}, "response_format"),
    ("/v1/completions", {**COMPLETION, "guided_regex": "(x"}, "guided_regex"),
    ("/v1/completions", {**COMPLETION, "guided_choice": []}, "guided_choice"),
    ("/v1/completions", {**COMPLETION, "guided_json": {"type": "strin"}}, "guided_json"),
    ("/v1/completions", {**COMPLETION, "guided_grammar": "root ::= "}, "guided_grammar"),
    ("/v1/completions", {**COMPLETION, "structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ("/v1/completions", {**COMPLETION, "guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
    ("/v1/completions", {**COMPLETION, "stream_options": {"include_usage": True}}, "stream_options"),
    ("/v1/completions", {**COMPLETION, "cache_salt": ""}, "cache_salt"),
    ("/tokenize", {"prompt": 5}, "prompt"),
    ("/detokenize", {"tokens": [10 ** 6]}, "tokens"),
]


@pytest.mark.parametrize("path,body,field", BAD_REQUESTS, ids=[f"{p}:{f}" for p, _, f in BAD_REQUESTS])
def test_bad_input_is_400_naming_the_field(http, path, body, field):
    r = http.post(path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert field in error["message"]
    assert error["param"].startswith(field)


@pytest.mark.parametrize("raw", [b"{not json", b"", b"[1, 2]", b"null", b'{"prompt": "hi", "max_tokens": NaN}'])
def test_malformed_body_is_400(http, raw):
    r = http.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"]


def test_openai_client_raises_bad_request(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=10_000)
    assert "max_tokens" in info.value.message and info.value.status_code == 400


def test_unknown_model_is_404(client, http):
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-17", messages=CHAT["messages"], max_tokens=2)
    assert "gpt-17" in info.value.message
    assert info.value.body["code"] == "model_not_found" and info.value.body["param"] == "model"
    assert http.get("/v1/models/gpt-17").status_code == 404
    assert http.post("/tokenize", json={"model": "gpt-17", "prompt": "hi"}).status_code == 404


def test_a_huge_model_name_is_not_echoed_whole(http):
    name = "m" * (1 << 20)
    r = http.post("/v1/completions", json={**COMPLETION, "model": name})
    assert r.status_code == 404
    assert r.json()["error"]["message"] == f"The model `{'m' * 256}... ({(1 << 20) - 256} more characters)` does not exist."


def test_stream_null_is_false(http):
    r = http.post("/v1/completions", json={**COMPLETION, "stream": None})
    assert r.status_code == 200 and r.json()["object"] == "text_completion"


def test_unknown_route_is_openai_shaped_404(http):
    r = http.get("/v1/nothing-here")
    assert r.status_code == 404 and "error" in r.json()


def test_still_answering_after_errors(client, http):
    for path, body, _ in BAD_REQUESTS:
        http.post(path, json=body)
    http.post("/v1/completions", content=b"{", headers={"content-type": "application/json"})
    r = client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=3)
    assert r.usage.completion_tokens >= 1
    assert http.get("/health").status_code == 200 and http.get("/ready").status_code == 200


def test_api_key(small_server):
    url = small_server.url
    bad = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        bad.models.list()
    assert info.value.status_code == 401 and info.value.body["code"] == "invalid_api_key"
    assert httpx.post(f"{url}/v1/completions", json=COMPLETION).status_code == 401          # no key
    assert httpx.post(f"{url}/tokenize", json={"prompt": "hi"}).status_code == 401
    assert httpx.get(f"{url}/health").status_code == 200                                   # liveness is open
    assert httpx.get(f"{url}/ready").status_code == 200
    for scheme in ("bearer", "BEARER", "Bearer  "):   # RFC 9110: the scheme is case-insensitive
        r = httpx.post(f"{url}/tokenize", json={"prompt": "hi"}, headers={"Authorization": f"{scheme} {API_KEY}"})
        assert r.status_code == 200, (scheme, r.text)
    assert httpx.post(f"{url}/tokenize", json={"prompt": "hi"},
                      headers={"Authorization": f"Basic {API_KEY}"}).status_code == 401
    good = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0)
    assert [m.id for m in good.models.list().data] == [MODEL_NAME]
    assert good.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2).usage.completion_tokens >= 1


def test_queue_full_is_503_with_retry_after(small_server):
    """--max-num-seqs 1 --max-waiting 1: one running + one waiting, the third is refused."""
    headers = {"Authorization": f"Bearer {API_KEY}"}
    long = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 150, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=small_server.url, headers=headers, timeout=120) as c:
        with c.stream("POST", "/v1/completions", json=long) as running:
            assert running.status_code == 200
            lines = running.iter_lines()
            assert next(lines).startswith("data: ")          # it runs: the only running slot is taken
            with c.stream("POST", "/v1/completions", json=long) as waiting:
                assert waiting.status_code == 200            # queued: the one waiting slot
                refused = c.post("/v1/completions", json={**long, "stream": False})
                assert refused.status_code == 503, refused.text
                assert refused.headers["retry-after"] == "1"
                assert refused.json()["error"]["code"] == "queue_full"
        # Both streams were closed early: their requests are aborted and the queue empties.
        wait_until(lambda: metric_value(c.get("/metrics").text, "vllm:num_requests_running") == 0
                   and metric_value(c.get("/metrics").text, "vllm:num_requests_waiting") == 0)
        ok = c.post("/v1/completions", json={**long, "stream": False, "max_tokens": 3})
        assert ok.status_code == 200, ok.text
