"""Blocks this gateway has sent to an engine that its cache feed has not reported yet.

Between the moment the gateway routes a prompt to engine E and the moment E's
feed reports the prompt's blocks as stored lie E's queue, the prefill and the
feed's delay (100-200 ms for a 2,000-token product prompt on the simulator's
H100 profile, seconds on a busy CPU engine). A second session of the same
product arriving in that window found no holder and went to its own ring
owner, which paid the prompt again: the one cell of issue 17's grid where
vLLM's `cache_aware` (whose tree records a prompt when it routes it) won
(docs/benchmarks.md "Simulator: routing at fleet scale").

So the picker also counts, per endpoint, the blocks this gateway routed there
("pending") until:
  * the endpoint's feed reports them stored (PrefixIndex.stored clears them:
    from then on the feed speaks for them),
  * `ttl` seconds pass (a request that failed, was aborted or retried elsewhere
    never reports them; a stale entry only draws a request to where it would
    pay the same cold prefill anyway, within the load bound),
  * the endpoint leaves the set or restarts (PrefixIndex.drop / reset),
  * or, past `capacity` blocks for one endpoint, the oldest go first.

Off unless `--pending-ttl` is set: the simulator found it a net loss
(DEFAULT_PENDING_TTL_S below). It is per-replica state, like the in-flight
half of the load: each replica knows only what it routed itself (replicas
still share nothing, and so no longer choose alike on identical feeds and
loads). Entries are kept in insertion order with one TTL, so they also expire
in that order and purging is amortised O(1).
"""
from __future__ import annotations

import time
from collections import OrderedDict
from typing import Callable, Iterable

# Off by default (0). Measured with bench/simulate.py (docs/benchmarks.md
# "Simulator: routing at fleet scale", "The pending record"): it closes issue
# 17's one open cell (16 engines, low load, one router: 0.955 -> 0.958, equal
# to cache_aware) but loses 0.15-1.0 points at high load, 3.3 points on the
# four-engine calibration workload, and makes replicas with identical feeds and
# loads disagree (4.5-5% of decisions), because each replica knows only what it
# routed itself.
DEFAULT_PENDING_TTL_S = 0.0
# What to give --pending-ttl to turn it on: above the time a prompt normally
# takes to be reported (on the simulator's H100 profile, 10k prefill tokens/s,
# a 32k-token prompt prefills in ~3.3 s; the feed adds <= --feed-interval).
# Longer only keeps stale entries (failed requests) a little longer; shorter
# loses the record under queueing (0.25 s and 10 s gave the same grid at low load).
SUGGESTED_PENDING_TTL_S = 10.0
# Blocks pending per endpoint: 32,768 x 16 tokens = 512K tokens, about what
# one 80 GB GPU's KV pool holds for an 8B model (prefix_index.py), so more than
# an engine can be prefilling at once. ~100 bytes an entry: ~3 MB per endpoint.
DEFAULT_PENDING_CAPACITY = 32_768


class PendingBlocks:
    def __init__(self, ttl: float = DEFAULT_PENDING_TTL_S, capacity: int = DEFAULT_PENDING_CAPACITY,
                 clock: Callable[[], float] = time.monotonic):
        if not ttl >= 0:
            raise ValueError(f"pending TTL must be >= 0 seconds (0: off), got {ttl}")
        if capacity <= 0:
            raise ValueError(f"pending capacity must be positive, got {capacity}")
        self.ttl = ttl
        self.capacity = capacity
        self.clock = clock
        self._endpoints: dict[str, OrderedDict[bytes, float]] = {}

    @property
    def enabled(self) -> bool:
        return self.ttl > 0

    def __len__(self) -> int:
        return sum(len(self._live(e)) for e in list(self._endpoints))

    def add(self, endpoint: str, hashes: Iterable[bytes]) -> None:
        """Record `hashes` as pending on `endpoint` for `ttl` seconds from now."""
        if not self.enabled:
            return
        expires = self.clock() + self.ttl
        entry = self._endpoints.setdefault(endpoint, OrderedDict())
        for h in hashes:
            entry[h] = expires
            entry.move_to_end(h)
        while len(entry) > self.capacity:
            entry.popitem(last=False)

    def clear(self, endpoint: str, hashes: Iterable[bytes]) -> None:
        """The endpoint's feed reported `hashes`: they are no longer pending."""
        entry = self._endpoints.get(endpoint)
        if entry:
            for h in hashes:
                entry.pop(h, None)

    def drop(self, endpoint: str) -> None:
        self._endpoints.pop(endpoint, None)

    def live(self, endpoint: str) -> OrderedDict[bytes, float] | None:
        """The endpoint's unexpired pending hashes (a container to test membership
        in; keys only), None when it has none."""
        entry = self._live(endpoint)
        return entry or None

    def _live(self, endpoint: str) -> OrderedDict[bytes, float]:
        entry = self._endpoints.get(endpoint)
        if entry is None:
            return OrderedDict()
        now = self.clock()
        while entry and next(iter(entry.values())) <= now:
            entry.popitem(last=False)
        if not entry:
            del self._endpoints[endpoint]
        return entry
