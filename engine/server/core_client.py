"""The HTTP process's side of the engine-core process (engine_core.py).

    HTTP handlers (event loop)                         engine-core process
    --------------------------                         -------------------
    add_requests() / abort() --> outbox --> sender thread --pipe--> EngineCore.run()
    RequestStream.get() <-- deliver() <-- _on_readable() <--pipe--  one StepMessage per step
                        (deltas -> cumulative RequestOutputs, metrics, stats, KV event mirror)

Same interface as AsyncEngine (the in-thread engine, kept for --engine-in-process).
The event loop never blocks on the pipe: sends go through a small thread (a full
pipe in both directions would otherwise deadlock the two processes), and
messages are read by a loop reader when the pipe is readable. Every request
handed to the core ends exactly once here (finished output, error, or abort).
If the core process dies, its requests fail with a 500, /health answers 500 and
no new work is accepted.
"""
from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from pagedkube.engine.kv_events import KVEventLog
from pagedkube.engine.outputs import CompletionOutput, RequestOutput
from pagedkube.engine.server.async_engine import EngineInfo
from pagedkube.engine.server.engine_core import EngineFacts, StepMessage, run_engine_core
from pagedkube.engine.server.errors import APIError
from pagedkube.engine.server.streams import RequestStream, StreamAborted, StreamError, deliver

logger = logging.getLogger(__name__)

MAX_MESSAGES_PER_WAKEUP = 8


@dataclass
class _Tracked:
    stream: RequestStream
    arrival: float
    prompt_ids: list[int]
    outputs: list[CompletionOutput] | None = None
    num_cached_tokens: int = 0
    first_scheduled: float | None = None
    last_token_time: float | None = None


class EngineCoreClient:
    def __init__(self, engine_factory: Callable[[], Any], metrics: Any = None):
        self._factory = engine_factory
        self.metrics = metrics
        self.info: EngineInfo | None = None
        self.healthy = True
        self._proc: Any = None
        self._conn: Any = None
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._sender: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tracked: dict[str, _Tracked] = {}
        self._stats: Any = None
        self._pending_adds = 0
        self._stop = False
        self._dead = False

    # ---- lifecycle ----
    async def start(self) -> EngineInfo:
        """Starts the core process (from the event loop's thread: PDEATHSIG follows the
        creating thread) and returns once the engine is built; raises RuntimeError if
        building it failed."""
        self._loop = asyncio.get_running_loop()
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe(duplex=True)
        self._proc = ctx.Process(target=run_engine_core, name="engine-core", daemon=True,
                                 args=(child, self._factory, os.getpid(), logging.getLogger().level))
        self._proc.start()
        child.close()
        try:
            kind, payload = await self._loop.run_in_executor(None, self._conn.recv)
        except (EOFError, OSError):
            kind, payload = "failed", f"the engine-core process exited with {self._proc.exitcode}"
        if kind != "ready":
            self._proc.join(5)
            raise RuntimeError(f"building the engine failed: {payload}")
        facts: EngineFacts = payload
        from pagedkube.tokenizer import Tokenizer
        self._stats = facts.stats
        self.info = EngineInfo(
            tokenizer=Tokenizer(facts.tokenizer_files) if facts.tokenizer_files else None,
            kv_events=KVEventLog(facts.max_events, engine_id=facts.engine_id), **facts.plain)
        self._sender = threading.Thread(target=self._send_loop, name="engine-core-sender", daemon=True)
        self._sender.start()
        self._loop.add_reader(self._conn.fileno(), self._on_readable)
        return self.info

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stops the core (its requests end with 503) and waits for it; thread-safe."""
        self._stop = True
        if self._proc is None:
            return
        self._outbox.put(("stop",))
        self._proc.join(timeout)
        if self._proc.is_alive():
            logger.warning("the engine-core process did not stop in %.0fs: killing it", timeout)
            self._proc.kill()
            self._proc.join(5)
        self._outbox.put(None)

    @property
    def running(self) -> bool:
        return self._proc is not None and not self._dead and not self._stop and self._proc.is_alive()

    # ---- requests (event loop side) ----
    def add_requests(self, items: list[tuple[str, list[int], Any, str | None]], stream: RequestStream,
                     *, max_waiting: int | None = None) -> None:
        """Hands (request_id, prompt_token_ids, params, cache_salt) items to the core, all or none.

        Raises APIError 503 when stopping, when the core is gone, or when the waiting
        queue would grow past `max_waiting`."""
        if self._stop or self._dead:
            raise APIError(503, "the engine is shutting down" if self._stop else "the engine is not running",
                           headers={"Retry-After": "1"})
        waiting = self._pending_adds + (self._stats.num_waiting if self._stats is not None else 0)
        if max_waiting is not None and waiting + len(items) > max_waiting:
            raise APIError(503, f"the waiting queue is full ({waiting} waiting, limit {max_waiting}); "
                           "retry later", code="queue_full", headers={"Retry-After": "1"})
        now = time.monotonic()
        for request_id, prompt_ids, _, _ in items:
            self._tracked[request_id] = _Tracked(stream, now, prompt_ids)
        self._pending_adds += len(items)
        self._outbox.put(("add", list(items)))

    def abort(self, request_ids: list[str]) -> None:
        aborted = []
        for request_id in request_ids:
            tracked = self._tracked.pop(request_id, None)
            if tracked is not None:
                aborted.append(request_id)
                self._finish_metrics(tracked, "abort")
                tracked.stream.put(StreamAborted(request_id))
        if aborted:
            self._outbox.put(("abort", aborted))

    def abort_all(self) -> None:
        self.abort(list(self._tracked))

    def stats(self) -> tuple[Any, int]:
        """(the engine's EngineStats after its last step, requests not yet handed to it)."""
        return self._stats, self._pending_adds

    # ---- the pipe ----
    def _send_loop(self) -> None:
        while (op := self._outbox.get()) is not None:
            try:
                self._conn.send(op)
            except (OSError, ValueError):   # the core is gone; the reader reports it
                return

    def _on_readable(self) -> None:
        try:
            # At most a few messages per wake-up, so a fast core cannot starve the handlers.
            for _ in range(MAX_MESSAGES_PER_WAKEUP):
                if not self._conn.poll(0):
                    break
                kind, msg = self._conn.recv()
                if kind == "step":
                    self._on_step(msg)
        except (EOFError, OSError):
            self._on_core_exit()

    def _on_core_exit(self) -> None:
        assert self._loop is not None
        self._loop.remove_reader(self._conn.fileno())
        self._dead = True
        if not self._stop:
            self.healthy = False
            logger.error("the engine-core process exited unexpectedly (exit code %s)",
                         self._proc.exitcode if self._proc is not None else None)
        error = (APIError(503, "the engine is shutting down") if self._stop
                 else APIError(500, "the engine-core process died"))
        for request_id, tracked in self._tracked.items():
            tracked.stream.put(StreamError(request_id, error))
        self._tracked.clear()
        self._outbox.put(None)

    def _on_step(self, msg: StepMessage) -> None:
        for event_type, hashes in msg.kv_events:
            self.info.kv_events.record(event_type, hashes)
        self._stats = msg.stats
        self._pending_adds -= msg.num_adds
        self.healthy = self.healthy and msg.healthy
        deliveries: list[tuple[RequestStream, Any]] = []
        for request_id, status, message in msg.errors:
            tracked = self._tracked.pop(request_id, None)
            if tracked is not None:
                deliveries.append((tracked.stream, StreamError(request_id, APIError(status, message))))
        now = time.monotonic()
        for request_id, finished, num_cached, first_scheduled, samples in msg.outputs:
            tracked = self._tracked.get(request_id)
            if tracked is None:   # aborted here while the core stepped
                continue
            deliveries.append((tracked.stream, self._apply(tracked, request_id, finished, num_cached,
                                                            first_scheduled, samples, now)))
            if finished:
                del self._tracked[request_id]
                reasons = {c.finish_reason for c in tracked.outputs}
                self._finish_metrics(tracked, "stop" if "stop" in reasons else (reasons.pop() or "stop"))
        deliver(deliveries)

    def _apply(self, tracked: _Tracked, request_id: str, finished: bool, num_cached: int,
               first_scheduled: float, samples: list[tuple], now: float) -> RequestOutput:
        if tracked.outputs is None:
            tracked.outputs = []
        if tracked.first_scheduled is None:
            tracked.first_scheduled = first_scheduled
        tracked.num_cached_tokens = num_cached
        outs = tracked.outputs
        new_tokens = 0
        for index, kept, token_ids, text_kept, text, reason, stop_reason, logprobs, cum in samples:
            while len(outs) <= index:
                outs.append(CompletionOutput(len(outs), "", []))
            c = outs[index]
            new_tokens += len(token_ids) - (len(c.token_ids) - kept)
            del c.token_ids[kept:]
            c.token_ids.extend(token_ids)
            c.text = c.text[:text_kept] + text
            if logprobs is not None:
                c.logprobs = (c.logprobs or [])[:kept] + logprobs
            c.finish_reason, c.stop_reason, c.cumulative_logprob = reason, stop_reason, cum
        if new_tokens > 0:
            if self.metrics is not None:
                if tracked.last_token_time is None:
                    self.metrics.on_first_token(now - tracked.arrival, len(tracked.prompt_ids))
                else:
                    self.metrics.on_inter_token(now - tracked.last_token_time)
                self.metrics.on_generated(new_tokens)
            tracked.last_token_time = now
        copies = [CompletionOutput(c.index, c.text, list(c.token_ids), c.finish_reason, c.stop_reason,
                                   list(c.logprobs) if c.logprobs is not None else None, c.cumulative_logprob)
                  for c in outs]
        return RequestOutput(request_id, None, tracked.prompt_ids, copies, finished, num_cached,
                             {"first_scheduled_time": tracked.first_scheduled})

    def _finish_metrics(self, tracked: _Tracked, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.on_request_end(reason, tracked.arrival, tracked.first_scheduled)
