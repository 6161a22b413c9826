"""Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, 2018).

With total load L over n endpoints and one more request arriving, every
endpoint's capacity is max(ceil(c * (L + 1) / n), floor); an endpoint may take
the request if its load + 1 fits. For c >= 1 the least-loaded endpoint always
fits (its load <= floor(L / n) < ceil((L + 1) / n)), so a walk never comes back
empty.

The floor is ours, not the paper's: below it an engine always takes one more,
because batching one more decode costs it far less than the prefill of moving a
session elsewhere. Why c = 1.5 and floor = 8 (sweeps of c 1.25-2.0 and floor
4-16): docs/design.md "Defaults", measured in docs/benchmarks.md "The floor and
the cold-start key" and "Routing (CPU)".
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

DEFAULT_LOAD_BOUND = 1.5
DEFAULT_LOAD_FLOOR = 8   # requests an engine always takes (docs/design.md "Defaults")


class BoundedLoad:
    def __init__(self, c: float = DEFAULT_LOAD_BOUND, floor: int = DEFAULT_LOAD_FLOOR):
        if not c >= 1.0:
            raise ValueError(f"load bound must be >= 1.0, got {c}")
        if isinstance(floor, bool) or not isinstance(floor, int) or floor < 0:
            raise ValueError(f"load floor must be an integer >= 0, got {floor!r}")
        self.c = c
        self.floor = floor

    def capacity(self, loads: Mapping[str, int], endpoints: Sequence[str]) -> int:
        if not endpoints:
            return 0
        total = sum(max(0, loads.get(e, 0)) for e in endpoints)
        return max(math.ceil(self.c * (total + 1) / len(endpoints)), self.floor)

    def within(self, endpoint: str, loads: Mapping[str, int], capacity: int) -> bool:
        return max(0, loads.get(endpoint, 0)) + 1 <= capacity

    def first_within(self, order: Sequence[str], loads: Mapping[str, int], endpoints: Sequence[str]) -> str:
        """The first endpoint of `order` that may take one more request."""
        capacity = self.capacity(loads, endpoints)
        for endpoint in order:
            if self.within(endpoint, loads, capacity):
                return endpoint
        # Unreachable for c >= 1 when `order` covers `endpoints`; keep serving anyway.
        return min(order, key=lambda e: (loads.get(e, 0), order.index(e)))
