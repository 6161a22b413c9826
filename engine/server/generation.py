"""The engine requests behind one HTTP request, from submission to the last delta.

`Generation` submits a Prepared request's prompts, yields their RequestDeltas and,
whatever way the HTTP request ends (done, error, client gone), aborts what is still
running exactly once so the blocks go back to the pool. `collect` runs one to the
end for a non-streamed answer. How a body becomes a Prepared request is prepare.py's.
"""
from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import AsyncGenerator, Callable

from fastapi import Request

from pagedkube.engine.lora.request import LoRARequest
from pagedkube.engine.outputs import OutputAccumulator, RequestDelta, RequestOutput
from pagedkube.engine.server import constraints
from pagedkube.engine.server.core_messages import NewRequest
from pagedkube.engine.server.errors import APIError
from pagedkube.engine.server.prepare import Prepared
from pagedkube.engine.server.state import ServerState
from pagedkube.engine.server.streams import RequestStream, StreamAborted, StreamError
from pagedkube.openai_errors import SHUTTING_DOWN


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class Generation:
    """The engine requests behind one HTTP request (one per prompt, each with n samples)."""

    def __init__(self, state: ServerState, request_id: str, prepared: Prepared, lora: LoRARequest | None = None):
        self.state = state
        self.lora = lora
        self.request_id = request_id
        self.prepared = prepared
        self.engine_ids = [f"{request_id}-{i}" for i in range(len(prepared.prompt_ids))]
        self._pending = set(self.engine_ids)
        self._stream: RequestStream | None = None
        self._closed = False
        self._observers: list[Callable[[int, RequestDelta], None]] = []

    def observe(self, observer: Callable[[int, RequestDelta], None]) -> None:
        """observer(prompt index, delta) is called with every delta as updates() hands it on,
        before the consumer sees it (the access log's hook: engine/server/access_log.py)."""
        self._observers.append(observer)

    def start(self) -> None:
        """Submits the requests; raises APIError 503 when draining or the queue is full."""
        self.state.check_accepting()
        self._stream = RequestStream()
        p = self.prepared
        self.state.engine.add_requests(
            [NewRequest(rid, ids, p.params, p.cache_salt, group=self.request_id, lora_request=self.lora)
             for rid, ids in zip(self.engine_ids, p.prompt_ids)],
            self._stream, max_waiting=self.state.config.max_waiting)
        self.state.in_flight += 1

    async def updates(self) -> AsyncGenerator[tuple[int, RequestDelta], None]:
        """Yields (prompt index, RequestDelta), every one, until every request finished."""
        assert self._stream is not None, "start() first"
        index = {rid: i for i, rid in enumerate(self.engine_ids)}
        while self._pending:
            for item in await self._stream.get():
                if isinstance(item, StreamError):
                    self._pending.discard(item.request_id)
                    raise constraints.with_field(item.error, self.prepared.constraint_field)
                if isinstance(item, StreamAborted):
                    self._pending.discard(item.request_id)
                    raise APIError(503, "the request was aborted: the server is shutting down",
                                   code=SHUTTING_DOWN, headers={"Retry-After": "1"})
                if item.finished:
                    self._pending.discard(item.request_id)
                for observer in self._observers:
                    observer(index[item.request_id], item)
                yield index[item.request_id], item

    def close(self) -> None:
        """Idempotent: aborts unfinished requests and ends this request's in-flight count."""
        if self._closed or self._stream is None:
            return
        self._closed = True
        if self._pending:
            self.state.engine.abort(sorted(self._pending))
            self._pending.clear()
        self.state.in_flight -= 1


class ClientDisconnected(Exception):
    pass


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def collect(gen: Generation, request: Request) -> dict[int, RequestOutput]:
    """Runs a non-streaming generation to the end, aborting it if the client goes away;
    the one place where a request's deltas are accumulated into whole outputs."""
    results = {i: OutputAccumulator(rid, None, ids)
               for i, (rid, ids) in enumerate(zip(gen.engine_ids, gen.prepared.prompt_ids))}

    async def consume() -> None:
        async with contextlib.aclosing(gen.updates()) as updates:
            async for prompt_idx, delta in updates:
                results[prompt_idx].add(delta)

    consumer = asyncio.ensure_future(consume())
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({consumer, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (consumer, watcher):
            task.cancel()
        await asyncio.gather(consumer, watcher, return_exceptions=True)
        gen.close()
    if not consumer.cancelled() and consumer.exception() is not None:
        raise consumer.exception()  # type: ignore[misc]  # checked not None just above
    if not all(acc.finished for acc in results.values()):
        raise ClientDisconnected()
    return {i: acc.result() for i, acc in results.items()}
