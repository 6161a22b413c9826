"""Which block hashes each endpoint's prefix cache holds, from its cache feed.

Bounded (PITFALLS.md "Unbounded routing indexes"): each endpoint keeps at most
`capacity` hashes in an LRU; a `stored` event refreshes a hash, the oldest falls
out first. The engine's own pool is bounded and it reports `removed` hashes, so
the cap only bites if removal events are lost. A `reset` snapshot or a new
engine_id (the engine restarted behind the same address) replaces an endpoint's
set wholesale.

Hashes are kept as raw 32-byte digests (half the memory of hex strings).
"""
from __future__ import annotations

from collections import OrderedDict
from itertools import takewhile
from typing import Iterable, Sequence

# An engine's pool holds at most num_kv_blocks hashes: 131,072 blocks of 16
# tokens is 2M tokens, above what one 80 GB GPU holds for an 8B model
# (~500K tokens, GIE's DefaultLRUCapacityPerServer = 31250 blocks).
# At ~100 bytes per entry the cap is ~13 MB per endpoint.
DEFAULT_CAPACITY = 131_072


class _EndpointHashes:
    __slots__ = ("engine_id", "hashes")

    def __init__(self, engine_id: str | None):
        self.engine_id = engine_id
        self.hashes: OrderedDict[bytes, None] = OrderedDict()


class PrefixIndex:
    def __init__(self, capacity: int = DEFAULT_CAPACITY):
        if capacity <= 0:
            raise ValueError(f"prefix index capacity must be positive, got {capacity}")
        self.capacity = capacity
        self._endpoints: dict[str, _EndpointHashes] = {}

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
            entry = self._endpoints[endpoint] = _EndpointHashes(engine_id)
        return entry

    def stored(self, endpoint: str, hashes: Iterable[bytes], engine_id: str | None = None) -> None:
        entry = self._entry(endpoint, engine_id)
        held = entry.hashes
        for h in hashes:
            held[h] = None
            held.move_to_end(h)
        while len(held) > self.capacity:
            held.popitem(last=False)

    def removed(self, endpoint: str, hashes: Iterable[bytes], engine_id: str | None = None) -> None:
        entry = self._entry(endpoint, engine_id)
        for h in hashes:
            entry.hashes.pop(h, None)

    def reset(self, endpoint: str, hashes: Iterable[bytes], engine_id: str | None = None) -> None:
        self._endpoints[endpoint] = _EndpointHashes(engine_id)
        self.stored(endpoint, hashes, engine_id)

    def drop(self, endpoint: str) -> None:
        """Forget an endpoint that left the set."""
        self._endpoints.pop(endpoint, None)

    def holds(self, endpoint: str, block_hash: bytes) -> bool:
        entry = self._endpoints.get(endpoint)
        return entry is not None and block_hash in entry.hashes

    def match_depths(self, block_hashes: Sequence[bytes], endpoints: Sequence[str]) -> dict[str, int]:
        """Leading blocks of the prompt each endpoint holds. Hashes are chained, so
        holding block i means holding the same tokens and salt for blocks 0..i;
        a depth still stops at the first block an endpoint lacks, since the
        engine can only reuse a contiguous prefix."""
        depths = dict.fromkeys(endpoints, 0)
        if not block_hashes:
            return depths
        first = block_hashes[0]
        for e in endpoints:
            entry = self._endpoints.get(e)
            # Most endpoints lack the first block; takewhile walks the rest in C (the
            # gateway's hot path at 256 endpoints in bench/simulate.py's profile).
            if entry is not None and first in entry.hashes:
                depths[e] = len(list(takewhile(entry.hashes.__contains__, block_hashes)))
        return depths
