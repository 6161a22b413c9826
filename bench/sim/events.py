"""The event loop: callbacks ordered by (time, insertion order), so a run is a
pure function of its inputs and seed (no wall clock, no hash-order effects)."""
from __future__ import annotations

import heapq
import math
from typing import Any, Callable


class EventLoop:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., Any], tuple]] = []
        self._seq = 0
        self.num_events = 0

    def at(self, t: float, fn: Callable[..., Any], *args: Any) -> None:
        if t < self.now:
            raise ValueError(f"event at {t} is in the past (now {self.now})")
        heapq.heappush(self._heap, (t, self._seq, fn, args))
        self._seq += 1

    def after(self, dt: float, fn: Callable[..., Any], *args: Any) -> None:
        self.at(self.now + dt, fn, *args)

    def run(self, until: float = math.inf) -> None:
        heap = self._heap
        while heap and heap[0][0] <= until:
            t, _, fn, args = heapq.heappop(heap)
            self.now = t
            self.num_events += 1
            fn(*args)
        if until != math.inf:
            self.now = max(self.now, until)
