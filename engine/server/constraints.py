"""A request's structured-output fields -> one StructuredOutputsParams, checked.

    response_format {"type": "json_object"}               -> json_object
    response_format {"type": "json_schema",
                     "json_schema": {"name", "schema"}}     -> json (the schema)
    structured_outputs {json | regex | choice | grammar | json_object}   (vLLM)
    guided_json | guided_regex | guided_choice | guided_grammar          (vLLM's older names)
    tool_choice "required" | {"type": "function", ...}     -> json (tools.py)

At most one of them may constrain a request. `ConstraintCheck.check` parses the constraint
(engine/structured/grammars.py parse: schema, regex, EBNF or Lark) so that
everything malformed or unsupported is a 400 naming the field here, before the
engine sees it (`ConstraintCheck`); compiling it for the tokenizer happens in the engine.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from pagedkube.engine.server.errors import APIError, bad_request
from pagedkube.engine.server.protocol import ChatCompletionRequest, CompletionRequest, StructuredOutputsBody
from pagedkube.engine.server.tools import forced_tool_constraint
from pagedkube.engine.structured.params import StructuredOutputsParams


def _from_response_format(req: CompletionRequest | ChatCompletionRequest) -> StructuredOutputsParams | None:
    fmt = req.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return StructuredOutputsParams(json_object=True)
    if fmt.json_schema is None or fmt.json_schema.json_schema is None:
        raise ValueError("response_format: type json_schema needs json_schema.schema")
    return StructuredOutputsParams(json=fmt.json_schema.json_schema)


def _from_structured_outputs(body: StructuredOutputsBody) -> StructuredOutputsParams:
    if body.structural_tag is not None:
        raise ValueError("structural_tag is not supported by this server")
    return StructuredOutputsParams(json=body.json_schema, regex=body.regex, choice=body.choice, grammar=body.grammar,
                                   json_object=body.json_object or None,
                                   disable_any_whitespace=body.disable_any_whitespace)


def _sources(req: CompletionRequest | ChatCompletionRequest) -> list[tuple[str, Any]]:
    """(field, how to build its constraint) for every field the request set."""
    sources: list[tuple[str, Any]] = []
    if req.response_format is not None and req.response_format.type != "text":
        sources.append(("response_format", lambda: _from_response_format(req)))
    if req.structured_outputs is not None:
        sources.append(("structured_outputs", lambda: _from_structured_outputs(req.structured_outputs)))
    guided = {"guided_json": lambda v: StructuredOutputsParams(json=v),
              "guided_regex": lambda v: StructuredOutputsParams(regex=v),
              "guided_choice": lambda v: StructuredOutputsParams(choice=v),
              "guided_grammar": lambda v: StructuredOutputsParams(grammar=v)}
    for name, make in guided.items():
        value = getattr(req, name)
        if value is not None:
            sources.append((name, lambda make=make, value=value: make(value)))
    if isinstance(req, ChatCompletionRequest) and req.tools:
        choice, tools = req.effective_tool_choice, req.tool_definitions or []
        if choice not in ("none", "auto"):
            sources.append(("tool_choice", lambda: forced_tool_constraint(tools, choice, req.parallel_tool_calls)))
    return sources


def request_constraint(req: CompletionRequest | ChatCompletionRequest) \
        -> tuple[StructuredOutputsParams | None, str | None]:
    """(the request's constraint, the field it came from), or (None, None); a 400 naming the
    field when it is malformed or when two fields constrain the output."""
    sources = _sources(req)
    if not sources:
        return None, None
    if len(sources) > 1:
        names = ", ".join(name for name, _ in sources)
        raise bad_request(f"only one of these may constrain the output, got {names}", sources[1][0])
    field, make = sources[0]
    try:
        return make(), field
    except ValueError as exc:
        raise bad_request(f"{field}: {exc}", field) from None


class ConstraintCheck:
    """Parses each constraint (tokenizer-free) before it reaches the engine: a 400 naming the
    field if it cannot be honoured. Constraints that parsed are remembered (an LRU of their keys),
    because clients repeat the same schema and parsing a form-sized one costs ~4 ms of the event
    loop. Thread-safe: a huge request is prepared in a worker thread."""

    def __init__(self, capacity: int = 1024):
        self.capacity = capacity
        self._accepted: OrderedDict[tuple, None] = OrderedDict()
        self._lock = threading.Lock()

    def check(self, params: StructuredOutputsParams, field: str) -> None:
        from pagedkube.engine.structured.grammars import parse

        key = params.key
        with self._lock:
            if key in self._accepted:
                self._accepted.move_to_end(key)
                return
        try:
            parse(params)
        except ValueError as exc:
            raise bad_request(f"{field}: {exc}", field) from None
        with self._lock:
            self._accepted[key] = None
            while len(self._accepted) > self.capacity:
                self._accepted.popitem(last=False)


def with_field(error: APIError, field: str | None) -> APIError:
    """An engine-side 400 of a constrained request (its grammar failed to compile), naming the field."""
    if error.status_code == 400 and field is not None and error.param is None:
        return APIError(400, f"{field}: {error.message}", param=field, code=error.code)
    return error
