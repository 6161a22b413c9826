"""ConstraintCheck: a constraint is parsed once; a bad one is a 400 every time, never remembered."""
from __future__ import annotations

import pytest

from pagedkube.engine.server import constraints
from pagedkube.engine.server.errors import APIError
from pagedkube.engine.structured import grammars
from pagedkube.engine.structured.params import StructuredOutputsParams as Structured


def test_a_constraint_that_parsed_is_not_parsed_again(monkeypatch):
    parsed = []
    real = grammars.parse
    monkeypatch.setattr(grammars, "parse", lambda p: parsed.append(p.key) or real(p))
    check = constraints.ConstraintCheck(capacity=2)
    for _ in range(3):
        check.check(Structured(regex="[a-z]+"), "guided_regex")
    assert len(parsed) == 1
    for pattern in ("a", "b", "[a-z]+"):          # capacity 2: "[a-z]+" was evicted
        check.check(Structured(regex=pattern), "guided_regex")
    assert len(parsed) == 4
    for _ in range(2):
        with pytest.raises(APIError) as err:
            check.check(Structured(regex="(x"), "guided_regex")
        assert err.value.status_code == 400 and err.value.param == "guided_regex"
    assert len(parsed) == 6
