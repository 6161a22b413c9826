"""Structured outputs and tool calling through the gateway, on real engine processes.

- the default model (SmolLM2-135M) behind a gateway: the openai client's `parse` returns a
  vet booking, and `required` / named tool choices return valid calls, streamed and not;
- a tools-aware model (Qwen2.5's chat template, tests/helpers/tool_model.py) behind a
  gateway: the gateway renders `tools` and a tool-call history into exactly the prompt the
  engine renders, so its block hashes are the engine's and a session's next turn goes back
  to the engine that holds its blocks.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from pagedkube import hashing
from pagedkube.gateway.prompt import PromptHasher
from pagedkube.tokenizer import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "helpers"))
from tool_model import CALL, CONTENT, MESSAGES, TOOLS, hermes_tool_model  # noqa: E402

SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


class VetBooking(BaseModel):
    pet_name: str = Field(max_length=24)
    species: Literal["dog", "cat", "rabbit"]
    age_years: int = Field(ge=0, le=30)
    date: str = Field(pattern=r"^2026-12-[0-3][0-9]$")
    reason: str = Field(max_length=80)


@pytest.fixture(scope="module")
def default_stack(module_processes):
    engine = module_processes.engine("--model", "smollm2-135m-instruct", "--max-model-len", "2048")
    module_processes.wait_ready(engine)
    gateway = module_processes.gateway([engine.url])
    module_processes.wait_ready(gateway)
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0, timeout=300)


def test_parse_through_the_gateway_with_the_default_model(default_stack):
    r = default_stack.beta.chat.completions.parse(
        model="smollm2-135m-instruct", temperature=0, max_tokens=200, response_format=VetBooking,
        messages=[{"role": "system", "content": "You fill in vet booking forms as JSON."},
                  {"role": "user", "content": "Book my 4 year old beagle Rex for 2026-12-03, he is limping."}])
    assert r.choices[0].finish_reason == "stop"
    booking = r.choices[0].message.parsed
    assert isinstance(booking, VetBooking)


def test_every_kind_of_constraint_through_the_gateway(default_stack):
    ask = dict(model="smollm2-135m-instruct", temperature=0, max_tokens=60,
               messages=[{"role": "user", "content": "How many walks does a puppy need a day?"}])
    r = default_stack.chat.completions.create(response_format={"type": "json_object"}, **ask)
    assert r.choices[0].finish_reason == "stop" and isinstance(json.loads(r.choices[0].message.content), dict)
    pattern = r"[1-9] walks? a day(, [a-z ]{1,30})?\."
    r = default_stack.chat.completions.create(extra_body={"guided_regex": pattern}, **ask)
    assert re.fullmatch(pattern, r.choices[0].message.content)
    r = default_stack.chat.completions.create(extra_body={"guided_choice": ["one", "two", "three"]}, **ask)
    assert r.choices[0].message.content in ("one", "two", "three")
    grammar = 'root ::= "Walks: " count (", then " count)*\ncount ::= [1-4] " x " [1-6] "0 min"'
    r = default_stack.chat.completions.create(extra_body={"structured_outputs": {"grammar": grammar}}, **ask)
    assert re.fullmatch(r"Walks: [1-4] x [1-6]0 min(, then [1-4] x [1-6]0 min)*", r.choices[0].message.content)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_vet_slots"}}])
def test_forced_tool_calls_through_the_gateway(default_stack, tool_choice, stream):
    # parallel_tool_calls=False: greedy, the 135M model repeats a call until max_tokens runs out
    kw = dict(model="smollm2-135m-instruct", messages=MESSAGES, tools=TOOLS, tool_choice=tool_choice,
              max_tokens=200, temperature=0, parallel_tool_calls=False)
    if not stream:
        choice = default_stack.chat.completions.create(**kw).choices[0]
        assert choice.finish_reason == "tool_calls"
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    else:
        parts: dict[int, list] = {}
        for chunk in default_stack.chat.completions.create(stream=True, **kw):
            for d in chunk.choices[0].delta.tool_calls or []:
                entry = parts.setdefault(d.index, ["", ""])
                entry[0] = entry[0] or (d.function.name or "")
                entry[1] += d.function.arguments or ""
        calls = [tuple(v) for v in parts.values()]
    assert calls
    for name, arguments in calls:
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])


HISTORY = MESSAGES + [
    {"role": "assistant", "content": CONTENT, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": CALL["name"], "arguments": json.dumps(CALL["arguments"])}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"slots": ["09:30", "14:00"]})},
    {"role": "user", "content": "The 09:30 one, please."}]


def test_the_gateway_hashes_a_tool_conversation_as_the_engine_renders_it(module_processes):
    """Block hashes from the gateway's routing render equal the hashes of the engine's own
    tokens for the same body (served by /tokenize): tools and tool history included."""
    model = hermes_tool_model()
    engine = module_processes.engine("--model", str(model), "--max-model-len", "2048")
    module_processes.wait_ready(engine)
    hasher = PromptHasher(Tokenizer.from_pretrained(model), block_size=16, seed="")
    for body in ({"messages": HISTORY, "tools": TOOLS}, {"messages": MESSAGES, "tools": TOOLS},
                 {"messages": HISTORY, "tools": list(reversed(TOOLS))}):
        ours = hasher.routing_input("chat", body, None)
        tokens = httpx.post(f"{engine.url}/tokenize", json=body).json()["tokens"]
        assert ours.tokenized and ours.num_prompt_tokens == len(tokens)
        assert list(ours.block_hashes) == hashing.block_hashes(tokens, 16, seed="")


def test_a_tool_session_returns_to_the_engine_holding_its_blocks(module_processes):
    model = hermes_tool_model()
    engines = [module_processes.engine("--model", str(model), "--max-model-len", "2048") for _ in range(2)]
    module_processes.wait_ready(*engines)
    gateway = module_processes.gateway([e.url for e in engines])
    module_processes.wait_ready(gateway)
    body = {"messages": HISTORY, "tools": TOOLS, "max_tokens": 4, "temperature": 0}
    first = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=120)
    second = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=120)
    assert first.status_code == second.status_code == 200
    assert second.headers["x-pagedkube-endpoint"] == first.headers["x-pagedkube-endpoint"]
    prompt = second.json()["usage"]
    assert prompt["prompt_tokens_details"]["cached_tokens"] == (prompt["prompt_tokens"] - 1) // 16 * 16 > 0
