"""The cache feed the gateway follows (docs/design.md "Engine server", docs/interfaces.md).

    GET /v1/cache/config              block size, hash algorithm and seed, engine_id
    GET /v1/cache/events?after=SEQ[&wait=S]
                                      stored/removed block hashes since SEQ, or a snapshot;
                                      with `wait`, a long-poll: held until an event after
                                      SEQ exists, S seconds pass or the server drains
    GET /v1/cache/tokenizer           the tokenizer files, so a router tokenizes as we do

Handlers read `state.info.kv_events` directly: the one KVEventLog, kept in the HTTP
process and fed with the events of every step message from the engine core (the
core keeps none).

A long-poll lets a gateway learn of new blocks within a round trip instead of a
polling interval: a chat's next turn, sent right after the answer, then finds
its previous turn's blocks already in the gateway's index.
"""
from __future__ import annotations

import asyncio

from fastapi import APIRouter, Query, Request

from pagedkube import hashing
from pagedkube.engine.server.errors import APIError
from pagedkube.engine.server.state import ServerState
from pagedkube.openai_errors import NO_TOKENIZER

router = APIRouter()

MAX_WAIT_S = 30.0   # the longest long-poll an engine holds (docs/interfaces.md)


class FeedWaiters:
    """Wakes the long-polls of GET /v1/cache/events when the log records an event
    (`notify`, from any thread) or the server starts draining (`wake`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._waiting: set[asyncio.Future] = set()

    def notify(self) -> None:
        if self._waiting:  # a benign race: a waiter re-checks the log after joining
            try:
                self._loop.call_soon_threadsafe(self.wake)
            except RuntimeError:  # the loop has closed: nobody is waiting any more
                pass

    def wake(self) -> None:
        for future in self._waiting:
            if not future.done():
                future.set_result(None)

    async def wait_after(self, kv_events, after: int, timeout: float) -> None:
        """Returns once `kv_events` has an event after `after`, or after `timeout` s. Only an
        up-to-date reader waits: any other answer (events, or a reset) is ready now."""
        future = self._loop.create_future()
        self._waiting.add(future)
        try:
            if kv_events.latest_seq == after:
                await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            self._waiting.discard(future)


def _state(request: Request) -> ServerState:
    """The app's state; its `info` answers 503 `not_ready` until the engine is loaded."""
    state: ServerState = request.app.state.server
    return state


@router.get("/v1/cache/config")
async def cache_config(request: Request) -> dict:
    state = _state(request)
    return {**hashing.cache_config(state.info.block_size, state.info.hash_seed), "engine_id": state.engine_id}


@router.get("/v1/cache/events")
async def cache_events(request: Request, after: int = Query(0, ge=-(2 ** 63), le=2 ** 63 - 1),
                       wait: float = Query(0.0, ge=0.0, le=MAX_WAIT_S)) -> dict:
    state = _state(request)
    log = state.info.kv_events
    if wait > 0 and not state.draining and state.feed_waiters is not None:
        await state.feed_waiters.wait_after(log, after, wait)
    return log.events_after(after)


@router.get("/v1/cache/tokenizer")
async def cache_tokenizer(request: Request) -> dict:
    state = _state(request)
    tokenizer = state.info.tokenizer
    if tokenizer is None:
        raise APIError(404, "this model has no tokenizer.json to serve", code=NO_TOKENIZER)
    return {"files": dict(tokenizer.files)}
