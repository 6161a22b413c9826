"""What the engine thread hands to the event loop: per-request streams of outputs.

Items cross threads only through `loop.call_soon_threadsafe`; one call per engine
step carries every output of that step (see `deliver`).
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
    """The outputs of one HTTP request's engine requests, delivered on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._queue: asyncio.Queue = asyncio.Queue()

    def put(self, item: Any) -> None:
        """Called from the engine thread."""
        deliver([(self, item)])

    async def get(self) -> list[Any]:
        """Waits for at least one item and returns everything queued (outputs are
        cumulative, so a consumer that fell behind catches up in one go)."""
        items = [await self._queue.get()]
        while not self._queue.empty():
            items.append(self._queue.get_nowait())
        return items


def deliver(pairs: list[tuple[RequestStream, Any]]) -> None:
    """Hands items to their streams with one event-loop wake-up per loop (not one per
    item: a step with 64 running requests would otherwise write 64 times to the loop's
    self-pipe and schedule 64 callbacks)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[RequestStream, Any]]] = {}
    for stream, item in pairs:
        by_loop.setdefault(stream._loop, []).append((stream, item))
    for loop, batch in by_loop.items():
        try:
            loop.call_soon_threadsafe(_put_all, batch)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass


def _put_all(batch: list[tuple[RequestStream, Any]]) -> None:
    for stream, item in batch:
        stream._queue.put_nowait(item)


def resolve(fut: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)
