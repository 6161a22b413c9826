"""JSON Schemas made enforceable (engine/structured/json_schema.py): what is refused, and the
rewrites that make xgrammar enforce a schema exactly. Each rewrite is checked against the
library's own matcher on the string that slipped through before it."""
from __future__ import annotations

import json
import re

import pytest
import xgrammar as xgr

from pagedkube.engine.structured.grammars import GrammarCompiler, parse
from pagedkube.engine.structured.json_schema import FORMAT_PATTERNS, NUMBER_LIMIT, enforceable, fix_optional_groups
from pagedkube.engine.structured.params import StructuredOutputsParams as Structured
from pagedkube.builtin import builtin_model_dir


@pytest.fixture(scope="module")
def compiler():
    tokenizer = (builtin_model_dir("tiny") / "tokenizer.json").read_text()
    return GrammarCompiler(tokenizer, 1980, [2])


def accepts(compiler, schema, text: str) -> bool:
    matcher = xgr.GrammarMatcher(compiler.compile(Structured(json=schema)).result())
    return matcher.accept_string(text) and matcher.accept_token(2)   # the whole text, then EOS


@pytest.mark.parametrize("schema, where", [
    ({"type": "array", "uniqueItems": True}, "#/uniqueItems"),
    ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, "#/properties/a/not"),
    ({"anyOf": [{"type": "object", "propertyNames": {"pattern": "^a"}}]}, "#/anyOf/0/propertyNames"),
    ({"type": "object", "dependentRequired": {"a": ["b"]}}, "#/dependentRequired"),
    ({"type": "string", "format": "regex"}, "#/format (regex)"),
    ({"type": "string", "pattern": "^a+$", "maxLength": 3}, "#/maxLength (beside a pattern or format)"),
    ({"$defs": {"x": {"if": {"type": "integer"}}}, "$ref": "#/$defs/x"}, "#/$defs/x/if"),
])
def test_what_a_grammar_cannot_enforce_is_refused_by_name(schema, where):
    assert where in enforceable(schema)[1]
    with pytest.raises(ValueError, match=re.escape(where)):
        parse(Structured(json=schema))


def test_length_bounded_strings_admit_no_raw_control_characters(compiler):
    schema = {"type": "string", "maxLength": 10}
    assert enforceable(schema)[0] == {"type": "string", "pattern": '^[^\\x00-\\x1f"\\\\]{0,10}$'}
    assert accepts(compiler, schema, '"leave it."')
    assert not accepts(compiler, schema, '"leave it.\x0c"')     # what xgrammar 0.2.9 let through
    assert not accepts(compiler, schema, '"' + "a" * 11 + '"')


@pytest.mark.parametrize("fmt, good, bad", [
    ("date", "2026-06-30", "2026-06-31"), ("date", "2026-02-28", "2026-02-30"),
    ("ipv4", "10.0.0.1", "10.0.0.010"), ("date-time", "2026-12-02T10:00:00Z", "2026-04-31T10:00:00Z"),
    ("time", "23:59:59.5+01:00", "24:00:00Z"),
])
def test_loose_formats_become_exact_patterns(compiler, fmt, good, bad):
    schema = {"type": "string", "format": fmt}
    assert enforceable(schema)[0]["pattern"] == fix_optional_groups(FORMAT_PATTERNS[fmt])
    assert accepts(compiler, schema, json.dumps(good))
    assert not accepts(compiler, schema, json.dumps(bad))


@pytest.mark.parametrize("pattern, fixed", [
    (r"^a(x[0-9]+)?b$", r"^a(x[0-9]+|)b$"),
    (r"^a(?:x(y)?)??b\)?[)?]$", r"^a(?:x(y|)|)b\)?[)?]$"),
    (r"^(\+?)?[]?)]?x$", r"^(\+?|)[]?)]?x$"),
    (r"^[a-z]+(-[a-z]+)*$", r"^[a-z]+(-[a-z]+)*$"),
])
def test_optional_groups_are_rewritten_to_an_equivalent(pattern, fixed):
    assert fix_optional_groups(pattern) == fixed
    for text in ["ab", "axb", "ax12b", "a12b", "x", "+x", "?x", "abc-def"]:
        assert bool(re.search(pattern, text)) == bool(re.search(fixed, text)), text


def test_an_optional_group_no_longer_matches_its_tail_alone(compiler):
    schema = {"type": "string", "pattern": r"^[0-9]{1,3}(\.[0-9]{1,2})?( kg)?$"}
    assert accepts(compiler, schema, '"12.5 kg"') and accepts(compiler, schema, '"7"')
    assert not accepts(compiler, schema, '"1255"')               # "12" + "55" without the dot


def test_unbounded_numbers_get_bounds_that_keep_them_valid(compiler):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "x": {"type": ["number", "null"]},
                                               "k": {"type": "integer", "minimum": 3},
                                               "e": {"type": "integer", "enum": [1, 2]}}}
    props = enforceable(schema)[0]["properties"]
    assert props["n"] == {"type": "integer", "minimum": -NUMBER_LIMIT, "maximum": NUMBER_LIMIT}
    assert props["x"]["maximum"] == NUMBER_LIMIT and props["k"] == {"type": "integer", "minimum": 3,
                                                                    "maximum": NUMBER_LIMIT}
    assert props["e"] == {"type": "integer", "enum": [1, 2]}
    assert accepts(compiler, {"type": "integer"}, str(NUMBER_LIMIT))
    assert not accepts(compiler, {"type": "integer"}, str(NUMBER_LIMIT + 1))
