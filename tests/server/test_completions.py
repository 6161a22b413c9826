"""POST /v1/completions against a real server, with the official openai client."""
from __future__ import annotations

import pytest

from pagedkube.engine import SamplingParams

from .conftest import MODEL_NAME

PROMPT = "How often should I feed my cat?"


def tokenize(http, text: str) -> list[int]:
    r = http.post("/tokenize", json={"prompt": text})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def greedy_offline(offline, prompt_ids: list[int], **kw) -> object:
    return offline.generate([prompt_ids], SamplingParams(temperature=0.0, **kw))[0].outputs[0]


def test_greedy_matches_offline_engine(client, http, offline):
    ids = tokenize(http, PROMPT)
    ref = greedy_offline(offline, ids, max_tokens=24, ignore_eos=True)
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=24, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.object == "text_completion" and r.model == MODEL_NAME and r.id.startswith("cmpl-")
    assert r.choices[0].text == ref.text
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == len(ids)
    assert r.usage.completion_tokens == 24
    assert r.usage.total_tokens == len(ids) + 24


def test_token_id_prompt_and_batch(client, http, offline):
    ids = tokenize(http, PROMPT)
    other = tokenize(http, "Can dogs eat grapes?")
    r = client.completions.create(model=MODEL_NAME, prompt=[ids, other], max_tokens=8, temperature=0)
    assert [c.index for c in r.choices] == [0, 1]
    assert r.choices[0].text == greedy_offline(offline, ids, max_tokens=8).text
    assert r.choices[1].text == greedy_offline(offline, other, max_tokens=8).text
    assert r.usage.prompt_tokens == len(ids) + len(other)


def test_stream_equals_non_stream(client):
    kw = dict(model=MODEL_NAME, prompt=PROMPT, max_tokens=20, temperature=0, extra_body={"ignore_eos": True})
    full = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_without_usage_has_no_usage_chunk(client):
    chunks = list(client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=5, stream=True))
    assert all(c.choices for c in chunks)
    assert all(getattr(c, "usage", None) is None for c in chunks)


def test_echo(client):
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=4, temperature=0, echo=True)
    plain = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=4, temperature=0)
    assert r.choices[0].text == PROMPT + plain.choices[0].text


def test_seed_reproduces_and_n_returns_two_choices(client):
    kw = dict(model=MODEL_NAME, prompt=PROMPT, max_tokens=16, temperature=1.0, seed=1234, n=2,
              extra_body={"ignore_eos": True})
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert a.usage.completion_tokens == 32


def test_stop_string_truncates(client):
    base = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=24, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = base[len(base) // 2:len(base) // 2 + 3]
    assert stop.strip(), "pick a visible stop string"
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop],
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == base[:base.index(stop)]


def test_stop_token_ids(client, http, offline):
    ids = tokenize(http, PROMPT)
    ref = greedy_offline(offline, ids, max_tokens=12, ignore_eos=True)
    stop_id = ref.token_ids[5]
    first = ref.token_ids.index(stop_id)
    r = client.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=12, temperature=0,
                                  extra_body={"ignore_eos": True, "stop_token_ids": [stop_id]})
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == first + 1


def test_ignore_eos_and_max_tokens(client):
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=40, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 40 and r.choices[0].finish_reason == "length"


@pytest.mark.parametrize("extra", [{"top_k": 1}, {"min_p": 1.0}, {"top_p": 1e-9}])
def test_filters_that_keep_one_token_are_greedy(client, extra):
    greedy = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=12, temperature=0,
                                       extra_body={"ignore_eos": True})
    kw = {k: v for k, v in extra.items() if k == "top_p"}
    body = {k: v for k, v in extra.items() if k != "top_p"}
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=12, temperature=1.0, seed=7,
                                  extra_body={"ignore_eos": True, **body}, **kw)
    assert r.choices[0].text == greedy.choices[0].text


def test_logprobs(client):
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) >= 3 and logprob <= 0
        assert logprob == pytest.approx(max(top.values()))   # greedy picks the most likely token
        assert top[token] == logprob
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(6)]
