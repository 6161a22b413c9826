"""Which block hashes each endpoint's prefix cache holds, from its cache feed.

Bounded (docs/design.md, pitfall "Unbounded routing indexes"): each endpoint keeps at most
`capacity` hashes in an LRU; a `stored` event refreshes a hash, the oldest falls
out first. The engine's own pool is bounded and it reports `removed` hashes, so
the cap only bites if removal events are lost. A `reset` snapshot or a new
engine_id (the engine restarted behind the same address) replaces an endpoint's
set wholesale.

Hashes are kept as raw 32-byte digests (half the memory of hex strings).

It also holds this gateway's pending record (pending.py): blocks it routed to
an endpoint that the endpoint's feed has not reported yet. `routed` adds them,
a `stored` event clears them, `drop` and a restart forget them, and
`match_depths` counts a pending run like held blocks where the record's
conditions allow it (pending.py).
"""
from __future__ import annotations

import time
from collections import OrderedDict
from itertools import islice, takewhile
from typing import Callable, Iterable, Mapping, Sequence

from pagedkube.gateway.routing.pending import (
    DEFAULT_PENDING_CAPACITY, DEFAULT_PENDING_MAX_LOAD, DEFAULT_PENDING_MIN_BLOCKS, DEFAULT_PENDING_TTL_S,
    PendingBlocks)

# An engine's pool holds at most num_kv_blocks hashes: 131,072 blocks of 16
# tokens is 2M tokens, above what one 80 GB GPU holds for an 8B model
# (~500K tokens, GIE's DefaultLRUCapacityPerServer = 31250 blocks).
# At ~100 bytes per entry the cap is ~13 MB per endpoint.
DEFAULT_CAPACITY = 131_072


def _run(block_hashes: Sequence[bytes], held, pending) -> int:
    """Leading blocks of `block_hashes` that are held or pending."""
    n = 0
    for h in block_hashes:
        if h not in pending and h not in held:
            break
        n += 1
    return n


class _EndpointHashes:
    __slots__ = ("engine_id", "hashes")

    def __init__(self, engine_id: str | None):
        self.engine_id = engine_id
        self.hashes: OrderedDict[bytes, None] = OrderedDict()


class PrefixIndex:
    def __init__(self, capacity: int = DEFAULT_CAPACITY, pending_ttl: float = DEFAULT_PENDING_TTL_S,
                 pending_capacity: int = DEFAULT_PENDING_CAPACITY, clock: Callable[[], float] | None = None,
                 pending_min_blocks: int = DEFAULT_PENDING_MIN_BLOCKS,
                 pending_max_load: int = DEFAULT_PENDING_MAX_LOAD):
        if capacity <= 0:
            raise ValueError(f"prefix index capacity must be positive, got {capacity}")
        self.capacity = capacity
        self._endpoints: dict[str, _EndpointHashes] = {}
        self.pending = PendingBlocks(pending_ttl, pending_capacity, time.monotonic if clock is None else clock,
                                     min_blocks=pending_min_blocks, max_load=pending_max_load)

    def __len__(self) -> int:
        return sum(len(e.hashes) for e in self._endpoints.values())

    def num_hashes(self, endpoint: str) -> int:
        entry = self._endpoints.get(endpoint)
        return len(entry.hashes) if entry else 0

    def engine_id(self, endpoint: str) -> str | None:
        entry = self._endpoints.get(endpoint)
        return entry.engine_id if entry else None

    def _entry(self, endpoint: str, engine_id: str | None) -> _EndpointHashes:
        entry = self._endpoints.get(endpoint)
        if entry is None or (engine_id is not None and entry.engine_id != engine_id):
            if entry is not None:   # the engine restarted: what was in flight on it is gone
                self.pending.drop(endpoint)
            entry = self._endpoints[endpoint] = _EndpointHashes(engine_id)
        return entry

    def routed(self, endpoint: str, block_hashes: Sequence[bytes]) -> None:
        """This gateway sent a prompt with `block_hashes` to `endpoint`: the blocks
        it does not hold yet are pending there until its feed reports them. At most
        the endpoint's pending capacity of them, the leading ones: a match needs a
        prompt's head, and a multi-megabyte prompt (100k+ blocks) would otherwise
        cost the event loop tens of ms only to keep its tail."""
        if not self.pending.enabled or not block_hashes:
            return
        entry = self._endpoints.get(endpoint)
        held = entry.hashes if entry is not None else ()
        unheld = (h for h in block_hashes if h not in held)
        self.pending.add(endpoint, islice(unheld, self.pending.capacity))

    def stored(self, endpoint: str, hashes: Iterable[bytes], engine_id: str | None = None) -> None:
        entry = self._entry(endpoint, engine_id)
        held = entry.hashes
        hashes = list(hashes)
        for h in hashes:
            held[h] = None
            held.move_to_end(h)
        self.pending.clear(endpoint, hashes)
        while len(held) > self.capacity:
            held.popitem(last=False)

    def removed(self, endpoint: str, hashes: Iterable[bytes], engine_id: str | None = None) -> None:
        entry = self._entry(endpoint, engine_id)
        for h in hashes:
            entry.hashes.pop(h, None)

    def reset(self, endpoint: str, hashes: Iterable[bytes], engine_id: str | None = None) -> None:
        old = self._endpoints.get(endpoint)
        if old is not None and engine_id is not None and old.engine_id != engine_id:
            self.pending.drop(endpoint)   # a restart; a snapshot of the same engine keeps what is in flight
        self._endpoints[endpoint] = _EndpointHashes(engine_id)
        self.stored(endpoint, hashes, engine_id)

    def drop(self, endpoint: str) -> None:
        """Forget an endpoint that left the set (its pending blocks too)."""
        self._endpoints.pop(endpoint, None)
        self.pending.drop(endpoint)

    def holds(self, endpoint: str, block_hash: bytes) -> bool:
        entry = self._endpoints.get(endpoint)
        return entry is not None and block_hash in entry.hashes

    def match_depths(self, block_hashes: Sequence[bytes], endpoints: Sequence[str],
                     loads: Mapping[str, int] | None = None) -> dict[str, int]:
        """Leading blocks of the prompt each endpoint holds or has pending (blocks
        this gateway routed there that its feed has not reported yet; a pending
        run counts where PendingBlocks.counts allows it, given the endpoint's
        load in `loads`). Hashes are chained, so holding block i means holding
        the same tokens and salt for blocks 0..i; a depth still stops at the
        first block an endpoint lacks, since the engine can only reuse a
        contiguous prefix."""
        depths = dict.fromkeys(endpoints, 0)
        if not block_hashes:
            return depths
        first = block_hashes[0]
        pending = self.pending if self.pending.enabled else None
        for e in endpoints:
            entry = self._endpoints.get(e)
            held = entry.hashes if entry is not None else None
            # Most endpoints lack the first block; takewhile walks the rest in C (the
            # gateway's hot path at 256 endpoints in bench/simulate.py's profile).
            depth = len(list(takewhile(held.__contains__, block_hashes))) if held and first in held else 0
            live = pending.live(e) if pending is not None else None
            if pending is not None and live is not None and depth < len(block_hashes) and block_hashes[depth] in live:
                run = _run(block_hashes[depth:], held or (), live)
                if pending.counts(run, None if loads is None else loads.get(e, 0)):
                    depth += run
            depths[e] = depth
        return depths
