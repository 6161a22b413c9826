"""Structured outputs over HTTP with the official openai client, and hostile constraints.

Every way a client asks (OpenAI's response_format and `parse`, vLLM's structured_outputs and
guided_*) on chat and completions, streamed and not; then the inputs an attacker sends: each
a 400 naming its field, and the server answers the next request as before.
"""
from __future__ import annotations

import json
import re
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from .conftest import MODEL_NAME, ServerProcess

CHAT = [{"role": "user", "content": "Book a vet visit for my dog Rex."}]


class Owner(BaseModel):
    name: str = Field(max_length=20)
    phone: str = Field(pattern=r"^\+?[0-9]{7,12}$")


class VetBooking(BaseModel):
    pet_name: str = Field(max_length=20)
    species: Literal["dog", "cat"]
    age_years: int = Field(ge=0, le=30)
    slot: Literal["morning", "afternoon"]
    owner: Owner


def test_parse_returns_a_pydantic_object(client):
    r = client.beta.chat.completions.parse(model=MODEL_NAME, messages=CHAT, response_format=VetBooking,
                                           max_tokens=200, temperature=0)
    booking = r.choices[0].message.parsed
    assert isinstance(booking, VetBooking) and r.choices[0].finish_reason == "stop"
    assert booking == VetBooking.model_validate_json(r.choices[0].message.content)


@pytest.mark.parametrize("seed", range(3))
def test_json_object_is_parseable_json(client, seed):
    r = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, response_format={"type": "json_object"},
                                       max_tokens=300, temperature=1.0, seed=seed)
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:
        assert r.choices[0].message.content.startswith("{")


def test_regex_output_fullmatches_on_both_endpoints(client):
    pattern = r"(Rex|Bella) weighs [1-9][0-9]? kg\."
    chat = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=40, temperature=1.0, seed=1,
                                          extra_body={"structured_outputs": {"regex": pattern}})
    completion = client.completions.create(model=MODEL_NAME, prompt="My dog", max_tokens=40, temperature=1.0,
                                           seed=2, extra_body={"guided_regex": pattern})
    for text in (chat.choices[0].message.content, completion.choices[0].text):
        assert re.fullmatch(pattern, text), text


def test_choice_output_is_one_of_the_choices(client):
    choices = ["walk now", "wait", "call the vet"]
    for seed in range(4):
        r = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=10, temperature=1.0,
                                           seed=seed, extra_body={"guided_choice": choices})
        assert r.choices[0].message.content in choices


def test_an_ebnf_grammar_output_parses(client):
    grammar = ('root ::= visit (", " visit)*\nvisit ::= day " at " hour\n'
               'day ::= "Mon" | "Tue" | "Wed"\nhour ::= [1-9] | "1" [0-2]')
    r = client.completions.create(model=MODEL_NAME, prompt="Free slots:", max_tokens=60, temperature=1.0, seed=5,
                                  extra_body={"structured_outputs": {"grammar": grammar}})
    text = r.choices[0].text
    visit = r"(Mon|Tue|Wed) at ([1-9]|1[0-2])"
    assert re.fullmatch(rf"{visit}(, {visit})*", text), text


def test_json_schema_streams_valid_json(client):
    schema = VetBooking.model_json_schema()
    text, finish = "", None
    for chunk in client.chat.completions.create(
            model=MODEL_NAME, messages=CHAT, max_tokens=200, temperature=1.0, seed=7, stream=True,
            response_format={"type": "json_schema", "json_schema": {"name": "booking", "schema": schema}}):
        text += chunk.choices[0].delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "stop"
    jsonschema.validate(json.loads(text), schema)


HOSTILE = [
    ("response_format", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}}}}),
    ("guided_json", {"guided_json": {"type": "object", "properties": {
        f"field_{i}": {"type": "string", "description": "x" * 200} for i in range(5000)}}}),   # ~1.3 MB
    ("structured_outputs", {"structured_outputs": {"grammar": "root ::= " + " | ".join(['"a"'] * 60000)}}),
    ("guided_regex", {"guided_regex": "[a-z"}),
    ("tool_choice", {"tools": [{"type": "function", "function": {"name": "f"}}],
                     "tool_choice": {"type": "function", "function": {"name": "missing"}}}),
]


@pytest.mark.parametrize("field, extra", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_constraints_are_400s_and_the_server_keeps_serving(server, field, extra):
    body = {"model": MODEL_NAME, "messages": CHAT, "max_tokens": 8, **extra}
    for stream in (False, True):
        r = httpx.post(f"{server.url}/v1/chat/completions", json={**body, "stream": stream}, timeout=120)
        assert r.status_code == 400, r.text[:300]
        assert r.json()["error"]["param"] == field
    ok = httpx.post(f"{server.url}/v1/chat/completions", json={"model": MODEL_NAME, "messages": CHAT,
                                                                 "max_tokens": 4}, timeout=120)
    assert ok.status_code == 200


@pytest.mark.parametrize("pattern", [r"(a+)+b", r"(\w+\s?)+x", r"(a|aa)+c", r"(x+x+)+y"])
def test_backtracking_regexes_compile_to_automata_and_are_answered(client, pattern):
    """Patterns that take a backtracking engine exponential time: the grammar library builds
    an automaton instead, so they are answered (and match), not refused."""
    r = client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=30, temperature=1.0, seed=0,
                                  extra_body={"guided_regex": pattern})
    if r.choices[0].finish_reason == "stop":
        assert re.fullmatch(pattern, r.choices[0].text)


@pytest.fixture(scope="module")
def impatient(tmp_path_factory):
    """A server whose grammars must compile within a millisecond."""
    proc = ServerProcess(tmp_path_factory.mktemp("impatient"), "--served-model-name", MODEL_NAME,
                         "--max-model-len", "512", "--grammar-compile-timeout", "0.001", name="impatient").start()
    yield proc
    proc.stop()


def test_a_grammar_that_does_not_compile_in_time_is_a_400(impatient):
    for stream in (False, True):    # a schema each: the first one's compile may have finished meanwhile
        slow = {"type": "object", "properties": {f"f{i}_{stream}": {"type": "string",
                                                                    "pattern": f"^[a-z]{{{i % 7 + 1}}}[0-9]+$"}
                                                 for i in range(500)}}
        r = httpx.post(f"{impatient.url}/v1/chat/completions", timeout=120, json={
            "model": MODEL_NAME, "messages": CHAT, "max_tokens": 4, "stream": stream,
            "response_format": {"type": "json_schema", "json_schema": {"name": "slow", "schema": slow}}})
        assert r.status_code == 400, r.text[:300]
        error = r.json()["error"]
        assert error["param"] == "response_format" and "did not compile within 0.001 s" in error["message"]
    client = openai.OpenAI(base_url=f"{impatient.url}/v1", api_key="x", max_retries=0)
    assert client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=4).choices[0].finish_reason
    assert httpx.get(f"{impatient.url}/health").status_code == 200
