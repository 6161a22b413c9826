"""pagedkube/echo.py: what an error message may repeat of a client's string."""
from pagedkube.echo import MAX_ECHO_CHARS, echo


def test_short_text_is_unchanged():
    assert echo("qwen2.5-0.5b-instruct") == "qwen2.5-0.5b-instruct"
    assert echo("x" * MAX_ECHO_CHARS) == "x" * MAX_ECHO_CHARS


def test_long_text_is_cut_with_a_count():
    assert echo("abcdef", limit=2) == "ab... (4 more characters)"
    assert len(echo("m" * (1 << 20))) == MAX_ECHO_CHARS + len("... (1048320 more characters)")


def test_lone_surrogates_become_escapes_that_encode():
    shown = echo("a\ud800b\udfff")
    assert shown == "a\\ud800b\\udfff" and shown.encode("utf-8")
    assert echo("déjà vu 🐶") == "déjà vu 🐶"   # real characters stay
