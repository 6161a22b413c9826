"""What a request asks its output to be: vLLM's StructuredOutputsParams, torch-free.

Exactly one constraint per request:

    json            a JSON Schema (dict or its JSON text)
    json_object     any JSON object (OpenAI's response_format {"type": "json_object"})
    regex           a regular expression the whole output matches
    choice          one of a list of strings, verbatim
    grammar         an EBNF grammar (xgrammar's dialect: `root ::= ...`) or a Lark grammar

The request's JSON text is canonicalised here (no spaces; key order kept, since
the output's properties follow the schema's order), so two requests with the
same schema share one compiled grammar (`key`) whatever spacing their clients
used. Everything is checked on
construction (ValueError naming the field): the backend only ever sees a
well-formed, size-bounded constraint.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# A constraint's canonical text is at most this many bytes. Real schemas are a few KiB
# (OpenAI caps a schema at 100 properties and 15,000 characters of names and enums);
# compile time grows with the text (docs/benchmarks.md "Structured outputs"), so a
# megabyte schema is refused before anything compiles it.
MAX_SPEC_BYTES = 128 * 1024
MAX_CHOICES = 1024
KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True, slots=True)
class StructuredOutputsParams:
    json: str | dict[str, Any] | bool | None = None
    regex: str | None = None
    choice: list[str] | tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False   # JSON without whitespace between tokens (vLLM's flag)

    def __post_init__(self) -> None:
        given = [name for name in KINDS if getattr(self, name) not in (None, False)]
        if len(given) != 1:
            raise ValueError("structured_outputs: give exactly one of json, json_object, regex, choice, grammar"
                             + (f" (got {', '.join(given)})" if given else ""))
        if isinstance(self.json, str):
            try:
                schema = json.loads(self.json)
            except json.JSONDecodeError as exc:
                raise ValueError(f"json: the schema is not valid JSON: {exc}") from None
            object.__setattr__(self, "json", schema)
        if self.json is not None and not isinstance(self.json, (dict, bool)):
            raise ValueError(f"json: a JSON Schema is an object, got {type(self.json).__name__}")
        if self.regex is not None and (not isinstance(self.regex, str) or not self.regex):
            raise ValueError("regex: must be a non-empty string")
        if self.grammar is not None and (not isinstance(self.grammar, str) or not self.grammar.strip()):
            raise ValueError("grammar: must be a non-empty string")
        if self.choice is not None:
            if (not isinstance(self.choice, (list, tuple)) or not self.choice or len(self.choice) > MAX_CHOICES
                    or not all(isinstance(c, str) and c for c in self.choice)):
                raise ValueError(f"choice: must be 1 to {MAX_CHOICES} non-empty strings")
            object.__setattr__(self, "choice", tuple(self.choice))
        if self.json_object not in (None, True, False):
            raise ValueError("json_object: must be a boolean")
        size = len(self.text.encode("utf-8", "surrogatepass"))
        if size > MAX_SPEC_BYTES:
            raise ValueError(f"{self.kind}: the constraint is {size} bytes; at most {MAX_SPEC_BYTES} are accepted")

    @property
    def kind(self) -> str:
        return next(name for name in KINDS if getattr(self, name) not in (None, False))

    @property
    def text(self) -> str:
        """The constraint's canonical text (a schema as compact JSON, in its own key order)."""
        kind = self.kind
        if kind == "json":
            return json.dumps(self.json, separators=(",", ":"), ensure_ascii=False)
        if kind == "choice":
            return json.dumps(list(self.choice or ()), ensure_ascii=False)
        if kind == "json_object":
            return ""
        text: str = getattr(self, kind)
        return text

    @property
    def key(self) -> tuple[str, str, bool]:
        """What identifies the compiled grammar: equal keys, one compilation."""
        return (self.kind, self.text, self.disable_any_whitespace)
