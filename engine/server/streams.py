"""Per-request output streams, filled on the event loop by the engine client.

A stream carries RequestDeltas (only what each step added), then, instead of a
last delta, possibly a StreamError or StreamAborted. The consumer must read
every item: deltas are not cumulative.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from pagedkube.engine.server.errors import APIError


@dataclass
class StreamError:
    request_id: str
    error: APIError


@dataclass
class StreamAborted:
    request_id: str


class RequestStream:
    """The outputs of one HTTP request's engine requests (event loop thread only)."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue = asyncio.Queue()

    def put(self, item: Any) -> None:
        self._queue.put_nowait(item)

    async def get(self) -> list[Any]:
        """Waits for at least one item and returns everything queued, in order."""
        items = [await self._queue.get()]
        while not self._queue.empty():
            items.append(self._queue.get_nowait())
        return items
