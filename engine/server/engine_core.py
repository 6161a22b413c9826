"""The engine core: owns the LLMEngine and steps it in a loop (vLLM v1's EngineCore).

It runs in its own process by default (no GIL shared with the HTTP event loop),
or in a thread of the HTTP process with --engine-in-process; either way over the
same pipe and the same messages (core_messages.py), so there is one driver.

The loop: take what the pipe holds (adds, aborts, shutdown), step the engine if
it has work, send one StepMessage with what the step produced. While idle it
waits on the pipe and still sends an (empty) StepMessage every
HEARTBEAT_INTERVAL_S: the HTTP side's liveness check reads those. A blocking
send is back-pressure: while the HTTP process is behind, the core does not run
ahead of it. In its own process the core dies with the HTTP process
(PR_SET_PDEATHSIG, and EOF on the pipe) and ignores SIGINT/SIGTERM: the HTTP
process decides when it stops (a drain needs the engine until the end).
"""
from __future__ import annotations

import logging
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Callable, NoReturn

from pagedkube.engine.distributed.errors import WorkerFailed
from pagedkube.engine.server.core_launch import CoreLaunch
from pagedkube.engine.server.core_messages import (HEARTBEAT_INTERVAL_S, AbortRequests, AddRequests, CoreFailed,
                                                   CoreReady, EngineFacts, KVEvent, LoadLoRA, LoRAResult,
                                                   RequestError, Shutdown, StepMessage, UnloadLoRA)

if TYPE_CHECKING:
    from pagedkube.engine.config import EngineConfig
    from pagedkube.engine.llm_engine import LLMEngine

logger = logging.getLogger(__name__)

MAX_CONSECUTIVE_STEP_FAILURES = 3   # then the engine reports itself unhealthy (/health 500)
MAX_OPS_PER_STEP = 64               # pipe messages taken between two steps: a flood of adds cannot stall decoding

EngineFactory = Callable[..., "LLMEngine"]   # factory(kv_event_sink=callable) -> LLMEngine


def build_engine(engine_config: EngineConfig, kv_event_sink: Callable[[str, list[bytes]], None] | None = None) -> LLMEngine:
    """The default factory, as functools.partial(build_engine, config): picklable, and defined
    here so the spawned core process imports only what the engine needs (not the HTTP app)."""
    from pagedkube.engine.llm_engine import LLMEngine
    return LLMEngine(engine_config, kv_event_sink=kv_event_sink)


class EngineCore:
    def __init__(self, factory: EngineFactory, conn: Connection):
        self.conn = conn
        self.msg = StepMessage()
        self.engine = factory(kv_event_sink=self._record_kv_event)
        self.live: set[str] = set()   # requests the engine holds, for failing them all at once
        self.failures = 0
        self.aborted = False          # an abort changed the stats: send them even if nothing else happened
        self.last_sent = time.monotonic()

    def facts(self) -> EngineFacts:
        engine, stats = self.engine, self.engine.stats()
        return EngineFacts(
            tokenizer_files=dict(engine.tokenizer_files) if engine.tokenizer_files is not None else None,
            vocab_size=engine.vocab_size, model_name=engine.model_name, max_model_len=engine.max_model_len,
            block_size=engine.block_size, hash_seed=getattr(engine.config, "hash_seed", ""),
            num_kv_blocks=stats.num_kv_blocks, eos_token_ids=list(engine.eos_token_ids), stats=stats)

    def _record_kv_event(self, event_type: str, block_hashes: list[bytes]) -> None:
        self.msg.kv_events.append(KVEvent(event_type, list(block_hashes)))

    def run(self) -> None:
        engine, conn = self.engine, self.conn
        while True:
            busy = engine.has_unfinished_requests()
            wait = 0.0 if busy else max(0.0, HEARTBEAT_INTERVAL_S - (time.monotonic() - self.last_sent))
            if conn.poll(wait):
                for _ in range(MAX_OPS_PER_STEP):
                    op = conn.recv()
                    if isinstance(op, Shutdown):
                        self._fail_all(503, "the engine is shutting down")
                        self._send()
                        engine.shutdown()
                        return
                    self._apply(op)
                    if not conn.poll(0):
                        break
            if engine.has_unfinished_requests():
                self._step()
            if not self.msg.empty or self.aborted or time.monotonic() - self.last_sent >= HEARTBEAT_INTERVAL_S:
                try:
                    self.engine.check_workers()   # a worker that died while the engine was idle
                except WorkerFailed as exc:
                    self._die(exc)
                self._send()

    def _step(self) -> None:
        try:
            deltas = self.engine.step_deltas()
        except WorkerFailed as exc:   # a tensor-parallel rank is gone: no step can run any more
            self._die(exc)
        except Exception as exc:  # one bad step must not kill the server
            self.failures += 1
            logger.exception("engine step failed (%d in a row)", self.failures)
            self._fail_all(500, f"engine step failed: {type(exc).__name__}: {exc}")
            return
        self.failures = 0
        for delta in deltas:
            if delta.error is not None:     # failed before it ran (its grammar did not compile): the client's 400
                self.msg.errors.append(RequestError(delta.request_id, 400, delta.error))
            else:
                self.msg.deltas.append(delta)
            if delta.finished:
                self.live.discard(delta.request_id)

    def _die(self, exc: WorkerFailed) -> NoReturn:
        """Fails every request in flight, tells the HTTP process, and ends the core with `exc`:
        the process exits non-zero and the server after it (engine/distributed/errors.py)."""
        logger.error("the engine cannot step any more: %s", exc)
        self.failures = MAX_CONSECUTIVE_STEP_FAILURES
        self._fail_all(500, f"the engine failed: {exc}")
        self._send()
        raise exc

    def _send(self) -> None:
        msg, self.msg = self.msg, StepMessage()
        msg.stats = self.engine.stats()
        msg.healthy = self.failures < MAX_CONSECUTIVE_STEP_FAILURES
        self.aborted = False
        self.conn.send(msg)           # blocks while the HTTP process is behind: back-pressure
        self.last_sent = time.monotonic()

    def _apply(self, op: AddRequests | AbortRequests | LoadLoRA | UnloadLoRA) -> None:
        if isinstance(op, AddRequests):
            for req in op.requests:
                self.msg.num_adds += req.params.n
                try:
                    self.engine.add_request(req.request_id, req.prompt_token_ids, req.params,
                                            cache_salt=req.cache_salt, group=req.group,
                                            lora_request=req.lora_request)
                except ValueError as exc:
                    self.msg.errors.append(RequestError(req.request_id, 400, str(exc)))
                except Exception as exc:
                    logger.exception("add_request(%s) failed", req.request_id)
                    self.msg.errors.append(RequestError(req.request_id, 500, f"{type(exc).__name__}: {exc}"))
                else:
                    self.live.add(req.request_id)
        elif isinstance(op, AbortRequests):
            for request_id in op.request_ids:
                if request_id in self.live:
                    self.live.discard(request_id)
                    self.aborted = True
                    self._abort(request_id)
        elif isinstance(op, LoadLoRA):
            self.msg.lora_results.append(self._load_lora(op))
        elif isinstance(op, UnloadLoRA):
            self.engine.remove_lora(op.lora_int_id)
        else:
            raise TypeError(f"unknown engine-core operation {op!r}")

    def _load_lora(self, op: LoadLoRA) -> LoRAResult:
        """Reads and checks the adapter between two steps; a bad one is the caller's 400/404."""
        try:
            self.engine.add_lora(op.lora_request)
        except ValueError as exc:
            return LoRAResult(op.op_id, 404 if getattr(exc, "not_found", False) else 400, str(exc))
        except Exception as exc:
            logger.exception("loading adapter %s failed", op.lora_request.lora_name)
            return LoRAResult(op.op_id, 500, f"{type(exc).__name__}: {exc}")
        return LoRAResult(op.op_id, 200)

    def _abort(self, request_id: str) -> None:
        try:
            self.engine.abort_request(request_id)
        except Exception:
            logger.exception("abort_request(%s) failed", request_id)

    def _fail_all(self, status: int, message: str) -> None:
        for request_id in sorted(self.live):
            self._abort(request_id)
            self.msg.errors.append(RequestError(request_id, status, message))
        self.live.clear()


def serve_core(conn: Connection, factory: EngineFactory) -> None:
    """Builds the engine, reports CoreReady/CoreFailed, then runs until Shutdown or EOF."""
    try:
        core = EngineCore(factory, conn)
        ready = CoreReady(core.facts())
    except ValueError as exc:     # the user's mistake (a model that is not there, a limit too big)
        logger.debug("building the engine failed", exc_info=True)
        conn.send(CoreFailed(str(exc), user_error=True))
        return
    except BaseException as exc:  # reported to the HTTP process, which fails start-up
        logger.exception("building the engine failed")
        conn.send(CoreFailed(f"{type(exc).__name__}: {exc}"))
        return
    conn.send(ready)
    try:
        # The core detokenizes (stop strings): its tokenizer is built now, after the ready
        # message, while the HTTP process builds its own, rather than before it (start-up) or
        # in the first request. A tokenizer.json that does not load fails the HTTP side's too.
        try:
            _ = core.engine.tokenizer
        except Exception:         # the HTTP side's own build fails start-up, with the reason
            logger.warning("the tokenizer does not load", exc_info=True)
        core.run()
    except (EOFError, OSError):   # the HTTP process went away
        pass


def spawn_core(factory: EngineFactory) -> tuple[Connection, BaseProcess]:
    """Starts the core process and gives it its engine at once; (this end of its pipe, the
    process). Call it from the thread that will run the event loop (PR_SET_PDEATHSIG follows the
    creating thread). `pagedkube serve` starts the process earlier, before reading its flags
    (core_launch.py), so the core's torch import overlaps this process's start."""
    return CoreLaunch.start().serve(factory, logging.getLogger().level)
