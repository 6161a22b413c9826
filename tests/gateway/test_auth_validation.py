"""API keys, rate limits, body checks: everything the gateway answers alone."""
import json

import pytest

from pagedkube.gateway.auth import ApiKeys, RateLimiter, retry_after_header
from pagedkube.gateway.errors import GatewayError
from pagedkube.gateway.validation import parse_request

KEYS_YAML = """
keys:
  - key: sk-a
    name: tenant-a
    requests_per_minute: 2
  - key: sk-b
    name: tenant-b
    cache_salt: salt-b
"""


def test_api_keys_file_lookup_and_salts(tmp_path):
    path = tmp_path / "keys.yaml"
    path.write_text(KEYS_YAML)
    keys = ApiKeys.from_file(path)
    a, b = keys.lookup("Bearer sk-a"), keys.lookup("bearer  sk-b ")
    assert (a.name, a.cache_salt, a.requests_per_minute) == ("tenant-a", "tenant-a", 2)
    assert (b.name, b.cache_salt, b.requests_per_minute) == ("tenant-b", "salt-b", None)
    for header in (None, "", "Bearer", "Bearer sk-c", "Basic sk-a", "sk-a"):
        assert keys.lookup(header) is None


@pytest.mark.parametrize("entries, message", [
    ([{"key": "k", "name": "n", "requests_per_minute": 0}], "positive integer"),
    ([{"key": "", "name": "n"}], "'key'"),
    ([{"key": "k"}], "'name'"),
    ([{"key": "k", "name": "n", "oops": 1}], "unknown fields"),
    ([{"key": "k", "name": "n"}, {"key": "k", "name": "m"}], "duplicate key"),
    ([{"key": "k", "name": "n"}, {"key": "j", "name": "n"}], "duplicate name"),
])
def test_bad_api_keys_are_rejected_with_a_clear_message(entries, message):
    with pytest.raises(ValueError, match=message):
        ApiKeys(entries)


def test_api_keys_file_errors(tmp_path):
    with pytest.raises(ValueError, match="cannot read"):
        ApiKeys.from_file(tmp_path / "missing.yaml")
    (tmp_path / "k.yaml").write_text("keys: 3\n")
    with pytest.raises(ValueError, match="'keys' list"):
        ApiKeys.from_file(tmp_path / "k.yaml")


def test_token_bucket_allows_the_rate_and_says_when_to_retry():
    now = [100.0]
    limiter = RateLimiter(clock=lambda: now[0])
    assert limiter.acquire("a", 2) is None and limiter.acquire("a", 2) is None
    wait = limiter.acquire("a", 2)
    assert wait == pytest.approx(30.0) and retry_after_header(wait) == "30"
    assert limiter.acquire("b", 2) is None          # keys have separate buckets
    assert limiter.acquire("a", None) is None       # no limit
    now[0] += 30.0
    assert limiter.acquire("a", 2) is None
    assert limiter.acquire("a", 2) == pytest.approx(30.0)
    assert retry_after_header(0.01) == "1"


def _status(fn, *args):
    try:
        fn(*args)
    except GatewayError as e:
        return e.status, e.body()["error"]
    return None


def test_parse_request_checks_what_the_gateway_needs():
    ok = parse_request("/v1/chat/completions", b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}', {"m"})
    assert (ok.kind, ok.model, ok.stream) == ("chat", "m", False)
    chat = "/v1/chat/completions"
    status, error = _status(parse_request, chat, b'{"model": "m", "messages": [', {"m"})
    assert status == 400 and "not valid JSON" in error["message"] and error["type"] == "invalid_request_error"
    assert _status(parse_request, chat, b'[1, 2]', None)[0] == 400
    status, error = _status(parse_request, chat, b'{"model": "nope", "messages": [{}]}', {"m"})
    assert (status, error["param"], error["message"], error["code"]) == (
        404, "model", "The model `nope` does not exist.", "model_not_found")
    assert parse_request(chat, b'{"model": "nope", "messages": [{}]}', None).model == "nope"  # models unknown yet
    huge = json.dumps({"model": "m" * (1 << 20), "messages": [{}]}).encode()
    assert _status(parse_request, chat, huge, {"m"})[1]["message"] == (
        f"The model `{'m' * 256}... ({(1 << 20) - 256} more characters)` does not exist.")   # not echoed whole
    assert _status(parse_request, chat, b'{"messages": []}', None)[0] == 400
    assert _status(parse_request, chat, b'{"messages": [{}], "stream": "yes"}', None)[0] == 400
    assert _status(parse_request, "/v1/completions", b'{"model": "m"}', {"m"})[1]["param"] == "prompt"
    assert _status(parse_request, "/v1/completions", b'{"prompt": "x", "cache_salt": 5}', None)[0] == 400
    # Nested past the JSON parser's depth guard: a 400, not the RecursionError's 500.
    deep = b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    status, error = _status(parse_request, "/v1/completions", deep, None)
    assert (status, error["code"]) == (400, None) and "nested too deeply" in error["message"]


def test_forward_body_puts_the_tenant_salt_over_the_clients():
    parsed = parse_request("/v1/completions", b'{"prompt": "x", "cache_salt": "evil"}', None)
    assert parsed.forward_body(None) == b'{"prompt": "x", "cache_salt": "evil"}'
    assert json.loads(parsed.forward_body("tenant-a")) == {"prompt": "x", "cache_salt": "tenant-a"}
