"""Baseline pickers: round-robin and least-load (what bench/routing.py compares against)."""
from __future__ import annotations

from typing import Mapping, Sequence

from pagedkube.gateway.routing.ring import RingCache
from pagedkube.gateway.routing.types import LEAST_LOAD, ROUND_ROBIN, Decision, RoutingInput


class RoundRobinPicker:
    """Cycles through the sorted endpoint list. Its counter is per-replica
    state, which is acceptable only because round-robin ignores caches anyway."""

    def __init__(self) -> None:
        self._next = 0

    def pick(self, request: RoutingInput, endpoints: Sequence[str], loads: Mapping[str, int]) -> Decision:
        assert endpoints, "pick() needs at least one endpoint"
        ordered = sorted(endpoints)
        i = self._next % len(ordered)
        self._next += 1
        return Decision(endpoints=tuple(ordered[i:] + ordered[:i]), reason=ROUND_ROBIN, loads=dict(loads))


class LeastLoadPicker:
    """The least-loaded endpoint; ties broken by the ring walk for the request's
    key, so equal loads still spread requests and replicas agree."""

    def __init__(self, rings: RingCache):
        self.rings = rings

    def pick(self, request: RoutingInput, endpoints: Sequence[str], loads: Mapping[str, int]) -> Decision:
        assert endpoints, "pick() needs at least one endpoint"
        walk = self.rings.get(endpoints).walk(request.ring_key)
        rank = {e: i for i, e in enumerate(walk)}
        order = tuple(sorted(walk, key=lambda e: (loads.get(e, 0), rank[e])))
        return Decision(endpoints=order, reason=LEAST_LOAD, loads=dict(loads))
