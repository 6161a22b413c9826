"""OpenAI chat messages and tools as a Hugging Face chat template reads them.

The engine renders a chat with these dicts, and the gateway renders the same
request with the same function to hash its prompt (its block hashes must equal
the engine's, or routing loses the request's cache), so there is one definition,
torch-free and pydantic-free. What it does to an OpenAI message:

- `developer` becomes `system`; a list of content parts becomes its text parts
  joined by newlines (as vLLM does for string templates); no content becomes "";
- an assistant's `tool_calls` keep id, type and function, with
  `function.arguments` decoded from its JSON string into an object, which is
  what transformers' documentation and the tool-use templates expect (vLLM
  does the same); arguments that are not JSON stay the string they were;
- a tool answer keeps `tool_call_id` (and `name`, when given).

`template_tools` passes the request's `tools` through as transformers passes a
list of JSON-schema tool dicts: `tools=[{"type": "function", "function": {...}}]`.
"""
from __future__ import annotations

import json
from typing import Any


def content_text(content: Any) -> str:
    """A message's content as one string (text parts joined by newlines)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return str(content)


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _tool_call(call: Any) -> Any:
    """id, type and function (name, arguments decoded), in that order whatever the client's."""
    if not isinstance(call, dict):
        return call
    out = {key: call[key] for key in ("id", "type") if call.get(key) is not None}
    function = call.get("function")
    if isinstance(function, dict):
        out["function"] = {key: function[key] for key in ("name",) if key in function}
        if "arguments" in function:
            out["function"]["arguments"] = _arguments(function["arguments"])
    elif function is not None:
        out["function"] = function
    return out


def template_message(message: dict) -> dict:
    role = message.get("role")
    out: dict[str, Any] = {"role": "system" if role == "developer" else role,
                           "content": content_text(message.get("content"))}
    if message.get("name") is not None:
        out["name"] = message["name"]
    if message.get("tool_calls"):
        out["tool_calls"] = [_tool_call(call) for call in message["tool_calls"]]
    if message.get("tool_call_id") is not None:
        out["tool_call_id"] = message["tool_call_id"]
    return out


def template_messages(messages: list[dict]) -> list[dict]:
    return [template_message(m) for m in messages]


def template_tools(tools: Any) -> list[dict] | None:
    """The request's tools as the template's `tools` variable (None: no tools)."""
    return list(tools) if tools else None


def template_kwargs(body: dict) -> dict[str, Any]:
    """The template's variables besides messages and add_generation_prompt: the request's
    chat_template_kwargs, and `tools` when it has any."""
    kwargs = dict(body.get("chat_template_kwargs") or {})
    tools = template_tools(body.get("tools"))
    if tools is not None:
        kwargs["tools"] = tools
    return kwargs
