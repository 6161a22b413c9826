"""Does a live child still match what the operator would apply? (pure)

Re-applying an unchanged object is a no-op for the API server, but each
apply is still a request, and the operator hears about every child change,
so it first checks:

  1. the live object carries the hash of the desired object in an annotation
     (catches fields the operator stopped setting: server-side apply removes
     them only when it applies again), and
  2. every field the operator sets has the same value live (catches
     someone's `kubectl edit`; fields others add, like defaults or status,
     are ignored).
"""
from __future__ import annotations

import copy
import hashlib
import json
from typing import Any, Mapping

from pagedkube.operator.naming import HASH_ANNOTATION


def applied_hash(obj: dict[str, Any]) -> str:
    canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def with_hash(obj: dict[str, Any]) -> dict[str, Any]:
    """A copy of obj annotated with its own hash (computed without the annotation)."""
    out = copy.deepcopy(obj)
    out["metadata"].setdefault("annotations", {})[HASH_ANNOTATION] = applied_hash(obj)
    return out


def is_subset(desired: Any, live: Any) -> bool:
    """Every key/value of desired is in live; lists must match element by element."""
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(k in live and is_subset(v, live[k]) for k, v in desired.items())
    if isinstance(desired, list):
        return (isinstance(live, list) and len(desired) == len(live)
                and all(is_subset(d, l) for d, l in zip(desired, live)))
    if isinstance(desired, (int, float)) and not isinstance(desired, bool) and isinstance(live, str):
        return str(desired) == live  # the API server writes quantities back as strings
    return desired == live


def needs_apply(desired: Mapping[str, Any], live: Mapping[str, Any] | None) -> bool:
    """desired as returned by with_hash()."""
    return live is None or not is_subset(desired, live)
