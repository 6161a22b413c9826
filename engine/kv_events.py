"""The engine's cache feed: which block hashes the pool stored and removed.

The BlockPool calls `record` (its event_sink) whenever a hash enters or leaves
its hash map; the server answers `GET /v1/cache/events?after=SEQ` with
`events_after(SEQ)` (docs/interfaces.md "Cache feed"). Only the last
`max_events` events are kept (docs/design.md, pitfall "Unbounded routing indexes"), so a gateway
that fell further behind, or that talks to a restarted engine, gets a reset and
a full snapshot instead. The snapshot is the set of hashes currently cached,
kept here by replaying the events (it mirrors the pool's hash map, so it is
bounded by the pool size).

Thread-safe: the engine loop records while HTTP handlers read. Listeners
(`subscribe`) are called after every record, outside the lock, from the
recording thread: the server uses one to wake its long-polls. Torch-free.
"""
from __future__ import annotations

import threading
import uuid
from collections import deque
from typing import Callable

DEFAULT_MAX_EVENTS = 10_000   # docs/interfaces.md: the log keeps 10,000 events by default
EVENT_TYPES = ("stored", "removed")


class KVEventLog:
    def __init__(self, max_events: int = DEFAULT_MAX_EVENTS, engine_id: str | None = None):
        if max_events < 1:
            raise ValueError(f"max_events must be >= 1, got {max_events}")
        self.engine_id = engine_id or str(uuid.uuid4())
        self.max_events = max_events
        self._events: deque[tuple[int, str, list[bytes]]] = deque(maxlen=max_events)
        self._cached: dict[bytes, None] = {}   # insertion-ordered set of live hashes
        self._latest_seq = 0
        self._lock = threading.Lock()
        self._listeners: tuple[Callable[[], None], ...] = ()

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Calls `listener()` after every recorded event, from the recording thread."""
        with self._lock:
            self._listeners += (listener,)

    def record(self, event_type: str, block_hashes: list[bytes]) -> None:
        if event_type not in EVENT_TYPES:
            raise ValueError(f"event type must be one of {EVENT_TYPES}, got {event_type!r}")
        with self._lock:
            self._latest_seq += 1
            self._events.append((self._latest_seq, event_type, list(block_hashes)))
            for h in block_hashes:
                if event_type == "stored":
                    self._cached[h] = None
                else:
                    self._cached.pop(h, None)
            listeners = self._listeners
        for listener in listeners:
            listener()

    @property
    def latest_seq(self) -> int:
        return self._latest_seq

    def snapshot(self) -> list[str]:
        with self._lock:
            return [h.hex() for h in self._cached]

    def events_after(self, after: int) -> dict:
        """The JSON body of GET /v1/cache/events?after=SEQ (events with seq > after)."""
        with self._lock:
            latest = self._latest_seq
            oldest_kept = self._events[0][0] if self._events else latest + 1
            # Complete iff every event after `after` is still here.
            if after < 0 or after > latest or after + 1 < oldest_kept:
                return {"engine_id": self.engine_id, "latest_seq": latest, "reset": True, "events": [],
                        "block_hashes": [h.hex() for h in self._cached]}
            events = [{"seq": seq, "type": event_type, "block_hashes": [h.hex() for h in hashes]}
                      for seq, event_type, hashes in self._events if seq > after]
            return {"engine_id": self.engine_id, "latest_seq": latest, "reset": False, "events": events}
