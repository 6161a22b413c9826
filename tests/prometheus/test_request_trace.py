"""One request followed from the client through the gateway and the engine that
served it: by its x-request-id in both processes' access-log lines, and by its
OpenTelemetry trace in the spans both exported to the in-process collector.

The stack is `pagedkube up --access-log json --otlp-traces-endpoint ...`
(conftest.py): the gateway logs as `gateway  | ... pagedkube.gateway.access: {json}`,
each engine as `engine-N | ... pagedkube.engine.access: {json}`.
"""
from __future__ import annotations

import json
import re
import time
import uuid

import openai

from tier_load import SYSTEM

_ACCESS = re.compile(r"^(gateway|engine-\d+) +\| .*pagedkube\.(?:gateway|engine)\.access: (\{.*\})$", re.M)


def access_lines(text: str, request_id: str) -> dict[str, list[dict]]:
    """Process name -> the access-log records carrying `request_id`."""
    out: dict[str, list[dict]] = {}
    for process, payload in _ACCESS.findall(text):
        record = json.loads(payload)
        if record["request_id"] == request_id:
            out.setdefault(process, []).append(record)
    return out


def wait_until(predicate, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    return predicate()


def _chat(stack, request_id: str | None, stream: bool):
    client = openai.OpenAI(base_url=f"{stack.up.url}/v1", api_key="unused", max_retries=0, timeout=120)
    headers = {"x-request-id": request_id} if request_id else {}
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", max_tokens=6, stream=stream, extra_headers=headers,
        **({"stream_options": {"include_usage": True}} if stream else {}),
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Is my cat too fat?"}])
    body = raw.parse()
    usage = [c.usage for c in body if c.usage][-1] if stream else body.usage
    return raw, usage, None if stream else body.choices[0].finish_reason


def test_one_request_id_through_gateway_and_engine_logs(stack):
    request_id = f"client-{uuid.uuid4().hex}"
    raw, usage, finish_reason = _chat(stack, request_id, stream=False)
    assert raw.status_code == 200
    assert raw.headers["x-request-id"] == request_id

    lines = wait_until(lambda: (found := access_lines(stack.up.text(), request_id)) and len(found) == 2 and found)
    assert set(lines) == {"gateway", *[p for p in lines if p.startswith("engine-")]} and len(lines) == 2, lines
    (gateway,) = lines["gateway"]
    engine_name = next(p for p in lines if p.startswith("engine-"))
    (engine,) = lines[engine_name]
    # The gateway names the engine it chose; that engine process logged the same id.
    assert gateway["engine"] == stack.up.engines()[engine_name][1]
    assert gateway["status"] == engine["status"] == 200
    assert gateway["route"] in ("affinity", "ring", "overflow", "fallback")
    assert isinstance(gateway["predicted_cached_tokens"], int)
    assert gateway["cached_tokens"] == engine["cached_tokens"] == usage.prompt_tokens_details.cached_tokens
    assert engine["prompt_tokens"] == usage.prompt_tokens and engine["completion_tokens"] == usage.completion_tokens
    assert engine["completion_id"].startswith("chatcmpl-") and engine["finish_reason"] == finish_reason
    # The random builtin model may sample its end-of-sequence token before max_tokens=6.
    assert finish_reason == ("length" if usage.completion_tokens == 6 else "stop")
    for record in (gateway, engine):
        assert all(isinstance(record[k], float) for k in ("queue_s", "ttft_s", "total_s")), record


def test_gateway_makes_an_id_when_the_client_sends_none_or_a_bad_one(stack):
    raw, _, _ = _chat(stack, None, stream=True)
    made = raw.headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", made)
    lines = wait_until(lambda: (found := access_lines(stack.up.text(), made)) and len(found) == 2 and found)
    assert len(lines) == 2 and lines["gateway"][0]["cached_tokens"] is not None
    assert lines["gateway"][0]["ttft_s"] is not None

    raw, _, _ = _chat(stack, 'bad id with "quotes"', stream=False)
    assert re.fullmatch(r"[0-9a-f]{32}", raw.headers["x-request-id"])


def test_one_trace_across_gateway_and_engine(stack):
    request_id = f"traced-{uuid.uuid4().hex}"
    raw, _, _ = _chat(stack, request_id, stream=True)
    assert raw.status_code == 200

    def spans():
        by_id = [s for s in stack.collector.snapshot() if s.attributes.get("pagedkube.request_id") == request_id]
        return by_id if {s.service for s in by_id} == {"pagedkube-gateway", "pagedkube-engine"} else None

    roots = wait_until(spans)
    assert roots, "no spans for the request from both processes"
    gateway = next(s for s in roots if s.name == "gateway.request")
    engine = next(s for s in roots if s.name == "engine.request")
    assert engine.trace_id == gateway.trace_id and engine.parent_id == gateway.span_id
    trace = [s for s in stack.collector.snapshot() if s.trace_id == gateway.trace_id]
    children = {s.name: s for s in trace if s.parent_id in (gateway.span_id, engine.span_id)}
    assert children["route"].parent_id == gateway.span_id
    for name in ("queue", "prefill", "decode"):
        assert children[name].parent_id == engine.span_id and children[name].service == "pagedkube-engine"
    # queue -> prefill -> decode share their boundaries, inside engine.request
    assert children["queue"].end_ns == children["prefill"].start_ns
    assert children["prefill"].end_ns == children["decode"].start_ns
    assert engine.start_ns <= children["queue"].start_ns and children["decode"].end_ns <= engine.end_ns
    (logged,) = access_lines(stack.up.text(), request_id)["gateway"]
    assert children["route"].attributes["pagedkube.engine"] == logged["engine"]
    assert gateway.attributes["http.response.status_code"] == 200
