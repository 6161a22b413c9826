"""The HTTP process's side of the engine core (engine_core.py): `EngineCoreClient`.

    HTTP handlers (event loop)               threads                     engine core
    add_requests() / abort() --> outbox --> sender: conn.send() --pipe--> EngineCore.run()
    RequestStream <-- _on_message() <-- reader: conn.recv() <----pipe---- StepMessage per step

The event loop never touches the pipe. Both threads block on it, so the pipe
stays in blocking mode: a half-arrived message is waited for, never mistaken
for the core's death. (Watching the descriptor with loop.add_reader made it
non-blocking under uvloop, and Connection.recv() then raised BlockingIOError
mid-message: the engine wedged under 256 clients. docs/design.md "Pitfalls".)

Back-pressure, not buffers: the reader hands a message to the loop only while
fewer than MAX_UNDELIVERED wait there; otherwise it stops reading, the pipe
fills and the core blocks in send() until the loop catches up.

Liveness: the core speaks at least every HEARTBEAT_INTERVAL_S; `healthy` is
false once nothing came for `heartbeat_timeout` (a hung core), or after
repeated failed steps. If the core dies (EOF), every request it held fails
with a 500 and `on_fatal` is called: the server exits non-zero so that its
supervisor (kubelet, `pagedkube up`) restarts it, rather than answering 500
forever. Every request handed to the core ends exactly once here.
"""
from __future__ import annotations

import asyncio
import logging
import multiprocessing
import queue
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any, Callable

from pagedkube.engine.kv_events import KVEventLog
from pagedkube.engine.server.core_messages import (AbortRequests, AddRequests, CoreReady, LoadLoRA, NewRequest,
                                                   Shutdown, StepMessage, UnloadLoRA)
from pagedkube.engine.server.engine_client import EngineInfo
from pagedkube.engine.server.engine_core import EngineFactory, serve_core, spawn_core
from pagedkube.engine.server.errors import APIError
from pagedkube.engine.server.streams import RequestStream, StreamAborted, StreamError
from pagedkube.openai_errors import ENGINE_DEAD, QUEUE_FULL, SHUTTING_DOWN

if TYPE_CHECKING:
    from pagedkube.engine.llm_engine import EngineStats
    from pagedkube.engine.lora.request import LoRARequest
    from pagedkube.engine.server.metrics import EngineMetrics
    from pagedkube.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

MAX_UNDELIVERED = 2          # step messages queued on the event loop before the reader stops reading
DEFAULT_HEARTBEAT_TIMEOUT_S = 30.0   # silence after which /health fails: 30 heartbeats, or one step that long


class EngineBuildError(RuntimeError):
    """Building the engine failed. `user_error`: the configuration's fault (a model that is not
    there, a limit the model cannot take), which `pagedkube serve` reports as one line."""

    def __init__(self, reason: str, user_error: bool = False):
        super().__init__(f"building the engine failed: {reason}")
        self.reason = reason
        self.user_error = user_error


@dataclass
class _Tracked:
    stream: RequestStream
    arrival: float
    num_prompt_tokens: int
    first_scheduled: float | None = None
    last_token_time: float | None = None
    reasons: set[str] = field(default_factory=set)


class _CoreThread(threading.Thread):
    """--engine-in-process: the same core loop in a thread; closes its pipe end when done
    so that the reader sees EOF exactly as it would for a process."""

    def __init__(self, conn: Connection, factory: EngineFactory):
        super().__init__(name="engine-core", daemon=True)
        self.conn, self.factory = conn, factory
        self.exitcode: int | None = None

    def run(self) -> None:
        try:
            serve_core(self.conn, self.factory)
        finally:
            self.conn.close()

    def kill(self) -> None:   # a thread cannot be killed; shutdown() already asked it to stop
        pass


class EngineCoreClient:
    def __init__(self, factory: EngineFactory, *, in_process: bool = False,
                 heartbeat_timeout: float = DEFAULT_HEARTBEAT_TIMEOUT_S,
                 on_fatal: Callable[[], None] | None = None,
                 launched: tuple[Connection, BaseProcess] | None = None,
                 tokenizer_files: Callable[[], dict[str, str] | None] | None = None):
        """launched: a core already started (engine_core.spawn_core, core_launch.CoreLaunch) for this factory.
        tokenizer_files: where this side can read the files the core will send (None when it
        cannot tell; engine/tokenizer_source.py), to make its tokenizer while the core loads."""
        self._factory = factory
        self._tokenizer_files = tokenizer_files
        self._launched = launched
        self._in_process = in_process
        self.heartbeat_timeout = heartbeat_timeout
        self.on_fatal = on_fatal
        self.metrics: EngineMetrics | None = None
        self.info: EngineInfo | None = None
        self._worker: _CoreThread | BaseProcess | None = None
        self._conn: Connection | None = None
        self._outbox: queue.SimpleQueue[AddRequests | AbortRequests | LoadLoRA | UnloadLoRA | Shutdown | None] = \
            queue.SimpleQueue()
        self._lora_ops: dict[int, asyncio.Future] = {}    # LoadLoRA op_id -> its caller's future
        self._num_lora_ops = 0
        self._undelivered = threading.Semaphore(MAX_UNDELIVERED)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tracked: dict[str, _Tracked] = {}
        self._stats: EngineStats | None = None
        self._pending_seqs = 0
        self._core_healthy = True
        self._last_heard = time.monotonic()
        self._stop = False
        self._dead = False

    # ---- lifecycle ----
    async def start(self) -> EngineInfo:
        """Starts the core (from the event loop's thread: PDEATHSIG follows the creating
        thread) and returns once the engine is built; RuntimeError if building failed."""
        self._loop = asyncio.get_running_loop()
        worker: _CoreThread | BaseProcess
        if self._launched is not None:
            self._conn, worker = self._launched
        elif self._in_process:
            self._conn, child = multiprocessing.Pipe(duplex=True)
            worker = _CoreThread(child, self._factory)
            worker.start()
        else:
            self._conn, worker = spawn_core(self._factory)
        self._worker = worker
        early = self._loop.run_in_executor(None, self._early_tokenizer)
        try:
            first = await self._loop.run_in_executor(None, self._conn.recv)
        except (EOFError, OSError):
            first = None
        if not isinstance(first, CoreReady):
            worker.join(5)
            reason = getattr(first, "message", None) or f"the engine core exited with {worker.exitcode}"
            raise EngineBuildError(reason, user_error=getattr(first, "user_error", False))
        facts = first.facts
        from pagedkube.tokenizer import Tokenizer
        self._stats = facts.stats
        self._last_heard = time.monotonic()
        tokenizer = await early
        if tokenizer is None or tokenizer.files != facts.tokenizer_files:    # the core's files count
            tokenizer = Tokenizer(facts.tokenizer_files) if facts.tokenizer_files else None
        self.info = EngineInfo.from_facts(facts, tokenizer=tokenizer, kv_events=KVEventLog())
        threading.Thread(target=self._send_loop, name="engine-core-sender", daemon=True).start()
        threading.Thread(target=self._read_loop, name="engine-core-reader", daemon=True).start()
        return self.info

    def _early_tokenizer(self) -> Tokenizer | None:
        """The tokenizer of the files this side reads itself, made while the core loads; None
        when it cannot read them or they do not load (the core's files decide either way)."""
        from pagedkube.tokenizer import Tokenizer

        try:
            files = self._tokenizer_files() if self._tokenizer_files is not None else None
            return Tokenizer(files) if files else None
        except Exception:           # a tokenizer.json that does not load: the core's files decide
            logger.debug("no tokenizer made ahead of the core", exc_info=True)
            return None

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stops the core (its requests end with 503) and waits for it; thread-safe."""
        self._stop = True
        if self._worker is None:
            return
        self._outbox.put(Shutdown())
        self._worker.join(timeout)
        if self._worker.is_alive():
            logger.warning("the engine core did not stop in %.0fs: killing it", timeout)
            self._worker.kill()
            self._worker.join(5)
        self._outbox.put(None)

    @property
    def running(self) -> bool:
        return self._worker is not None and not self._dead and not self._stop and self._worker.is_alive()

    @property
    def healthy(self) -> bool:
        return self._core_healthy and time.monotonic() - self._last_heard < self.heartbeat_timeout

    # ---- requests (event loop side) ----
    def add_requests(self, requests: list[NewRequest], stream: RequestStream, *,
                     max_waiting: int | None = None) -> None:
        if self._stop or self._dead:
            raise APIError(503, "the engine is shutting down" if self._stop else "the engine is not running",
                           code=SHUTTING_DOWN if self._stop else ENGINE_DEAD, headers={"Retry-After": "1"})
        num_seqs = sum(r.params.n for r in requests)
        waiting = self._pending_seqs + (self._stats.num_waiting if self._stats is not None else 0)
        if max_waiting is not None and waiting + num_seqs > max_waiting:
            raise APIError(503, f"the waiting queue is full ({waiting} sequences waiting, this request adds "
                           f"{num_seqs}, limit {max_waiting}); retry later", code=QUEUE_FULL,
                           headers={"Retry-After": "1"})
        now = time.monotonic()
        for r in requests:
            self._tracked[r.request_id] = _Tracked(stream, now, len(r.prompt_token_ids))
        self._pending_seqs += num_seqs
        self._outbox.put(AddRequests(list(requests)))

    def abort(self, request_ids: list[str]) -> None:
        aborted = []
        for request_id in request_ids:
            tracked = self._tracked.pop(request_id, None)
            if tracked is not None:
                aborted.append(request_id)
                self._finish_metrics(tracked, "abort")
                tracked.stream.put(StreamAborted(request_id))
        if aborted:
            self._outbox.put(AbortRequests(aborted))

    async def load_lora(self, lora_request: LoRARequest) -> None:
        """Has the core read and check an adapter; APIError 400/404 (or 500) when it cannot serve it."""
        if self._stop or self._dead:
            raise APIError(503, "the engine is not running", code=ENGINE_DEAD)
        assert self._loop is not None
        self._num_lora_ops += 1
        future = self._loop.create_future()
        self._lora_ops[self._num_lora_ops] = future
        self._outbox.put(LoadLoRA(self._num_lora_ops, lora_request))
        status, message = await future
        if status != 200:
            raise APIError(status, message, param="lora_path" if status in (400, 404) else None)

    def unload_lora(self, lora_int_id: int) -> None:
        """Tells the core an adapter is gone; the requests it still runs finish."""
        if not (self._stop or self._dead):
            self._outbox.put(UnloadLoRA(lora_int_id))

    def abort_all(self) -> None:
        self.abort(list(self._tracked))

    def stats(self) -> tuple[EngineStats | None, int]:
        return self._stats, self._pending_seqs

    # ---- the pipe (threads) ----
    def _send_loop(self) -> None:
        conn = self._conn
        assert conn is not None   # started after start() opened the pipe
        while (op := self._outbox.get()) is not None:
            try:
                conn.send(op)
            except (OSError, ValueError):   # the core is gone; the reader reports it
                return

    def _read_loop(self) -> None:
        conn = self._conn
        assert conn is not None   # started after start() opened the pipe
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                self._call_soon(self._on_core_exit)
                return
            self._last_heard = time.monotonic()
            self._undelivered.acquire()     # back-pressure: wait while the loop is behind
            if not self._call_soon(self._on_message, msg):
                return

    def _call_soon(self, fn: Callable[..., None], *args: Any) -> bool:
        assert self._loop is not None   # the threads that call this start after start() set it
        try:
            self._loop.call_soon_threadsafe(fn, *args)
            return True
        except RuntimeError:    # the event loop is closed: nobody is listening any more
            return False

    # ---- the loop side ----
    def _on_message(self, msg: StepMessage) -> None:
        try:
            self._apply(msg)
        finally:
            self._undelivered.release()

    def _apply(self, msg: StepMessage) -> None:
        assert self.info is not None    # messages are read only after start() set it
        for event in msg.kv_events:
            self.info.kv_events.record(event.type, event.block_hashes)
        self._stats = msg.stats
        self._pending_seqs -= msg.num_adds
        self._core_healthy = self._core_healthy and msg.healthy
        for result in msg.lora_results:
            future = self._lora_ops.pop(result.op_id, None)
            if future is not None and not future.done():
                future.set_result((result.status, result.message))
        for err in msg.errors:
            tracked = self._tracked.pop(err.request_id, None)
            if tracked is not None:   # a failed request is no success: vllm:request_success_total skips it
                tracked.stream.put(StreamError(err.request_id, APIError(err.status, err.message)))
        now = time.monotonic()
        for delta in msg.deltas:
            tracked = self._tracked.get(delta.request_id)
            if tracked is None:   # aborted here while the core stepped
                continue
            if tracked.first_scheduled is None:
                tracked.first_scheduled = delta.first_scheduled_time
            new_tokens = sum(len(s.token_ids) for s in delta.samples)
            if new_tokens and self.metrics is not None:
                if tracked.last_token_time is None:
                    self.metrics.on_first_token(now - tracked.arrival, tracked.num_prompt_tokens)
                else:
                    self.metrics.on_inter_token(now - tracked.last_token_time)
                self.metrics.on_generated(new_tokens)
            if new_tokens:
                tracked.last_token_time = now
            tracked.reasons.update(s.finish_reason for s in delta.samples if s.finish_reason)
            tracked.stream.put(delta)
            if delta.finished:
                del self._tracked[delta.request_id]
                reasons = tracked.reasons
                self._finish_metrics(tracked, "stop" if "stop" in reasons or not reasons else reasons.pop())

    def _on_core_exit(self) -> None:
        self._dead = True
        error = (APIError(503, "the engine is shutting down", code=SHUTTING_DOWN) if self._stop
                 else APIError(500, "the engine-core process died", code=ENGINE_DEAD))
        for request_id, tracked in self._tracked.items():
            tracked.stream.put(StreamError(request_id, error))
        self._tracked.clear()
        for future in self._lora_ops.values():
            if not future.done():
                future.set_result((error.status_code, error.message))
        self._lora_ops.clear()
        self._outbox.put(None)
        if not self._stop:
            self._core_healthy = False
            logger.error("the engine core exited unexpectedly (exit code %s): stopping the server",
                         getattr(self._worker, "exitcode", None))
            if self.on_fatal is not None:
                self.on_fatal()

    def _finish_metrics(self, tracked: _Tracked, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.on_request_end(reason, tracked.arrival, tracked.first_scheduled)
