"""Text that is not Unicode: where a JSON body holds a lone UTF-16 surrogate.

`"\\ud800"` is valid JSON (RFC 8259 allows any \\uXXXX escape) but names no character:
Python's json decodes it to a str holding the surrogate code point, which the
tokenizers library refuses (`TypeError: TextInputSequence must be str`) and UTF-8
cannot encode (`UnicodeEncodeError`), both 500s before this check. A surrogate *pair*
(`"\\ud83d\\udc36"`, how an ASCII-only JSON encoder writes an emoji) decodes to one
real character and is fine.

Both servers answer 400 naming the field instead of replacing the surrogate with
U+FFFD as some decoders do: a prompt silently changed is worse than one refused,
and a client that sends it has a bug worth seeing. The check runs on the decoded
body, and only when the raw bytes hold a surrogate escape at all, so ordinary
bodies pay one byte search.
"""
from __future__ import annotations

import re
from typing import Any

_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")    # \uD800-\uDFFF, either case
_SURROGATE = re.compile("[\ud800-\udfff]")

MESSAGE = "the text is not valid Unicode: it holds a lone UTF-16 surrogate (a \\uD800-\\uDFFF escape without its pair)"

Loc = tuple["str | int", ...]


def lone_surrogate(raw: bytes, value: Any) -> Loc | None:
    """Where in `value` (the JSON object decoded from `raw`) the first string holding a
    lone surrogate is, as a path of keys and indexes; None when there is none."""
    if not _ESCAPE.search(raw):
        return None
    return _find(value, ())


def _find(value: Any, loc: Loc) -> Loc | None:
    """Depth-first, in document order, without recursion (a body may nest as deep as the
    JSON parser allowed, which is as deep as Python's own stack)."""
    stack: list[tuple[Any, Loc]] = [(value, loc)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return where
        elif isinstance(item, dict):
            if any(_SURROGATE.search(key) for key in item):
                return where   # a key nobody can name: the object that holds it
            stack.extend(reversed([(v, (*where, k)) for k, v in item.items()]))
        elif isinstance(item, list):
            stack.extend(reversed([(v, (*where, i)) for i, v in enumerate(item)]))
    return None


def field_path(loc: Loc) -> str:
    """("messages", 0, "content") -> "messages[0].content", the engine's spelling of a field."""
    parts: list[str] = []
    for item in loc:
        parts.append(f"[{item}]" if isinstance(item, int) else ("." if parts else "") + item)
    return "".join(parts) or "body"
