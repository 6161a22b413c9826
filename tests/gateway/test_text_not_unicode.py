"""Text that is not Unicode (a lone UTF-16 surrogate, valid JSON) on every text field of
both servers: a 400 naming the field, never a 500 (pagedkube/unicode_text.py); and a
hypothesis property over JSON bodies for both servers: no 5xx, no traceback."""
from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedkube.unicode_text import field_path

COMPLETION = {"model": "tiny", "prompt": "Hello", "max_tokens": 2, "stop": ["x", "y"], "cache_salt": "s",
              "user": "u", "logit_bias": {"5": 1}, "my_router_field": "v"}
COMPLETION_BATCH = {"model": "tiny", "prompt": ["a", "b"], "max_tokens": 2, "stop": "z"}
CHAT = {"model": "tiny", "max_tokens": 2, "stop": "q", "cache_salt": "c", "user": "u",
        "messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": [{"type": "text", "text": "hi"}], "name": "bob"}]}
TOKENIZE = {"model": "tiny", "prompt": "hi"}
TOKENIZE_CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
GATEWAY_CASES = [("/v1/completions", COMPLETION), ("/v1/completions", COMPLETION_BATCH),
                 ("/v1/chat/completions", CHAT)]
ENGINE_CASES = GATEWAY_CASES + [("/tokenize", TOKENIZE), ("/tokenize", TOKENIZE_CHAT)]


@pytest.fixture(scope="module")
def servers(module_processes, engine_model_args):
    # A short context keeps every generated request cheap on a CPU; no queue limit, so no 503s.
    engine = module_processes.engine(*engine_model_args, "--max-model-len", "32", "--max-waiting", "-1")
    module_processes.wait_ready(engine)
    gateway = module_processes.gateway([engine.url], route_headers=False)
    module_processes.wait_ready(gateway)
    return {"engine": engine, "gateway": gateway}


def text_fields(value, loc=()):
    """The location of every string in a JSON value."""
    if isinstance(value, str):
        yield loc
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from text_fields(item, (*loc, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from text_fields(item, (*loc, i))


def replaced(value, loc, new):
    if not loc:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[loc[0]] = replaced(value[loc[0]], loc[1:], new)
    return copy


def post(url: str, path: str, body) -> httpx.Response:
    # json.dumps writes the surrogate as the escape "\ud800", as any client's encoder would.
    return httpx.post(url + path, content=json.dumps(body).encode(), timeout=120,
                      headers={"content-type": "application/json"})


@pytest.mark.parametrize("name", ["engine", "gateway"])
def test_a_lone_surrogate_in_any_text_field_is_400_naming_it(servers, name):
    url = servers[name].url
    cases = ENGINE_CASES if name == "engine" else GATEWAY_CASES
    checked = 0
    for path, body in cases:
        assert post(url, path, body).status_code == 200, (path, body)   # the body is fine as it is
        for loc in text_fields(body):
            for bad in ("\ud800", "ok \udfff", "\udc00\ud800"):   # lone, trailing, a pair the wrong way round
                r = post(url, path, replaced(body, loc, bad))
                assert r.status_code == 400, (path, loc, r.text)
                error = r.json()["error"]
                assert error["param"] == field_path(loc), (path, loc, error)
                assert error["message"].startswith(f"{field_path(loc)}: the text is not valid Unicode")
                checked += 1
    assert checked >= 3 * (16 if name == "engine" else 13)   # every string of every body above
    r = post(url, "/v1/completions", {**COMPLETION, "prompt": "\ud83d\udc36 and a real pair"})
    assert r.status_code == 200, r.text


# -- the property: no JSON body gets a 5xx ---------------------------------------------

# Any text, and often text with a lone surrogate in it (plain st.text() leaves them out).
SURROGATE = st.characters(categories=["Cs"])
TEXT = (st.text(st.characters(codec=None, exclude_categories=()), max_size=8)
        | st.builds(lambda a, s, b: a + s + b, st.text(max_size=4), SURROGATE, st.text(max_size=4)))
SCALARS = st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats(allow_nan=False) | TEXT
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
                    max_leaves=8)
FIELDS = ["model", "prompt", "messages", "max_tokens", "n", "stream", "stream_options", "stop", "temperature",
          "top_p", "top_k", "seed", "logprobs", "top_logprobs", "logit_bias", "cache_salt", "user", "echo",
          "stop_token_ids", "add_special_tokens", "tokens", "response_format", "tools"]
MESSAGES = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]),
                                           "content": TEXT}), min_size=1, max_size=3)


def bodies(base: dict):
    """A valid body with a field or two replaced by text, a list of text or arbitrary JSON
    (messages often kept message-shaped), or arbitrary JSON altogether."""
    value = TEXT | st.lists(TEXT, min_size=1, max_size=3) | JSON
    overrides = st.dictionaries(st.sampled_from(sorted(base)) | st.sampled_from(FIELDS) | TEXT, value, max_size=2)
    shaped = st.builds(lambda o, m: {**base, **o, "messages": m}, st.dictionaries(TEXT, value, max_size=1), MESSAGES)
    return st.builds(lambda o: {**base, **o}, overrides) | (shaped if "messages" in base else overrides) | JSON


REQUESTS = {"engine": st.sampled_from(ENGINE_CASES), "gateway": st.sampled_from(GATEWAY_CASES)}


@pytest.mark.parametrize("name", ["engine", "gateway"])
def test_no_json_body_gets_a_5xx(servers, name):
    url = servers[name].url

    @settings(max_examples=150, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(data=st.data())
    def check(data):
        path, base = data.draw(REQUESTS[name])
        body = data.draw(bodies({**base, "max_tokens": 2}))
        r = post(url, path, body)
        assert r.status_code < 500, (path, body, r.status_code, r.text[:500])
        if r.status_code != 200:
            assert r.json()["error"]["type"] != "server_error", (path, body, r.text[:500])

    check()
    log = servers[name].log.read_text(errors="replace")
    assert "Traceback" not in log, log[-4000:]
