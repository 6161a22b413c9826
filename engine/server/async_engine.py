"""Runs an LLMEngine in its own thread and bridges it to asyncio.

    HTTP handlers (event loop)                 engine thread (owns the LLMEngine)
    ---------------------------                ----------------------------------
    add_requests() --+                         loop:
    abort()       ---+--> inbox (deque) -->      apply inbox ops (add / abort / call)
    call(fn)      --+     + Condition            step() if there is work
                                                 push outputs --call_soon_threadsafe--> RequestStream
    RequestStream.get() <-- asyncio.Queue  <-----+
    stats()        <-- snapshot taken after every step, under the lock

Invariants: only the engine thread touches the engine after construction (the
engine is built there too), so the engine needs no locks. Every request the
engine accepted ends exactly once on this side (finished output, abort, or a
step failure), which is when its tracking entry is dropped. An exception while
adding a request fails that request only; an exception in step() fails the
requests that were in flight (we cannot tell which one caused it) and the loop
goes on.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from pagedkube.engine.server.errors import APIError
from pagedkube.engine.server.streams import RequestStream, StreamAborted, StreamError, deliver, resolve

logger = logging.getLogger(__name__)

# After this many consecutive failed steps the engine is reported unhealthy
# (GET /health answers 500) so that an orchestrator restarts the process.
MAX_CONSECUTIVE_STEP_FAILURES = 3
# A step that scheduled nothing while requests wait (e.g. for blocks) is retried
# after this pause instead of in a hot loop.
IDLE_STEP_BACKOFF_S = 0.001


@dataclass
class _Tracked:
    stream: RequestStream
    arrival: float
    num_prompt_tokens: int
    first_scheduled: float | None = None
    last_token_time: float | None = None
    num_output_tokens: int = 0


@dataclass(frozen=True)
class EngineInfo:
    """Read-only facts about the engine, copied once after it is built."""
    tokenizer: Any          # pagedkube.tokenizer.Tokenizer, or None for a model without tokenizer.json
    vocab_size: int
    model_name: str
    max_model_len: int
    block_size: int
    hash_seed: str
    num_kv_blocks: int
    kv_events: Any          # the engine's KVEventLog (thread-safe, read by the cache feed)


def plain_facts(engine: Any, stats: Any) -> dict:
    """EngineInfo's fields that are plain values (all but the tokenizer and the KV
    event log): the engine-core process sends them over its pipe as they are."""
    return dict(vocab_size=engine.vocab_size, model_name=engine.model_name, max_model_len=engine.max_model_len,
                block_size=engine.block_size, hash_seed=getattr(engine.config, "hash_seed", ""),
                num_kv_blocks=stats.num_kv_blocks)


class AsyncEngine:
    def __init__(self, engine_factory: Callable[[], Any], metrics: Any = None):
        self._factory = engine_factory
        self.metrics = metrics
        self._cv = threading.Condition()
        self._inbox: collections.deque = collections.deque()
        self._pending_adds = 0
        self._stats: Any = None
        self._stop = False
        self._thread: threading.Thread | None = None
        self._tracked: dict[str, _Tracked] = {}      # engine thread only
        self.info: EngineInfo | None = None
        self.healthy = True

    # ---- lifecycle (event loop side) ----
    async def start(self) -> EngineInfo:
        """Builds the engine in its thread and returns once it can take requests;
        raises what the engine's constructor raised."""
        loop = asyncio.get_running_loop()
        built: asyncio.Future = loop.create_future()
        self._thread = threading.Thread(target=self._run, args=(loop, built), name="engine-loop", daemon=True)
        self._thread.start()
        await built
        assert self.info is not None
        return self.info

    def shutdown(self, timeout: float = 10.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop

    # ---- requests (event loop side) ----
    def add_requests(self, items: list[tuple[str, list[int], Any, str | None]], stream: RequestStream,
                     *, max_waiting: int | None = None) -> None:
        """Queues (request_id, prompt_token_ids, params, cache_salt) items, all or none.

        Raises APIError 503 when the waiting queue (engine's waiting requests plus
        those not yet handed to it) would grow past `max_waiting`."""
        now = time.monotonic()
        with self._cv:
            if self._stop:
                raise APIError(503, "the engine is shutting down", headers={"Retry-After": "1"})
            waiting = self._pending_adds + (self._stats.num_waiting if self._stats is not None else 0)
            if max_waiting is not None and waiting + len(items) > max_waiting:
                raise APIError(503, f"the waiting queue is full ({waiting} waiting, limit {max_waiting}); "
                               "retry later", code="queue_full", headers={"Retry-After": "1"})
            for request_id, prompt_ids, params, salt in items:
                self._inbox.append(("add", request_id, prompt_ids, params, salt, stream, now))
            self._pending_adds += len(items)
            self._cv.notify()

    def abort(self, request_ids: list[str]) -> None:
        with self._cv:
            self._inbox.append(("abort", list(request_ids)))
            self._cv.notify()

    def abort_all(self) -> None:
        with self._cv:
            self._inbox.append(("abort_all",))
            self._cv.notify()

    async def call(self, fn: Callable[[Any], Any]) -> Any:
        """Runs fn(engine) on the engine thread (between steps) and returns its result."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        with self._cv:
            if self._stop:
                raise APIError(503, "the engine is shutting down")
            self._inbox.append(("call", fn, fut, loop))
            self._cv.notify()
        return await fut

    def stats(self) -> tuple[Any, int]:
        """(the engine's EngineStats after its last step, requests not yet handed to it)."""
        with self._cv:
            return self._stats, self._pending_adds

    # ---- engine thread ----
    def _run(self, loop: asyncio.AbstractEventLoop, built: asyncio.Future) -> None:
        try:
            engine = self._factory()
            self._stats = engine.stats()
            self.info = EngineInfo(tokenizer=engine.tokenizer, kv_events=engine.kv_events,
                                   **plain_facts(engine, self._stats))
        except BaseException as exc:  # noqa: BLE001 - handed to start()'s caller
            logger.exception("building the engine failed")
            loop.call_soon_threadsafe(resolve, built, None, exc)
            return
        loop.call_soon_threadsafe(resolve, built, None, None)
        failures = 0
        has_work = False
        while True:
            with self._cv:
                while not self._inbox and not self._stop and not has_work:
                    self._cv.wait()
                if self._stop:
                    break
                ops = list(self._inbox)
                self._inbox.clear()
            num_adds = self._apply(engine, ops)
            outputs = None
            if engine.has_unfinished_requests():
                step_start = time.monotonic()
                try:
                    outputs = engine.step()
                except Exception as exc:  # noqa: BLE001 - one bad step must not kill the server
                    failures += 1
                    logger.exception("engine step failed (%d in a row)", failures)
                    self._fail_all(engine, APIError(500, f"engine step failed: {type(exc).__name__}: {exc}"))
                    self.healthy = failures < MAX_CONSECUTIVE_STEP_FAILURES
                else:
                    failures = 0
                    self._dispatch(outputs, step_start)
            has_work = engine.has_unfinished_requests()
            stats = engine.stats()
            with self._cv:
                self._stats = stats
                self._pending_adds -= num_adds
                if has_work and outputs == [] and not self._inbox:
                    self._cv.wait(IDLE_STEP_BACKOFF_S)   # nothing could be scheduled: do not spin
        # Shutting down: whoever still waits gets an answer.
        error = APIError(503, "the engine is shutting down")
        self._fail_all(engine, error)
        with self._cv:
            ops = list(self._inbox)
            self._inbox.clear()
        for op in ops:
            if op[0] == "add":
                op[5].put(StreamError(op[1], error))
            elif op[0] == "call":
                try:
                    op[3].call_soon_threadsafe(resolve, op[2], None, error)
                except RuntimeError:
                    pass

    def _apply(self, engine: Any, ops: list[tuple]) -> int:
        num_adds = 0
        for op in ops:
            kind = op[0]
            if kind == "add":
                num_adds += 1
                _, request_id, prompt_ids, params, salt, stream, arrival = op
                try:
                    engine.add_request(request_id, prompt_ids, params, cache_salt=salt)
                except ValueError as exc:
                    stream.put(StreamError(request_id, APIError(400, str(exc))))
                except Exception as exc:  # noqa: BLE001
                    logger.exception("add_request(%s) failed", request_id)
                    stream.put(StreamError(request_id, APIError(500, f"{type(exc).__name__}: {exc}")))
                else:
                    self._tracked[request_id] = _Tracked(stream, arrival, len(prompt_ids))
            elif kind in ("abort", "abort_all"):
                request_ids = list(self._tracked) if kind == "abort_all" else op[1]
                for request_id in request_ids:
                    tracked = self._tracked.pop(request_id, None)
                    if tracked is None:
                        continue
                    try:
                        engine.abort_request(request_id)
                    except Exception:  # noqa: BLE001
                        logger.exception("abort_request(%s) failed", request_id)
                    self._finish_metrics(tracked, "abort")
                    tracked.stream.put(StreamAborted(request_id))
            elif kind == "call":
                _, fn, fut, loop = op
                try:
                    result, error = fn(engine), None
                except Exception as exc:  # noqa: BLE001 - handed to the caller
                    result, error = None, exc
                try:
                    loop.call_soon_threadsafe(resolve, fut, result, error)
                except RuntimeError:
                    pass
        return num_adds

    def _dispatch(self, outputs: list[Any], step_start: float) -> None:
        now = time.monotonic()
        deliveries: list[tuple[RequestStream, Any]] = []
        for out in outputs:
            tracked = self._tracked.get(out.request_id)
            if tracked is None:  # aborted while the step ran
                continue
            if tracked.first_scheduled is None:
                tracked.first_scheduled = (out.metrics or {}).get("first_scheduled_time", step_start)
            num_tokens = sum(len(c.token_ids) for c in out.outputs)
            new_tokens = num_tokens - tracked.num_output_tokens
            if new_tokens > 0 and self.metrics is not None:
                if tracked.last_token_time is None:
                    self.metrics.on_first_token(now - tracked.arrival, tracked.num_prompt_tokens)
                else:
                    self.metrics.on_inter_token(now - tracked.last_token_time)
                self.metrics.on_generated(new_tokens)
            if new_tokens > 0:
                tracked.last_token_time = now
                tracked.num_output_tokens = num_tokens
            deliveries.append((tracked.stream, out))
            if out.finished:
                del self._tracked[out.request_id]
                reasons = {c.finish_reason for c in out.outputs}
                self._finish_metrics(tracked, "stop" if "stop" in reasons else (reasons.pop() or "stop"))
        deliver(deliveries)

    def _finish_metrics(self, tracked: _Tracked, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.on_request_end(reason, tracked.arrival, tracked.first_scheduled)

    def _fail_all(self, engine: Any, error: APIError) -> None:
        for request_id, tracked in list(self._tracked.items()):
            try:
                engine.abort_request(request_id)
            except Exception:  # noqa: BLE001
                logger.exception("abort_request(%s) failed", request_id)
            tracked.stream.put(StreamError(request_id, error))
        self._tracked.clear()

