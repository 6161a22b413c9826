"""Tool calling over HTTP with the official openai client.

- `required` and a named function: constrained, so the call is valid whatever the model
  (the built-in toy here), streamed and not;
- `auto`: a model that really writes Qwen2.5's Hermes format (tests/helpers/tool_model.py),
  parsed into message.tool_calls by the parser the chat template calls for;
- a history with an assistant's tool_calls and a tool's answer renders exactly as
  transformers' apply_chat_template(..., tools=...) renders it.
"""
from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from .conftest import MODEL_NAME, ServerProcess
from tool_model import ANSWER, CALL, CONTENT, MESSAGES, TOOLS, hermes_tool_model

SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "My dog needs a vet on 2026-12-03."}]


@pytest.fixture(scope="module")
def hermes_server(tmp_path_factory):
    proc = ServerProcess(tmp_path_factory.mktemp("hermes"), "--model", str(hermes_tool_model()),
                         "--served-model-name", "qwen-tools", "--max-model-len", "1024", name="hermes").start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def hermes(hermes_server):
    return openai.OpenAI(base_url=f"{hermes_server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def streamed(client, **kw) -> tuple[str, dict[int, dict], str, list]:
    """(content, {index: {"id", "name", "arguments"}}, finish_reason, the tool_call deltas in order)."""
    content, calls, finish, deltas = "", {}, None, []
    for chunk in client.chat.completions.create(stream=True, **kw):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for d in choice.delta.tool_calls or []:
            deltas.append(d)
            call = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
            call["id"] = call["id"] or d.id
            call["name"] = call["name"] or (d.function.name if d.function else None)
            call["arguments"] += (d.function.arguments or "") if d.function else ""
        finish = choice.finish_reason or finish
    return content, calls, finish, deltas


def check_call(name: str, arguments: str) -> None:
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_required_returns_valid_calls(client, seed):
    r = client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS, tool_choice="required",
                                       max_tokens=200, temperature=1.0, seed=seed)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.id.startswith("call_") and len(call.id) == 29 and call.type == "function"
        check_call(call.function.name, call.function.arguments)


def test_named_function_streams_its_name_first_then_argument_fragments(client):
    content, calls, finish, deltas = streamed(
        client, model=MODEL_NAME, messages=ASK, tools=TOOLS, max_tokens=200, temperature=1.0, seed=3,
        tool_choice={"type": "function", "function": {"name": "lookup_medication"}})
    assert content == "" and finish == "tool_calls" and list(calls) == [0]
    assert deltas[0].function.name == "lookup_medication" and deltas[0].function.arguments == ""
    assert deltas[0].id.startswith("call_") and all(d.id is None for d in deltas[1:])
    assert len(deltas) > 2                             # fragments, not one piece
    check_call("lookup_medication", calls[0]["arguments"])


def test_required_streams_every_call(client):
    content, calls, finish, _ = streamed(client, model=MODEL_NAME, messages=ASK, tools=TOOLS, tool_choice="required",
                                         max_tokens=200, temperature=1.0, seed=4)
    assert finish == "tool_calls" and calls
    for call in calls.values():
        assert call["id"].startswith("call_")
        check_call(call["name"], call["arguments"])


def test_parallel_tool_calls_false_makes_one_call(client):
    for seed in range(3):
        r = client.chat.completions.create(model=MODEL_NAME, messages=ASK, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=200, temperature=1.0, seed=seed)
        assert len(r.choices[0].message.tool_calls) == 1


def test_auto_parses_a_hermes_tool_call(hermes):
    r = hermes.chat.completions.create(model="qwen-tools", messages=MESSAGES, tools=TOOLS, max_tokens=200,
                                       temperature=0)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == CONTENT
    [call] = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == (CALL["name"], CALL["arguments"])


def test_auto_streams_content_then_the_call(hermes):
    content, calls, finish, deltas = streamed(hermes, model="qwen-tools", messages=MESSAGES, tools=TOOLS,
                                              max_tokens=200, temperature=0)
    assert finish == "tool_calls" and content == CONTENT + "\n"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == [(CALL["name"], CALL["arguments"])]
    assert deltas[0].function.name == CALL["name"]


def test_tool_choice_none_leaves_the_text_alone(hermes):
    r = hermes.chat.completions.create(model="qwen-tools", messages=MESSAGES, tools=TOOLS, tool_choice="none",
                                       max_tokens=200, temperature=0)
    assert r.choices[0].message.content == ANSWER and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "stop"


def test_a_tool_history_renders_as_transformers_renders_it(hermes_server, hermes):
    from transformers import AutoTokenizer

    history = MESSAGES + [
        {"role": "assistant", "content": CONTENT, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_vet_slots", "arguments": json.dumps(CALL["arguments"])}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"slots": ["09:30", "14:00"]})},
        {"role": "user", "content": "Book 09:30 please."}]
    import httpx
    ours = httpx.post(f"{hermes_server.url}/tokenize", json={"messages": history, "tools": TOOLS}).json()["tokens"]
    # transformers' documented form of a tool call in the history: arguments as an object
    reference_history = json.loads(json.dumps(history))
    reference_history[2]["tool_calls"][0]["function"]["arguments"] = CALL["arguments"]
    hf = AutoTokenizer.from_pretrained(hermes_tool_model())
    text = hf.apply_chat_template(reference_history, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert "<tool_call>" in text and "<tool_response>" in text and '"name": "lookup_medication"' in text
    assert ours == hf.encode(text, add_special_tokens=False)
    r = hermes.chat.completions.create(model="qwen-tools", messages=history, tools=TOOLS, max_tokens=4)
    assert r.usage.prompt_tokens == len(ours)
