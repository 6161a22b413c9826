"""JSON Schemas made enforceable: what xgrammar cannot enforce is refused, and what it
enforces too loosely is rewritten into an equivalent it enforces exactly.

A grammar cannot express some of JSON Schema (items unique to each other, a
negation, a condition between properties); xgrammar accepts those schemas and
quietly ignores the keywords, so an output could be "valid by construction" and
still fail a validator. We refuse them (a 400 naming them), as vLLM's xgrammar
backend does for its own list. Where xgrammar's rule is looser than the
keyword, the schema is rewritten before it is compiled (xgrammar 0.2.9):

- a string with minLength/maxLength lets control characters through (JSON
  forbids them raw): it becomes a pattern of the same length over the
  characters JSON strings may hold unescaped;
- format date allows June 31, ipv4 allows leading zeros ("010.1.1.1"), and
  date-time/time inherit the date rule: they become strict patterns (a date
  never takes February 29: always valid, never all valid dates);
- minLength/maxLength beside a pattern or format are ignored by xgrammar: refused;
- an optional group in a pattern, `(x[0-9]+)?`, also matches its tail alone ("81"):
  it is written `(x[0-9]+|)`, which matches the same strings.

And one rewrite that narrows what is generated without leaving the schema: an
integer or number without a bound gets |value| < 10^15 (exact in JavaScript's
doubles; xgrammar then also writes at most 6 fraction digits), because an
unbounded one lets a sampled model write digits until max_tokens runs out.

Both lists come from the validity test (tests/engine/test_structured_validity.py),
which samples many schemas at temperature 1 and validates every output with
`jsonschema` and its format checker: a keyword wrongly left out fails it.
"""
from __future__ import annotations

from typing import Any, Callable

UNSUPPORTED: dict[str, Callable[[Any], bool] | None] = {
    "uniqueItems": lambda v: v is True,
    "contains": None, "minContains": None, "maxContains": None,
    "propertyNames": None, "dependentRequired": None, "dependentSchemas": None, "dependencies": None,
    "not": None, "if": None, "then": None, "else": None,
    "unevaluatedProperties": None, "unevaluatedItems": None,
    "$dynamicRef": None, "$recursiveRef": None,
}
# Formats xgrammar does not implement (a plain string) and validators check.
UNSUPPORTED_FORMATS = ("regex", "idn-email", "idn-hostname", "relative-json-pointer", "iri", "iri-reference",
                       "uri-template")

_DATE = (r"[0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)"
         r"|02-(0[1-9]|1[0-9]|2[0-8]))")
_TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
FORMAT_PATTERNS = {
    "date": f"^{_DATE}$",
    "time": f"^{_TIME}$",
    "date-time": f"^{_DATE}T{_TIME}$",
    "ipv4": rf"^({_OCTET}\.){{3}}{_OCTET}$",
}
# What a JSON string may hold without an escape: no control character, quote or backslash.
_PLAIN_CHAR = r'[^\x00-\x1f"\\]'
NUMBER_LIMIT = 10 ** 15 - 1

# Keywords whose value is a map of subschemas (each value is a schema, the keys are names).
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMAS = ("items", "additionalProperties", "additionalItems")


def fix_optional_groups(pattern: str) -> str:
    """`(...)?` (and lazy `(...)??`) written as the equivalent `(...|)`; escapes and character
    classes are copied as they are."""
    out: list[str] = []
    i, in_class = 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
            if pattern[i + 1:i + 2] == "]":          # a leading ] is a member, not the end
                out.append("[]")
                i += 2
                continue
        elif ch == ")" and pattern[i + 1:i + 2] == "?":
            out.append("|)")
            i += 3 if pattern[i + 2:i + 3] == "?" else 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _is_type(schema: dict, *names: str) -> bool:
    kind = schema.get("type")
    return kind in names or (isinstance(kind, list) and any(n in kind for n in names))


def _bound_number(schema: dict) -> dict:
    if "enum" in schema or "const" in schema:
        return schema
    out = dict(schema)
    if "minimum" not in schema and "exclusiveMinimum" not in schema:
        out["minimum"] = -NUMBER_LIMIT
    if "maximum" not in schema and "exclusiveMaximum" not in schema:
        out["maximum"] = NUMBER_LIMIT
    return out


def _rewrite_string(schema: dict, path: str, problems: list[str]) -> dict:
    fmt = schema.get("format")
    has_length = "minLength" in schema or "maxLength" in schema
    if fmt in UNSUPPORTED_FORMATS:
        problems.append(f"{path}/format ({fmt})")
    if has_length and ("pattern" in schema or fmt is not None):
        problems.append(f"{path}/maxLength (beside a pattern or format)")
        return schema
    if fmt in FORMAT_PATTERNS and "pattern" not in schema:
        schema = {k: v for k, v in schema.items() if k != "format"}
        schema["pattern"] = FORMAT_PATTERNS[fmt]
    elif has_length and "enum" not in schema and "const" not in schema:
        low, high = schema.get("minLength", 0), schema.get("maxLength")
        if isinstance(low, int) and (high is None or isinstance(high, int)):
            schema = {k: v for k, v in schema.items() if k not in ("minLength", "maxLength")}
            schema["pattern"] = f"^{_PLAIN_CHAR}{{{low},{'' if high is None else high}}}$"
    return schema


def enforceable(schema: Any, path: str = "#") -> tuple[Any, list[str]]:
    """(the schema rewritten for xgrammar, JSON pointers of what cannot be enforced)."""
    problems: list[str] = []
    return _walk(schema, path, problems), problems


def _walk(schema: Any, path: str, problems: list[str]) -> Any:
    if not isinstance(schema, dict):
        return schema
    for key, value in schema.items():
        if key in UNSUPPORTED:
            check = UNSUPPORTED[key]
            if check is None or check(value):
                problems.append(f"{path}/{key}")
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            out[key] = {name: _walk(sub, f"{path}/{key}/{name}", problems) for name, sub in schema[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            out[key] = [_walk(sub, f"{path}/{key}/{i}", problems) for i, sub in enumerate(schema[key])]
    for key in _SCHEMAS:
        if key in schema:
            out[key] = _walk(schema[key], f"{path}/{key}", problems)
    if _is_type(out, "string"):
        out = _rewrite_string(out, path, problems)
    if _is_type(out, "integer", "number"):
        out = _bound_number(out)
    if isinstance(out.get("pattern"), str):
        out["pattern"] = fix_optional_groups(out["pattern"])
    return out
