"""Prefix-cache accounting over HTTP (cached_tokens, cache_salt) and the cache feed."""
from __future__ import annotations

import threading
import time
import uuid

import httpx

from pagedkube import hashing
from pagedkube.tokenizer import Tokenizer

from .conftest import API_KEY, MODEL_NAME

LONG_PROMPT = ("My dog is a seven year old beagle who loves long walks in the park, chasing squirrels and "
               "eating everything he finds on the ground. Lately he seems tired after short walks and drinks "
               "a lot more water than before. What should I ask the vet about his health?")


def tokens(http, text: str) -> list[int]:
    return http.post("/tokenize", json={"prompt": text}).json()["tokens"]


def feed_seq(http) -> int:
    return http.get("/v1/cache/events", params={"after": 2 ** 62}).json()["latest_seq"]


def events_since(http, seq: int) -> dict[str, set[str]]:
    body = http.get("/v1/cache/events", params={"after": seq}).json()
    assert body["reset"] is False
    seen: dict[str, set[str]] = {"stored": set(), "removed": set()}
    for event in body["events"]:
        assert event["seq"] > seq
        seen[event["type"]].update(event["block_hashes"])
    return seen


def test_repeated_long_prompt_reports_cached_tokens(client, http):
    salt = uuid.uuid4().hex  # a fresh chain: nothing of it is cached yet
    num_prompt = len(tokens(http, LONG_PROMPT))
    assert num_prompt > 48
    kw = dict(model=MODEL_NAME, prompt=LONG_PROMPT, max_tokens=2, extra_body={"cache_salt": salt})
    cold = client.completions.create(**kw)
    assert cold.usage.prompt_tokens_details.cached_tokens == 0
    warm = client.completions.create(**kw)
    cached = warm.usage.prompt_tokens_details.cached_tokens
    # Whole blocks only, and never the last prompt token (its logits are needed).
    assert cached == (num_prompt - 1) // 16 * 16 > 0
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == cached


def test_cache_salt_isolates(client):
    a = uuid.uuid4().hex
    kw = dict(model=MODEL_NAME, prompt=LONG_PROMPT, max_tokens=2)
    client.completions.create(**kw, extra_body={"cache_salt": a})
    other = client.completions.create(**kw, extra_body={"cache_salt": a + "-other"})
    assert other.usage.prompt_tokens_details.cached_tokens == 0
    same = client.chat.completions.create(model=MODEL_NAME, max_tokens=2, extra_body={"cache_salt": a},
                                          messages=[{"role": "user", "content": LONG_PROMPT}])
    assert same.usage.prompt_tokens_details.cached_tokens == 0   # a chat prompt renders differently


def test_cache_config(http):
    body = http.get("/v1/cache/config").json()
    assert body["block_size"] == 16
    assert body["hash_algorithm"] == hashing.HASH_ALGORITHM == "sha256-chain-u32le-v1"
    assert body["hash_seed"] == ""
    assert body["engine_id"] == http.get("/v1/cache/events").json()["engine_id"]


def test_cache_tokenizer_rebuilds_the_same_tokenizer(http):
    files = http.get("/v1/cache/tokenizer").json()["files"]
    assert "tokenizer.json" in files and "tokenizer_config.json" in files
    assert Tokenizer(files).encode(LONG_PROMPT) == tokens(http, LONG_PROMPT)
    messages = [{"role": "user", "content": "Is chocolate bad for dogs?"}]
    assert Tokenizer(files).encode_chat(messages) == http.post("/tokenize", json={"messages": messages}).json()["tokens"]


def test_feed_reports_stored_blocks(client, http):
    salt = uuid.uuid4().hex
    ids = tokens(http, LONG_PROMPT)
    seq = feed_seq(http)
    client.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=2, extra_body={"cache_salt": salt})
    expected = set(hashing.to_hex(hashing.block_hashes(ids, 16, cache_salt=salt)))
    assert len(expected) == len(ids) // 16
    assert expected <= events_since(http, seq)["stored"]
    snapshot = http.get("/v1/cache/events", params={"after": 2 ** 62}).json()
    assert snapshot["reset"] is True and snapshot["events"] == []
    assert expected <= set(snapshot["block_hashes"])


def test_feed_reports_removals_after_eviction(small_server):
    """12 blocks in the pool: a 150-token prompt must evict an earlier prompt's cached blocks."""
    with httpx.Client(base_url=small_server.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120) as c:
        first = (tokens(c, LONG_PROMPT) * 2)[:64]
        seq = feed_seq(c)
        r = c.post("/v1/completions", json={"prompt": first, "max_tokens": 1, "cache_salt": "first"})
        assert r.status_code == 200, r.text
        first_hashes = set(hashing.to_hex(hashing.block_hashes(first, 16, cache_salt="first")))
        assert first_hashes <= events_since(c, seq)["stored"]
        big = (tokens(c, LONG_PROMPT) * 3)[:150]
        r = c.post("/v1/completions", json={"prompt": big, "max_tokens": 2, "cache_salt": "big"})
        assert r.status_code == 200, r.text
        seen = events_since(c, seq)
        removed = seen["removed"] & first_hashes
        assert removed, "the first prompt's blocks were evicted"
        snapshot = set(c.get("/v1/cache/events", params={"after": -1}).json()["block_hashes"])
        assert not removed & snapshot
        assert set(hashing.to_hex(hashing.block_hashes(big, 16, cache_salt="big"))) <= snapshot


def test_feed_long_poll_answers_with_the_first_new_event(client, http):
    """`wait`: an up-to-date reader is held until the engine stores blocks, then
    gets them; without news it gets an empty answer when the wait ends."""
    seq = feed_seq(http)
    idle = http.get("/v1/cache/events", params={"after": seq, "wait": 0.3}).json()
    assert (idle["reset"], idle["events"], idle["latest_seq"]) == (False, [], seq)

    salt = uuid.uuid4().hex
    ids = tokens(http, LONG_PROMPT)
    answers: list[dict] = []
    poll = threading.Thread(target=lambda: answers.append(
        http.get("/v1/cache/events", params={"after": seq, "wait": 30}, timeout=60).json()))
    poll.start()
    time.sleep(0.5)
    assert poll.is_alive() and not answers, "the long-poll answered before there was anything new"
    client.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=2, extra_body={"cache_salt": salt})
    poll.join(timeout=30)
    assert not poll.is_alive(), "the long-poll was not woken by the engine's new blocks"
    body = answers[0]
    assert body["reset"] is False and body["events"] and body["latest_seq"] > seq
    stored = {h for e in body["events"] if e["type"] == "stored" for h in e["block_hashes"]}
    first = hashing.to_hex(hashing.block_hashes(ids, 16, cache_salt=salt))[0]
    assert first in stored   # the prompt's blocks are stored at prefill, before the answer ends


def test_feed_long_poll_bounds(client, http):
    client.completions.create(model=MODEL_NAME, prompt=LONG_PROMPT, max_tokens=1,
                              extra_body={"cache_salt": uuid.uuid4().hex})   # at least one event
    seq = feed_seq(http)
    for wait in (-1, 31, "soon"):
        r = http.get("/v1/cache/events", params={"after": seq, "wait": wait})
        assert r.status_code == 400 and r.json()["error"]["param"] == "wait", r.text
    # A reader that is behind, or ahead of the log, gets its answer at once: no wait.
    behind = http.get("/v1/cache/events", params={"after": seq - 1, "wait": 30}, timeout=5).json()
    assert behind["reset"] is False and behind["events"][-1]["seq"] == seq
    ahead = http.get("/v1/cache/events", params={"after": 2 ** 62, "wait": 30}, timeout=5).json()
    assert ahead["reset"] is True
