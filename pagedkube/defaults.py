"""`default_of(Config, "field")`: a config dataclass field's default, for the
CLI flags that offer the same setting. A flag default written again as a literal
beside the dataclass drifts from it; reading it here keeps one source.
(A slots dataclass hides its defaults from the class, hence dataclasses.fields.)
"""
from __future__ import annotations

import dataclasses
from typing import Any


def default_of(cls: type, name: str) -> Any:
    """The default of dataclass `cls`'s field `name`; ValueError when it has none."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
            raise ValueError(f"{cls.__name__}.{name} has no default")
    raise ValueError(f"{cls.__name__} has no field {name!r}")
