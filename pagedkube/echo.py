"""echo(text): a client-supplied string as an error message may repeat it.

Error messages name what the client sent (`The model `x` does not exist.`), but
the client chooses its length and its code points: a 1 MB model name came back
whole in the 404, and a lone UTF-16 surrogate (`"\\ud800"` is valid JSON) cannot be
encoded as UTF-8, so repeating it failed the answer itself with a 500. The engine
and the gateway both build such messages through this one function.
"""
from __future__ import annotations

# Longer than any real model name (Hub ids are at most 96 characters; served names are
# chosen by operators), short enough that an echo costs nothing.
MAX_ECHO_CHARS = 256


def echo(text: str, limit: int = MAX_ECHO_CHARS) -> str:
    """`text` cut to `limit` characters (with a note of how many were left out), lone
    surrogates written as `\\udXXX` escapes: always encodable as UTF-8."""
    shown = text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"
    return shown.encode("utf-8", "backslashreplace").decode("utf-8")
