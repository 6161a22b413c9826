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

Two conditions keep the record from concentrating load (PendingBlocks.counts):
a pending run draws a request only when it is at least `min_blocks` long (a
short shared head, such as a chat template and a one-line system prompt, is
cheap to prefill twice and would otherwise pull every cold first turn to one
engine), and only to an engine with at most `max_load` requests in this
gateway's view, the one that left the record (behind a busy engine the second
session would queue, and at high load spreading a product's first sessions
over their own ring owners pays later, when the bound moves sessions off the
product's holders).

It is per-replica state, like the in-flight half of the load: each replica
knows only what it routed itself, so replicas fed the same feeds and loads
would no longer choose alike (DESIGN.md §6). So it is on only for a gateway
that is the fleet's one router, whose record is then complete
(`pending_ttl_for`: the operator passes `--pending-ttl 0` when
spec.gateway.replicas > 1, and so must anyone running several gateway
replicas by hand). Entries are kept in insertion order with one TTL, so they
also expire in that order and purging is amortised O(1).
"""
from __future__ import annotations

import time
from collections import OrderedDict
from typing import Callable, Iterable

# On (a gateway alone in front of its engines). Measured with bench/simulate.py
# (docs/benchmarks.md "The pending record"): with one router it closes the one
# cell of issue 17's grid the stateless rule lost to cache_aware (16 engines,
# low load: 0.9547 -> 0.9584 on seed 0; +0.0021 on average over seeds 0-11 and
# never below), moves high load by -0.0009 on average (within the seeds'
# spread; ungated it lost 0.15-1.0 points), and leaves the four-engine
# calibration workload as it was (ungated: -3.3 points). The TTL only bounds
# how long the record of a prompt that is never reported (a failed or aborted
# request) lives: it must exceed the time a prompt normally takes to be
# reported (on the simulator's H100 profile, 10k prefill tokens/s, a
# 32k-token prompt prefills in ~3.3 s; the feed adds <= --feed-interval);
# 0.25 s and 10 s gave the same grid at low load, 0.05 s is too short for a
# 2,000-token prompt.
DEFAULT_PENDING_TTL_S = 10.0
# A pending run shorter than this draws nothing: 16 blocks = 256 tokens. On the
# calibration workload (bench/routing.py's chat template and short system
# prompts) 4 blocks drew every cold first turn to one engine (-2.2 points);
# 8 to 64 blocks gave the same grid and calibration (docs/benchmarks.md).
DEFAULT_PENDING_MIN_BLOCKS = 16
# Only an engine with at most this many requests (in-flight from this gateway
# plus its scraped queue) is drawn: the one running the request that left the
# record. At high load (seeds 0-3) 2 and 3 lost 0.30 and 0.27 points on
# average where 1 lost 0.03.
DEFAULT_PENDING_MAX_LOAD = 1
# Blocks pending per endpoint: 32,768 x 16 tokens = 512K tokens, about what
# one 80 GB GPU's KV pool holds for an 8B model (prefix_index.py), so more than
# an engine can be prefilling at once. ~100 bytes an entry: ~3 MB per endpoint.
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
