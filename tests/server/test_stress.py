"""512 concurrent clients against one default `pagedkube serve`, on uvloop and on asyncio,
and on uvloop with whole decode-step capture: `--decode-capture on` (torch.compile'd decode
buckets 1 and 8 before serving, so the storm's decode steps run captured, padded and eager by
batch size) and the default `auto` (the same buckets compiling on a background thread while the
storm runs: its steps switch from eager to captured as each bucket becomes ready); and the
default model itself at its default, `auto` there being native decode (every decode-only step
one C++ call, engine/native_decode.py, at any batch size).

The load that wedged the engine (issue 14, docs/design.md, pitfall "A pipe under uvloop"): a
mix of completions and chats, n up to 8, logprobs up to 5, streamed and not,
with one client in ten leaving mid-stream, and 30% of the requests constrained
(JSON Schemas of their own, regexes, choices, forced tool calls), so grammars
compile while the engine steps and constrained rows share steps with free ones.
Every request that was not abandoned must get a 200 with exactly the choices it
asked for, each constrained one that stopped valid; afterwards the server is
healthy, serves a new request, and the KV pool is empty again.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import re

import jsonschema

import httpx
import pytest
from default_model import require_default_model
from toolchain import require_cxx

from pagedkube.model_source import DEFAULT_MODEL

from .conftest import ServerProcess, metric_value, wait_until

NUM_CLIENTS = 512
MAX_TOKENS = 8
CONSTRAINED_SHARE = 0.3
REGEX = r"[A-Z][a-z]{1,6} (sits|runs)"
CHOICES = ["sit", "stay", "come here"]
TOOL = {"type": "function", "function": {"name": "walk", "parameters": {
    "type": "object", "properties": {"minutes": {"type": "integer", "minimum": 5, "maximum": 60}},
    "required": ["minutes"]}}}


def _schema(k: int) -> dict:
    """One of eight small schemas (eight grammars compiling at once at the storm's start)."""
    return {"type": "object", "properties": {f"dog{k}": {"type": "integer", "minimum": 0, "maximum": 9},
                                             "ok": {"type": "boolean"}}, "required": [f"dog{k}", "ok"]}


def _constraint(i: int, rng: random.Random) -> tuple[dict, object]:
    """(the body's constraint fields, what a stopped output must satisfy)."""
    kind = rng.choice(["json", "regex", "choice", "tool"])
    if kind == "json":
        schema = _schema(i % 8)
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}, schema
    if kind == "regex":
        return {"structured_outputs": {"regex": REGEX}}, REGEX
    if kind == "choice":
        return {"guided_choice": CHOICES}, CHOICES
    return {"tools": [TOOL], "tool_choice": "required"}, TOOL


def _valid(expect: object, choice: dict) -> bool:
    if isinstance(expect, str):
        return re.fullmatch(expect, choice["message"]["content"] if "message" in choice else choice["text"]) is not None
    if isinstance(expect, list):
        return (choice["message"]["content"] if "message" in choice else choice["text"]) in expect
    if expect is TOOL:
        return all(json.loads(c["function"]["arguments"])["minutes"] >= 5 for c in choice["message"]["tool_calls"])
    text = choice["message"]["content"] if "message" in choice else choice["text"]
    jsonschema.validate(json.loads(text), expect)
    return True


def _request(i: int, rng: random.Random) -> tuple[str, dict, bool]:
    """(path, body, abandon) for client i."""
    n = rng.choice([1, 1, 1, 2, 4, 8])
    logprobs = rng.choice([None, None, 1, 5])
    stream = rng.random() < 0.5
    abandon = stream and rng.random() < 0.2      # ~10% of all clients leave mid-stream
    common = {"n": n, "max_tokens": MAX_TOKENS, "temperature": rng.choice([0.0, 0.8]), "seed": i,
              "ignore_eos": True, "stream": stream}
    if rng.random() < CONSTRAINED_SHARE:
        fields, expect = _constraint(i, rng)
        common.update(fields, max_tokens=24, expect=expect)
        if "tools" in fields:
            return "/v1/chat/completions", {**common, "messages": [{"role": "user", "content": f"Walk {i}"}]}, abandon
    if rng.random() < 0.5:
        body = {**common, "prompt": f"My dog {i} likes to"}
        if logprobs is not None:
            body["logprobs"] = logprobs
        return "/v1/completions", body, abandon
    body = {**common, "messages": [{"role": "user", "content": f"How do I walk dog number {i}?"}]}
    if logprobs is not None:
        body.update(logprobs=True, top_logprobs=logprobs)
    return "/v1/chat/completions", body, abandon


async def _client(http: httpx.AsyncClient, path: str, body: dict, abandon: bool) -> str:
    """'ok', 'abandoned', or what went wrong."""
    expect = body.pop("expect", None)
    if not body["stream"]:
        r = await http.post(path, json=body)
        if r.status_code != 200:
            return f"{r.status_code}: {r.text[:200]}"
        choices = r.json()["choices"]
        if len(choices) != body["n"]:
            return f"bad choices: {choices}"
        if expect is None and any(c["finish_reason"] != "length" for c in choices):
            return f"bad choices: {choices}"
        if expect is not None and not all(_valid(expect, c) for c in choices if c["finish_reason"] != "length"):
            return f"invalid constrained output: {choices}"
        return "ok"
    async with http.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            return f"{r.status_code}: {(await r.aread())[:200]!r}"
        finished, done = set(), False
        async for line in r.aiter_lines():
            if not line:
                continue
            if abandon:
                return "abandoned"            # leaves the `async with`: the connection closes mid-stream
            if line == "data: [DONE]":
                done = True
                break
            event = json.loads(line.removeprefix("data: "))
            if "error" in event:
                return f"error event: {event}"
            for choice in event["choices"]:
                if choice.get("finish_reason"):
                    finished.add(choice["index"])
        if not done or finished != set(range(body["n"])):
            return f"stream ended early: done={done} finished={sorted(finished)}"
        return "ok"


async def _storm(url: str) -> list[str]:
    rng = random.Random(14)
    limits = httpx.Limits(max_connections=NUM_CLIENTS, max_keepalive_connections=NUM_CLIENTS)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        jobs = [_client(http, *_request(i, rng)) for i in range(NUM_CLIENTS)]
        return await asyncio.gather(*jobs)


SIZES = ("--decode-capture-sizes", "1,8")
READY = "decode capture (torch.compile): buckets [1, 8] ready"


@pytest.mark.slow
@pytest.mark.parametrize("loop,capture", [("uvloop", "off"), ("asyncio", "off"), ("uvloop", "on"),
                                          ("uvloop", "auto"), ("uvloop", "native")],
                         ids=["uvloop", "asyncio", "uvloop-decode-capture", "uvloop-default-background-capture",
                              "uvloop-default-model-native-decode"])
def test_512_concurrent_clients(tmp_path, loop, capture):
    extra: tuple[str, ...] = ()
    env = None
    if capture != "off":
        require_cxx()
        extra = SIZES + (("--decode-capture", "on") if capture == "on" else ())
        # auto: the product's default, which this suite's environment otherwise replaces with off
        env = {k: v for k, v in os.environ.items() if k != "PAGEDKUBE_DECODE_CAPTURE"}
    if capture == "native":                # the default model at the product's default: auto is native
        require_default_model()
        extra = ("--model", DEFAULT_MODEL)
    server = ServerProcess(tmp_path, "--max-model-len", "256", "--loop", loop, *extra, env=env,
                           name=f"stress-{loop}-capture-{capture}").start()
    try:
        if capture == "on":
            assert READY in server.log()
        if capture == "auto":                  # serving at once, the buckets compiling meanwhile
            assert "compiling buckets [1, 8] in the background" in server.log()
        if capture == "native":                # nothing to compile
            assert "decode steps run natively" in server.log(), server.log()[-3000:]
            assert "decode capture (torch.compile)" not in server.log()
        results = asyncio.run(_storm(server.url))
        failures = [r for r in results if r not in ("ok", "abandoned")]
        assert not failures, f"{len(failures)} failed, e.g. {failures[:3]}\n{server.log()[-3000:]}"
        assert results.count("ok") > NUM_CLIENTS * 0.8
        with httpx.Client(base_url=server.url, timeout=60) as c:
            assert c.get("/health").status_code == 200
            r = c.post("/v1/completions", json={"prompt": "Good dog", "max_tokens": 4, "temperature": 0})
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4

            def pool_empty() -> bool:
                text = c.get("/metrics").text
                return (metric_value(text, "vllm:num_requests_running") == 0
                        and metric_value(text, "vllm:num_requests_waiting") == 0
                        and metric_value(text, "vllm:kv_cache_usage_perc") == 0)
            wait_until(pool_empty, timeout=60)   # abandoned streams' aborts reach the core
            if capture == "auto":
                wait_until(lambda: READY in server.log(), timeout=900)
                r = c.post("/v1/completions", json={"prompt": "Good dog", "max_tokens": 4, "temperature": 0})
                assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
            captured = metric_value(c.get("/metrics").text, "pagedkube_engine_captured_decode_steps_total")
            # With capture every decode-only step of 1-8 sequences ran captured once its bucket was
            # ready (the storm's tail and the requests above), natively every decode-only step;
            # without either none did.
            assert captured > 0 if capture != "off" else captured == 0
    finally:
        assert server.stop() == 0, server.log()[-3000:]
