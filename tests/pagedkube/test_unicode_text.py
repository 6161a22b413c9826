"""pagedkube/unicode_text.py: finding a lone surrogate in a decoded JSON body."""
import json

from pagedkube.unicode_text import field_path, lone_surrogate


def find(raw: bytes):
    return lone_surrogate(raw, json.loads(raw))


def test_lone_surrogates_are_found_where_they_are():
    assert find(rb'{"prompt": "a\ud800"}') == ("prompt",)
    assert find(rb'{"messages": [{"role": "user", "content": "ok"}, {"content": "\uDFFF"}]}') == ("messages", 1, "content")
    assert find(rb'{"prompt": ["fine", ["deep", "\udc00x"]]}') == ("prompt", 1, 1)
    assert find(rb'{"logit_bias": {"\ud800": 1}}') == ("logit_bias",)
    assert find(rb'{"a": "\ud800", "b": "\ud801"}') == ("a",)   # the first, in document order


def test_pairs_and_plain_text_pass():
    assert find(rb'{"prompt": "\ud83d\udc36 dog"}') is None   # an emoji written ASCII-only
    assert find('{"prompt": "🐶 déjà"}'.encode()) is None
    assert find(rb'{"prompt": "\\ud800"}') is None            # an escaped backslash: the text "\ud800", no surrogate


def test_deep_nesting_does_not_recurse():
    depth = 900
    raw = b'{"prompt": ' + b"[" * depth + rb'"\ud800"' + b"]" * depth + b"}"
    assert find(raw) == ("prompt", *[0] * depth)


def test_field_path_spells_fields_as_the_engine_does():
    assert field_path(("messages", 0, "content")) == "messages[0].content"
    assert field_path(("prompt",)) == "prompt" and field_path(()) == "body"
