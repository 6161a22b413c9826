"""Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, 2018).

With total load L over n endpoints and one more request arriving, every
endpoint's capacity is max(ceil(c * (L + 1) / n), floor); an endpoint may take
the request if its load + 1 fits. For c >= 1 the least-loaded endpoint always
fits (its load <= floor(L / n) < ceil((L + 1) / n)), so a walk never comes back
empty.

The floor is ours, not the paper's: below it an engine always takes one more.
At low load ceil(c (L + 1) / n) is 1 or 2, so the bound moved a session off its
engine because one other session's request was running there, and the move
re-prefills the session's whole history elsewhere, while batching one more
decode costs an engine almost nothing. The fleet simulator (bench/simulate.py,
docs/benchmarks.md "Simulator: routing at fleet scale") measured it: at 16 engines and low load the
moves cost 3 points of hit rate with no floor; a floor of 4 removed most of them.
The floor is 8 since a second sweep (4-16) traced the last low-load moves: with
any-prefix affinity every session of a product goes to the engines holding its
prompt, so at low load one engine holds a product's ~7 live sessions, and a
floor of 4 moved the 5th elsewhere at the price of a cold product prompt. On
the simulator's H100 profile 8 decoding sequences add 0.8 ms to a 10 ms step;
one such move costs 100-200 ms of prefill. 8 raised every cell of issue 17's
grid (16 engines, low/high load, 1/2 routers: 0.952/0.948/0.915/0.915 ->
0.955/0.955/0.923/0.917) and the four-engine calibration workload (0.818 ->
0.835, mean of 3 seeds), with max/mean over the run at high load 1.54 / 1.45;
12 and 16 broke the bound (1.8-2.3) and 6 helped less.
c = 1.25 is the paper's and Vimeo's/HAProxy's usual setting. Ours is 1.5
(DESIGN.md §6): with chat sessions that keep an engine busy most of the time,
1.25 moved 12-18% of turns off their engine at 8 sessions per engine and each
move costs the session's whole history; 1.5 with the head-only affinity rule
kept 93-95% of the ideal hit rate on four real engines (docs/benchmarks.md
"Routing"), and the fleet simulator (bench/simulate.py) sweeps it at scale.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

DEFAULT_LOAD_BOUND = 1.5
DEFAULT_LOAD_FLOOR = 8   # requests an engine always takes (the simulator's sweeps, docstring above)


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
