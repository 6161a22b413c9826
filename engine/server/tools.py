"""OpenAI tool calling: the request's tools and tool_choice, and what they constrain.

    tool_choice          prompt            output
    none                 tools rendered    text, never parsed
    auto (default)       tools rendered    text, parsed by the tool-call parser (tool_parsers.py)
    required             tools rendered    constrained: [{"name": ..., "parameters": {...}}, ...]
    {"type": "function", tools rendered    constrained: the named function's arguments object
     "function": {"name"}}

`required` and a named function are enforced by the same token bitmask as
structured outputs (vLLM's approach, and model-independent): the output is a
JSON document the grammar allows, so it is always a valid call whose arguments
validate against the function's schema, whatever the model was trained on.
"""
from __future__ import annotations

import re
import secrets
import string
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator

from pagedkube.engine.server.errors import bad_request
from pagedkube.engine.structured.params import StructuredOutputsParams

# OpenAI's rule for function names.
FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_TOOLS = 128
_ID_ALPHABET = string.ascii_letters + string.digits


def new_tool_call_id() -> str:
    """`call_` + 24 random letters and digits, as OpenAI's ids look."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")


class FunctionDefinition(_Body):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not FUNCTION_NAME.match(value):
            raise ValueError("function names are 1 to 64 letters, digits, '_' or '-'")
        return value


class ToolDefinition(_Body):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


class FunctionCall(_Body):
    name: str
    arguments: str | dict[str, Any] = ""


class ToolCall(_Body):
    """A call in a history's assistant message (arguments as OpenAI sends them: a JSON string)."""
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice

# A function without a `parameters` schema takes an empty object, as OpenAI documents.
_NO_PARAMETERS = {"type": "object", "properties": {}}


def _parameters(function: FunctionDefinition) -> dict[str, Any]:
    return function.parameters if function.parameters is not None else _NO_PARAMETERS


def check_tools(tools: list[ToolDefinition] | None, tool_choice: ToolChoice | None) -> None:
    """400s for a tool setup that cannot be honoured."""
    if tools is not None and len(tools) > MAX_TOOLS:
        raise bad_request(f"tools: at most {MAX_TOOLS} tools per request", "tools")
    names = [t.function.name for t in tools or []]
    if len(set(names)) != len(names):
        raise bad_request("tools: function names must be unique", "tools")
    if tool_choice in (None, "none", "auto"):
        return
    if not tools:
        raise bad_request(f"tool_choice: {_choice_name(tool_choice)!r} needs `tools`", "tool_choice")
    if isinstance(tool_choice, NamedToolChoice) and tool_choice.function.name not in names:
        raise bad_request(f"tool_choice: no function named {tool_choice.function.name!r} in `tools`", "tool_choice")


def _choice_name(tool_choice: ToolChoice) -> str:
    return tool_choice if isinstance(tool_choice, str) else tool_choice.function.name


def forced_tool_constraint(tools: list[ToolDefinition], tool_choice: ToolChoice | None,
                           parallel_tool_calls: bool | None) -> StructuredOutputsParams | None:
    """The constraint `required` or a named function puts on the output (None otherwise)."""
    if isinstance(tool_choice, NamedToolChoice):
        function = next(t.function for t in tools if t.function.name == tool_choice.function.name)
        return StructuredOutputsParams(json=_parameters(function))
    if tool_choice != "required":
        return None
    calls = [{"type": "object", "additionalProperties": False, "required": ["name", "parameters"],
              "properties": {"name": {"const": t.function.name}, "parameters": _parameters(t.function)}}
             for t in tools]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if parallel_tool_calls is False:
        schema["maxItems"] = 1
    return StructuredOutputsParams(json=schema)


def forced_function_name(tool_choice: ToolChoice | None) -> str | None:
    return tool_choice.function.name if isinstance(tool_choice, NamedToolChoice) else None
