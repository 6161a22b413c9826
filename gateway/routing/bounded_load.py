"""Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, 2018).

With total load L over n endpoints and one more request arriving, every
endpoint's capacity is ceil(c * (L + 1) / n); an endpoint may take the request
if its load + 1 fits. For c >= 1 the least-loaded endpoint always fits
(its load <= floor(L / n) < ceil((L + 1) / n)), so a walk never comes back empty.
c = 1.25 is the paper's and Vimeo's/HAProxy's usual setting: no endpoint gets
more than 25% above the mean, while most keys keep their ring owner.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

DEFAULT_LOAD_BOUND = 1.25


class BoundedLoad:
    def __init__(self, c: float = DEFAULT_LOAD_BOUND):
        if not c >= 1.0:
            raise ValueError(f"load bound must be >= 1.0, got {c}")
        self.c = c

    def capacity(self, loads: Mapping[str, int], endpoints: Sequence[str]) -> int:
        if not endpoints:
            return 0
        total = sum(max(0, loads.get(e, 0)) for e in endpoints)
        return math.ceil(self.c * (total + 1) / len(endpoints))

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
