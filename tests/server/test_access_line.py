"""The engine's access-log line (engine/server/access_log.py) for a real request on
each path: it follows the generation through Generation.observe(), the explicit
hook (issue 15), and must count exactly what the response's usage says."""
from __future__ import annotations

import uuid

import pytest

from .conftest import MODEL_NAME, wait_until

pytestmark = pytest.mark.slow


def access_line(server, request_id: str) -> dict[str, str]:
    """The key=value fields of the server's access line for `request_id` (text format)."""
    found: dict[str, str] = {}

    def find() -> bool:
        for line in server.log().splitlines():
            if "pagedkube.engine.access" in line and f"request_id={request_id} " in line:
                found.update(f.split("=", 1) for f in line.split("pagedkube.engine.access:", 1)[1].split())
                return True
        return False
    wait_until(find, timeout=30)
    return found


@pytest.mark.parametrize("stream", [False, True])
def test_the_access_line_counts_what_the_response_says(server, client, stream):
    request_id = f"access-{uuid.uuid4().hex[:12]}"
    messages = [{"role": "user", "content": "How often should I feed my puppy?"}]
    if stream:
        chunks = list(client.chat.completions.create(
            model=MODEL_NAME, messages=messages, max_tokens=5, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_headers={"x-request-id": request_id}))
        usage, completion_id = chunks[-1].usage, chunks[0].id
        finish = next(c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason)
    else:
        chat = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=5, temperature=0,
                                              extra_headers={"x-request-id": request_id})
        usage, completion_id, finish = chat.usage, chat.id, chat.choices[0].finish_reason
    fields = access_line(server, request_id)
    cached = (usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0) or 0
    assert fields["status"] == "200" and fields["completion_id"] == completion_id
    assert int(fields["prompt_tokens"]) == usage.prompt_tokens
    assert int(fields["completion_tokens"]) == usage.completion_tokens == 5
    assert int(fields["cached_tokens"]) == cached
    assert fields["finish_reason"] == finish == "length"
    assert fields["queue_s"] != "-" and fields["ttft_s"] != "-"
