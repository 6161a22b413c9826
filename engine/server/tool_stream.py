"""A choice's text -> OpenAI's tool-call message and stream deltas, for any parser.

Streaming, each call is announced once with its id and name, then its arguments
follow as fragments, which the openai client concatenates:

    {"tool_calls": [{"index": 0, "id": "call_…", "type": "function",
                     "function": {"name": "book_visit", "arguments": ""}}]}
    {"tool_calls": [{"index": 0, "function": {"arguments": "{\\"date\\": "}}]}
    {"tool_calls": [{"index": 0, "function": {"arguments": "\\"2026-12-03\\"}"}}]}

Content before the calls streams as ordinary `content` deltas. A choice that
made calls and stopped by itself finishes with "tool_calls".
"""
from __future__ import annotations

from typing import Any

from pagedkube.engine.server.tool_parsers import ToolParse, ToolParser
from pagedkube.engine.server.tools import new_tool_call_id


class ToolCallStream:
    """One choice's state: the text so far and what was already sent."""

    def __init__(self, parser: ToolParser):
        self.parser = parser
        self.text = ""
        self.sent_content = 0
        self.ids: list[str] = []              # one per call announced
        self.sent_arguments: list[int] = []

    def feed(self, text: str, final: bool) -> dict[str, Any]:
        """The delta ({"content": ..., "tool_calls": [...]}, either may be missing) after `text` more."""
        self.text += text
        parsed = self.parser.parse(self.text, final)
        delta: dict[str, Any] = {}
        if len(parsed.content) > self.sent_content:
            delta["content"] = parsed.content[self.sent_content:]
            self.sent_content = len(parsed.content)
        calls = []
        for index, call in enumerate(parsed.calls):
            if call.name is None:
                break
            if index == len(self.ids):
                self.ids.append(new_tool_call_id())
                self.sent_arguments.append(0)
                calls.append({"index": index, "id": self.ids[index], "type": "function",
                              "function": {"name": call.name, "arguments": ""}})
            if len(call.arguments) > self.sent_arguments[index]:
                calls.append({"index": index, "function": {"arguments": call.arguments[self.sent_arguments[index]:]}})
                self.sent_arguments[index] = len(call.arguments)
        if calls:
            delta["tool_calls"] = calls
        return delta

    @property
    def made_calls(self) -> bool:
        return bool(self.ids)


def tool_message(parser: ToolParser, text: str) -> tuple[dict[str, Any], bool]:
    """(the assistant message of a whole answer, whether it holds tool calls). A call cut off by
    max_tokens (its arguments unfinished) is left out: every call returned is whole."""
    parsed: ToolParse = parser.parse(text, final=True)
    calls = [{"id": new_tool_call_id(), "type": "function",
              "function": {"name": call.name, "arguments": call.arguments}}
             for call in parsed.calls if call.name is not None and call.complete]
    if not calls:
        return {"role": "assistant", "content": text}, False
    content = parsed.content.strip()
    return {"role": "assistant", "content": content or None, "tool_calls": calls}, True


def finish_reason(reason: str | None, made_calls: bool) -> str | None:
    return "tool_calls" if made_calls and reason == "stop" else reason
