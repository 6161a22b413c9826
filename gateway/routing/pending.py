"""Blocks this gateway has sent to an engine that its cache feed has not reported yet.

Between routing a prompt to engine E and E's feed reporting its blocks lie E's
queue, the prefill and the feed's delay; a second session of the same product
arriving then found no holder and paid the prompt again on its own ring owner.
So the picker also counts, per endpoint, the blocks this gateway routed there
("pending") until:
  * the endpoint's feed reports them stored (PrefixIndex.stored clears them),
  * `ttl` seconds pass (a failed, aborted or retried request never reports
    them; a stale entry only draws a request within the load bound),
  * the endpoint leaves the set or restarts (PrefixIndex.drop / reset),
  * or, past `capacity` blocks for one endpoint, the oldest go first.

A pending run draws a request only when it is at least `min_blocks` long (a
short shared head is cheap to prefill twice and would pull every cold first
turn to one engine) and only to an engine with at most `max_load` requests in
this gateway's view (PendingBlocks.counts).

It is per-replica state: replicas fed the same feeds and loads would no longer
choose alike (docs/design.md "Gateway"), so it is on only for a gateway that is
the fleet's one router (`pending_ttl_for`: the operator passes `--pending-ttl 0`
when spec.gateway.replicas > 1). Entries are kept in insertion order with one
TTL, so they also expire in that order and purging is amortised O(1).
Measurements behind each default: docs/benchmarks.md "The pending record".
"""
from __future__ import annotations

import time
from collections import OrderedDict
from typing import Callable, Iterable

# The gate sweeps and the TTL's range: docs/benchmarks.md "The pending record".
# The TTL only bounds a record that is never reported; it must exceed a long prompt's
# prefill plus the feed's delay (a 32k-token prompt: ~3.3 s on an H100).
DEFAULT_PENDING_TTL_S = 10.0
DEFAULT_PENDING_MIN_BLOCKS = 16   # 256 tokens: a shorter run (a chat template) would draw every cold first turn
DEFAULT_PENDING_MAX_LOAD = 1      # only the engine running the request that left the record
# 32,768 x 16 tokens = 512K tokens, what one 80 GB GPU's KV pool holds for an 8B model
# (prefix_index.py): more than an engine can be prefilling at once; ~3 MB per endpoint.
DEFAULT_PENDING_CAPACITY = 32_768


def pending_ttl_for(replicas: int, ttl: float = DEFAULT_PENDING_TTL_S) -> float:
    """The --pending-ttl for a gateway that is one of `replicas` routers: the
    record only where it is the whole fleet's (one router), else off."""
    if replicas < 1:
        raise ValueError(f"gateway replicas must be >= 1, got {replicas}")
    return ttl if replicas == 1 else 0.0


class PendingBlocks:
    def __init__(self, ttl: float = DEFAULT_PENDING_TTL_S, capacity: int = DEFAULT_PENDING_CAPACITY,
                 clock: Callable[[], float] = time.monotonic, min_blocks: int = DEFAULT_PENDING_MIN_BLOCKS,
                 max_load: int = DEFAULT_PENDING_MAX_LOAD):
        if not ttl >= 0:
            raise ValueError(f"pending TTL must be >= 0 seconds (0: off), got {ttl}")
        if capacity <= 0:
            raise ValueError(f"pending capacity must be positive, got {capacity}")
        if min_blocks < 1 or max_load < 0:
            raise ValueError(f"pending min_blocks must be >= 1 and max_load >= 0, got {min_blocks}, {max_load}")
        self.ttl = ttl
        self.capacity = capacity
        self.clock = clock
        self.min_blocks = min_blocks
        self.max_load = max_load
        self._endpoints: dict[str, OrderedDict[bytes, float]] = {}

    @property
    def enabled(self) -> bool:
        return self.ttl > 0

    def counts(self, run: int, load: int | None) -> bool:
        """Whether `run` pending blocks on an endpoint with `load` requests (None:
        not known, no load condition) draw a request."""
        return run >= self.min_blocks and (load is None or load <= self.max_load)

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
        in; keys only), None when it has none (asked for every endpoint of every
        decision: most have none, and then nothing is built)."""
        if endpoint not in self._endpoints:
            return None
        return self._live(endpoint) or None

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
