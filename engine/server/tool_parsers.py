"""Tool calls out of a model's text: vLLM's tool-call parsers, by the same names.

    hermes        Qwen2.5, Qwen3, Hermes 2 Pro     <tool_call>{"name": ..., "arguments": {...}}</tool_call>
    llama3_json   Llama 3.1 / 3.2 / 3.3            [<|python_tag|>]{"name": ..., "parameters": {...}}[; {...}]
    mistral       Mistral, Mixtral (v3 and v11+)   [TOOL_CALLS][{"name": ..., "arguments": {...}}]
                                                   [TOOL_CALLS]name[ARGS]{...}
    required      tool_choice "required" (constrained output, tools.py):  [{"name": ..., "parameters": {...}}]
    named         tool_choice {"type": "function", ...}: the whole output is the arguments object

`detect(chat_template)` names the parser a template's format calls for, when
exactly one matches (`--tool-call-parser auto`, the default).

Every parser answers `parse(text, final)` with the text that is plain content
and the calls found so far, so one streaming emitter (tool_stream.py) serves
them all. While a stream runs (final False) the content stops where a call
might begin, so a half-written marker never reaches the client as text; at the
end (final True) text that turns out not to be a call is content after all.
Torch-free.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Callable, Protocol


@dataclass
class ParsedCall:
    name: str | None            # None until the stream has shown it
    arguments: str = ""         # the arguments' JSON text so far
    complete: bool = False


@dataclass
class ToolParse:
    content: str                # plain text, safe to show
    calls: list[ParsedCall] = field(default_factory=list)


class ToolParser(Protocol):
    name: str

    def parse(self, text: str, final: bool) -> ToolParse: ...


def _held_back(text: str, marker: str) -> int:
    """How many trailing characters of `text` could be the start of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


def _call(obj: object, arguments_key: str) -> ParsedCall | None:
    """A call from a decoded {"name": ..., "<arguments_key>": {...}} object (None if it is not one)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get(arguments_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(arguments, str):      # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    return ParsedCall(obj["name"], json.dumps(arguments, ensure_ascii=False), True)


class HermesParser:
    name = "hermes"
    START, END = "<tool_call>", "</tool_call>"
    _BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)

    def parse(self, text: str, final: bool) -> ToolParse:
        start = text.find(self.START)
        if start < 0:
            return ToolParse(text if final else text[:len(text) - _held_back(text, self.START)])
        calls = []
        for block in self._BLOCK.findall(text, start):
            call = _decode_call(block, "arguments")
            if call is None:
                return ToolParse(text) if final else ToolParse(text[:start])
            calls.append(call)
        unclosed = text.rfind(self.START)
        if final and text.find(self.END, unclosed) < 0:   # a last call cut off by EOS before its end tag
            call = _decode_call(text[unclosed + len(self.START):], "arguments")
            if call is not None:
                calls.append(call)
        if final and not calls:
            return ToolParse(text)
        return ToolParse(text[:start], calls)


def _decode_call(text: str, arguments_key: str) -> ParsedCall | None:
    try:
        return _call(json.loads(text.strip()), arguments_key)
    except json.JSONDecodeError:
        return None


def _json_sequence(text: str, separator: str) -> list[object] | None:
    """Values written one after another (`{...}; {...}`); None unless all of the text is such."""
    decoder, values, at = json.JSONDecoder(), [], 0
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        try:
            value, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            return None
        values.append(value)
        rest = text[at:].lstrip()
        if not rest:
            return values
        if not rest.startswith(separator):
            return None
        at = len(text) - len(rest) + len(separator)


class Llama3JsonParser:
    name = "llama3_json"
    PYTHON_TAG = "<|python_tag|>"

    def parse(self, text: str, final: bool) -> ToolParse:
        body = text.lstrip()
        if body.startswith(self.PYTHON_TAG):
            body = body[len(self.PYTHON_TAG):]
        elif not body.startswith("{"):
            if not final and (not body or self.PYTHON_TAG.startswith(body)):
                return ToolParse("")
            return ToolParse(text)
        if not final:
            return ToolParse("")          # a call, or JSON the model answers with: known at the end
        values = _json_sequence(body, ";")
        calls = [c for v in values or [] if (c := _call(v, "parameters")) is not None]
        if not calls or len(calls) != len(values or []):
            return ToolParse(text)
        return ToolParse("", calls)


class MistralParser:
    name = "mistral"
    MARKER, ARGS = "[TOOL_CALLS]", "[ARGS]"

    def parse(self, text: str, final: bool) -> ToolParse:
        start = text.find(self.MARKER)
        if start < 0:
            return ToolParse(text if final else text[:len(text) - _held_back(text, self.MARKER)])
        if not final:
            return ToolParse(text[:start])
        calls = self._calls(text[start:])
        return ToolParse(text[:start], calls) if calls else ToolParse(text)

    def _calls(self, text: str) -> list[ParsedCall]:
        parts = [p for p in text.split(self.MARKER) if p.strip()]
        calls: list[ParsedCall] = []
        for part in parts:
            if self.ARGS in part:                        # v11+: name[ARGS]{...}
                name, _, arguments = part.partition(self.ARGS)
                name = name.split("[CALL_ID]")[0].strip()
                decoded = _decode_call(json.dumps({"name": name, "arguments": arguments.strip()}), "arguments")
                if decoded is None:
                    return []
                calls.append(decoded)
                continue
            try:                                          # v3: [{"name": ..., "arguments": {...}}, ...]
                values = json.loads(part.strip())
            except json.JSONDecodeError:
                return []
            for value in values if isinstance(values, list) else [values]:
                call = _call(value, "arguments")
                if call is None:
                    return []
                calls.append(call)
        return calls


def json_value_end(text: str, start: int) -> int | None:
    """The index just past the JSON value that starts at text[start], or None if it is not
    finished yet (strings and escapes are tracked; the text is valid JSON so far)."""
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
                if depth == 0:
                    return i + 1
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
        elif depth == 0 and ch in ",}] \n":
            return i
    return None


class RequiredParser:
    """The output of tool_choice "required": a JSON array of {"name": ..., "parameters": {...}},
    written in the grammar's layout, read call by call as it grows."""
    name = "required"
    _ITEM = re.compile(r'\{\s*"name"\s*:\s*"([A-Za-z0-9_-]+)"\s*,\s*"parameters"\s*:\s*')

    def parse(self, text: str, final: bool) -> ToolParse:
        calls, at = [], 0
        while (match := self._ITEM.search(text, at)) is not None:
            end = json_value_end(text, match.end())
            arguments = text[match.end():end if end is not None else len(text)]
            calls.append(ParsedCall(match.group(1), arguments, end is not None))
            if end is None:
                break
            at = end
        return ToolParse("", calls)


class NamedParser:
    """The output of a named tool_choice: the arguments object of that function."""
    name = "named"

    def __init__(self, function: str):
        self.function = function

    def parse(self, text: str, final: bool) -> ToolParse:
        return ToolParse("", [ParsedCall(self.function, text, bool(text) and json_value_end(text, 0) == len(text))])


PARSERS: dict[str, Callable[[], ToolParser]] = {"hermes": HermesParser, "llama3_json": Llama3JsonParser,
                                                "mistral": MistralParser}
PARSER_NAMES = ("auto", "none") + tuple(PARSERS)

# What in a chat template shows the tool-call format its model was trained on.
_TEMPLATE_MARKERS = {"hermes": ("<tool_call>",), "mistral": ("[TOOL_CALLS]",),
                     "llama3_json": ("<|python_tag|>", "ipython")}


def detect(chat_template: str | None) -> str | None:
    """The parser a chat template calls for, when exactly one format matches."""
    if not chat_template:
        return None
    found = [name for name, markers in _TEMPLATE_MARKERS.items() if any(m in chat_template for m in markers)]
    return found[0] if len(found) == 1 else None


def resolve(setting: str, chat_template: str | None) -> ToolParser | None:
    """The parser for `--tool-call-parser` (auto: detect; none: off)."""
    if setting == "none":
        return None
    name = detect(chat_template) if setting == "auto" else setting
    if name is None:
        return None
    if name not in PARSERS:
        raise ValueError(f"tool-call parser must be one of {PARSER_NAMES}, got {setting!r}")
    return PARSERS[name]()
