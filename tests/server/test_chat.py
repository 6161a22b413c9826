"""POST /v1/chat/completions against a real server, with the official openai client."""
from __future__ import annotations

import pytest

from pagedkube.engine import SamplingParams

from .conftest import MODEL_NAME

MESSAGES = [{"role": "system", "content": "You are a helpful vet."},
            {"role": "user", "content": "How often should I feed my cat?"}]


def chat_ids(http, messages=MESSAGES) -> list[int]:
    r = http.post("/tokenize", json={"messages": messages})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def test_greedy_matches_offline_engine(client, http, offline):
    ids = chat_ids(http)
    ref = offline.generate([ids], SamplingParams(temperature=0.0, max_tokens=30))[0].outputs[0]
    r = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=30, temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == ref.text
    assert choice.finish_reason == ref.finish_reason
    assert r.usage.prompt_tokens == len(ids)
    assert r.usage.completion_tokens == len(ref.token_ids)


def test_max_tokens_omitted_fills_the_context(client, http):
    ids = chat_ids(http)
    r = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens + r.usage.completion_tokens == 512 == len(ids) + r.usage.completion_tokens


def test_max_completion_tokens(client):
    r = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_completion_tokens=7,
                                       temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 7 and r.choices[0].finish_reason == "length"


def test_stream_chunk_shapes(client):
    kw = dict(model=MODEL_NAME, messages=MESSAGES, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    full = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    first = chunks[0].choices[0]
    assert first.delta.role == "assistant" and first.finish_reason is None
    content = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in content) == full.choices[0].message.content
    assert content[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in content[:-1])
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage.completion_tokens == 12
    assert usage.usage.prompt_tokens == full.usage.prompt_tokens
    assert usage.usage.prompt_tokens_details.cached_tokens >= 0


def test_n2_stream_two_choices(client):
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=6, n=2,
                                                 seed=5, temperature=1.0, stream=True,
                                                 extra_body={"ignore_eos": True}))
    by_index: dict[int, list] = {0: [], 1: []}
    for c in chunks:
        for choice in c.choices:
            by_index[choice.index].append(choice)
    for index in (0, 1):
        assert by_index[index][0].delta.role == "assistant"
        assert by_index[index][-1].finish_reason == "length"
    again = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=6, n=2, seed=5,
                                           temperature=1.0, extra_body={"ignore_eos": True})
    streamed = ["".join(ch.delta.content or "" for ch in by_index[i]) for i in (0, 1)]
    assert streamed == [c.message.content for c in again.choices]


def test_logprobs(client):
    r = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=5, temperature=0,
                                       logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 5
    for item in content:
        assert len(item.top_logprobs) == 2
        assert item.top_logprobs[0].logprob >= item.top_logprobs[1].logprob
        assert item.top_logprobs[0].token == item.token          # greedy
        assert item.logprob == pytest.approx(item.top_logprobs[0].logprob)
        assert item.bytes == list(item.token.encode())


def test_content_parts_and_developer_role(client, http):
    parts = [{"role": "developer", "content": "You are a helpful vet."},
             {"role": "user", "content": [{"type": "text", "text": "How often should I feed my cat?"}]}]
    a = client.chat.completions.create(model=MODEL_NAME, messages=parts, max_tokens=5, temperature=0)
    b = client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=5, temperature=0)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage.prompt_tokens == b.usage.prompt_tokens
