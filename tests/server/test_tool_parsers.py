"""Tool-call parsers on what the models really write (torch-free).

The outputs are the ones the model families' own documentation shows: Qwen2.5's function
calling guide (Hermes format, two parallel calls), Meta's Llama 3.1 model card (JSON tool
calling, with and without <|python_tag|>), and Mistral's function calling docs (v0.3 list
and v11+ `name[ARGS]` forms). Each is also fed one character at a time through the stream
emitter: the client must see the same content and calls, and never a half-written marker.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pagedkube.engine.server.tool_parsers import (HermesParser, Llama3JsonParser, MistralParser, NamedParser,
                                                  RequiredParser, detect, resolve)
from pagedkube.engine.server.tool_stream import ToolCallStream, tool_message

QWEN = ('<tool_call>\n{"name": "get_current_temperature", "arguments": {"location": "San Francisco, CA, USA"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_temperature_date", "arguments": {"location": "San Francisco, '
        'CA, USA", "date": "2024-10-01"}}\n</tool_call>')
QWEN_CALLS = [("get_current_temperature", {"location": "San Francisco, CA, USA"}),
              ("get_temperature_date", {"location": "San Francisco, CA, USA", "date": "2024-10-01"})]
LLAMA = '{"name": "get_current_conditions", "parameters": {"location": "San Francisco, CA", "unit": "Fahrenheit"}}'
LLAMA_CALLS = [("get_current_conditions", {"location": "San Francisco, CA", "unit": "Fahrenheit"})]
MISTRAL_V3 = ('[TOOL_CALLS] [{"name": "get_current_weather", "arguments": {"location": "Paris, France", '
              '"format": "celsius"}}]')
MISTRAL_V11 = '[TOOL_CALLS]get_current_weather[ARGS]{"location": "Paris, France", "format": "celsius"}'
MISTRAL_CALLS = [("get_current_weather", {"location": "Paris, France", "format": "celsius"})]

CASES = [
    (HermesParser(), QWEN, "", QWEN_CALLS),
    (HermesParser(), "Let me look that up.\n" + QWEN.split("\n<tool_call>")[0], "Let me look that up.",
     QWEN_CALLS[:1]),
    (HermesParser(), '<tool_call>\n{"name": "f", "arguments": {"a": 1}}', "", [("f", {"a": 1})]),  # EOS before </tool_call>
    (Llama3JsonParser(), LLAMA, "", LLAMA_CALLS),
    (Llama3JsonParser(), "<|python_tag|>" + LLAMA, "", LLAMA_CALLS),
    (Llama3JsonParser(), LLAMA + "; " + LLAMA.replace("conditions", "forecast"), "",
     LLAMA_CALLS + [("get_current_forecast", LLAMA_CALLS[0][1])]),
    (MistralParser(), MISTRAL_V3, "", MISTRAL_CALLS),
    (MistralParser(), MISTRAL_V11, "", MISTRAL_CALLS),
    (MistralParser(), "Sure." + MISTRAL_V11, "Sure.", MISTRAL_CALLS),
]


def calls_of(parsed) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in parsed.calls]


@pytest.mark.parametrize("parser, text, content, calls", CASES)
def test_documented_outputs_parse(parser, text, content, calls):
    parsed = parser.parse(text, final=True)
    assert (parsed.content.strip(), calls_of(parsed)) == (content, calls)
    message, made = tool_message(parser, text)
    assert made and message["content"] == (content or None)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == calls


@pytest.mark.parametrize("parser, text, content, calls", CASES)
def test_streamed_a_character_at_a_time_the_client_sees_the_same(parser, text, content, calls):
    stream = ToolCallStream(parser)
    seen_content = ""
    seen: dict[int, dict] = {}
    for i, ch in enumerate(text):
        delta = stream.feed(ch, final=i == len(text) - 1)
        seen_content += delta.get("content", "")
        assert "<tool" not in seen_content and "[TOOL" not in seen_content and "python_tag" not in seen_content
        for d in delta.get("tool_calls", []):
            entry = seen.setdefault(d["index"], {"name": None, "arguments": ""})
            if "id" in d:
                assert entry["name"] is None and d["function"]["name"]
                entry["name"] = d["function"]["name"]
            entry["arguments"] += d["function"]["arguments"]
    assert seen_content.strip() == content
    assert [(c["name"], json.loads(c["arguments"])) for c in seen.values()] == calls


@pytest.mark.parametrize("parser, text", [
    (HermesParser(), "Walk your dog twice a day. Use <b>treats</b>."),
    (HermesParser(), "<tool_call>\nnot json\n</tool_call>"),
    (Llama3JsonParser(), '{"answer": 42}'),              # JSON, but not a call
    (Llama3JsonParser(), "Hello <|python"),
    (MistralParser(), "[TOOL_CALLS] oops"),
])
def test_text_that_is_not_a_call_is_content(parser, text):
    message, made = tool_message(parser, text)
    assert not made and message == {"role": "assistant", "content": text}
    stream = ToolCallStream(parser)
    shown = "".join(stream.feed(ch, final=i == len(text) - 1).get("content", "") for i, ch in enumerate(text))
    assert shown == text


def test_constrained_outputs_parse_as_they_grow():
    text = '[{"name": "a", "parameters": {"x": "}{\\"]"}}, {"name": "b_2", "parameters": {}}]'
    parsed = RequiredParser().parse(text, final=True)
    assert [(c.name, json.loads(c.arguments), c.complete) for c in parsed.calls] == [
        ("a", {"x": '}{"]'}, True), ("b_2", {}, True)]
    partial = RequiredParser().parse(text[:40], final=False)
    assert partial.calls[-1].name == "a" and not partial.calls[-1].complete
    assert NamedParser("f").parse('{"k": 1}', final=True).calls[0].arguments == '{"k": 1}'


def test_a_call_cut_off_by_max_tokens_is_not_returned():
    text = '[{"name": "a", "parameters": {"x": 1}}, {"name": "b", "parameters": {"y": '
    message, made = tool_message(RequiredParser(), text)
    assert made and [c["function"]["name"] for c in message["tool_calls"]] == ["a"]
    assert tool_message(NamedParser("f"), '{"k": "unfini') == ({"role": "assistant", "content": '{"k": "unfini'}, False)
    assert tool_message(NamedParser("f"), '{"k": 1}')[1]


def test_the_chat_template_names_its_parser():
    qwen = (Path(__file__).resolve().parents[1] / "data" / "chat_templates" / "qwen2.5.jinja").read_text()
    assert detect(qwen) == "hermes" and resolve("auto", qwen).name == "hermes"
    assert detect("{{- '<|python_tag|>' }}{{ 'ipython' }}") == "llama3_json"
    assert detect("{{ '[AVAILABLE_TOOLS]' }}{{ '[TOOL_CALLS]' }}") == "mistral"
    assert detect("{% for m in messages %}{{ m.content }}{% endfor %}") is None
    assert detect("<tool_call> [TOOL_CALLS]") is None         # two formats: ambiguous, never guessed
    assert resolve("none", qwen) is None and resolve("mistral", None).name == "mistral"
    with pytest.raises(ValueError):
        resolve("pythonic", qwen)
