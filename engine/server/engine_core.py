"""The engine-core process: owns the LLMEngine and steps it in a loop (vLLM v1's EngineCore).

    HTTP process (core_client.py)                      engine-core process (this module)
    -----------------------------                      ---------------------------------
    ("add", [(rid, prompt_ids, params, salt), ...]) -->  engine.add_request (ValueError -> 400 for that rid)
    ("abort", [rid, ...])                           -->  engine.abort_request
    ("stop",)                                       -->  fail what runs (503), exit
                                                    <--  ("ready", EngineFacts) | ("failed", message)
                                                    <--  ("step", StepMessage) once per loop turn that did something

A StepMessage carries DELTAS (new token ids, new text, new logprobs) of every
request that progressed, the add errors, the KV events the pool recorded, a
stats snapshot and the engine's health, so per-step IPC is O(batch), not
O(batch x length). The core dies with the HTTP process: PR_SET_PDEATHSIG plus
EOF on the pipe. It ignores SIGINT/SIGTERM: the HTTP process decides when it
stops (the drain needs the engine until the end).
"""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from pagedkube.engine.server.async_engine import plain_facts

logger = logging.getLogger(__name__)

MAX_CONSECUTIVE_STEP_FAILURES = 3   # then the engine reports itself unhealthy (/health 500)
IDLE_STEP_BACKOFF_S = 0.001         # a step that scheduled nothing while requests wait: pause, do not spin
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class EngineFacts:
    """What the HTTP process needs to know about the engine, sent once after it is built."""
    tokenizer_files: dict | None
    plain: dict              # async_engine.plain_facts: EngineInfo's plain fields
    engine_id: str           # the KV event log's id (the cache feed's engine_id)
    max_events: int
    stats: Any


@dataclass
class StepMessage:
    # (request_id, finished, num_cached_tokens, first_scheduled_time, [sample delta, ...]) where a sample
    # delta is (index, tokens_kept, new_token_ids, text_kept, new_text, finish_reason, stop_reason,
    # new_logprobs | None, cumulative_logprob); *_kept says how much of what was sent before stays.
    outputs: list[tuple] = field(default_factory=list)
    errors: list[tuple[str, int, str]] = field(default_factory=list)   # (request_id, status, message)
    kv_events: list[tuple[str, list[bytes]]] = field(default_factory=list)
    num_adds: int = 0
    stats: Any = None
    healthy: bool = True


def _die_with_parent(parent_pid: int) -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the pipe EOF still ends the loop
        pass
    if os.getppid() != parent_pid:     # the parent died before prctl took effect
        os._exit(1)


class _Sent:
    __slots__ = ("tokens", "text")

    def __init__(self) -> None:
        self.tokens = 0
        self.text = ""


class EngineCore:
    def __init__(self, engine: Any, conn: Any):
        self.engine = engine
        self.conn = conn
        self.sent: dict[str, list[_Sent]] = {}
        self.failures = 0
        self.aborted = False     # an abort changed the stats: send them even if nothing else happened
        self.msg = StepMessage()
        pool = engine.kv_manager.pool
        record = pool.event_sink

        def tee(event_type: str, block_hashes: list[bytes]) -> None:
            if record is not None:
                record(event_type, block_hashes)
            self.msg.kv_events.append((event_type, list(block_hashes)))
        pool.event_sink = tee

    def run(self) -> None:
        engine, conn = self.engine, self.conn
        has_work = False
        while True:
            if not has_work:
                conn.poll(None)
            while conn.poll(0):
                op = conn.recv()
                if op[0] == "stop":
                    self._fail_all(503, "the engine is shutting down")
                    self._flush()
                    return
                self._apply(op)
            outputs = None
            if engine.has_unfinished_requests():
                step_start = time.monotonic()
                try:
                    outputs = engine.step()
                except Exception as exc:  # noqa: BLE001 - one bad step must not kill the server
                    self.failures += 1
                    logger.exception("engine step failed (%d in a row)", self.failures)
                    self._fail_all(500, f"engine step failed: {type(exc).__name__}: {exc}")
                else:
                    self.failures = 0
                    self._deltas(outputs, step_start)
            has_work = engine.has_unfinished_requests()
            self._flush()
            if has_work and outputs == []:
                conn.poll(IDLE_STEP_BACKOFF_S)

    def _flush(self) -> None:
        msg = self.msg
        if not (msg.outputs or msg.errors or msg.kv_events or msg.num_adds or self.aborted):
            return
        self.aborted = False
        msg.stats = self.engine.stats()
        msg.healthy = self.failures < MAX_CONSECUTIVE_STEP_FAILURES
        self.msg = StepMessage()
        self.conn.send(("step", msg))

    def _apply(self, op: tuple) -> None:
        if op[0] == "add":
            for request_id, prompt_ids, params, salt in op[1]:
                self.msg.num_adds += 1
                try:
                    self.engine.add_request(request_id, prompt_ids, params, cache_salt=salt)
                except ValueError as exc:
                    self.msg.errors.append((request_id, 400, str(exc)))
                except Exception as exc:  # noqa: BLE001
                    logger.exception("add_request(%s) failed", request_id)
                    self.msg.errors.append((request_id, 500, f"{type(exc).__name__}: {exc}"))
                else:
                    self.sent[request_id] = [_Sent() for _ in range(params.n)]
        elif op[0] == "abort":
            for request_id in op[1]:
                if self.sent.pop(request_id, None) is not None:
                    self.aborted = True
                    try:
                        self.engine.abort_request(request_id)
                    except Exception:  # noqa: BLE001
                        logger.exception("abort_request(%s) failed", request_id)
        else:
            raise ValueError(f"unknown engine-core operation {op[0]!r}")

    def _deltas(self, outputs: list[Any], step_start: float) -> None:
        for out in outputs:
            sent = self.sent.get(out.request_id)
            if sent is None:
                continue
            samples = []
            for c in out.outputs:
                s = sent[c.index]
                kept = s.tokens if len(c.token_ids) >= s.tokens else 0
                text_kept = len(s.text) if c.text.startswith(s.text) else 0
                logprobs = c.logprobs[kept:] if c.logprobs is not None else None
                samples.append((c.index, kept, c.token_ids[kept:], text_kept, c.text[text_kept:],
                                c.finish_reason, c.stop_reason, logprobs, c.cumulative_logprob))
                s.tokens, s.text = len(c.token_ids), c.text
            first = (out.metrics or {}).get("first_scheduled_time", step_start)
            self.msg.outputs.append((out.request_id, out.finished, out.num_cached_tokens, first, samples))
            if out.finished:
                del self.sent[out.request_id]

    def _fail_all(self, status: int, message: str) -> None:
        for request_id in list(self.sent):
            try:
                self.engine.abort_request(request_id)
            except Exception:  # noqa: BLE001
                logger.exception("abort_request(%s) failed", request_id)
            self.msg.errors.append((request_id, status, message))
        self.sent.clear()


def run_engine_core(conn: Any, engine_factory: Callable[[], Any], parent_pid: int, log_level: int) -> None:
    """The core process's entry point (multiprocessing "spawn" target)."""
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s [core]: %(message)s")
    try:
        engine = engine_factory()
        tokenizer, stats = engine.tokenizer, engine.stats()
        facts = EngineFacts(
            tokenizer_files=dict(tokenizer.files) if tokenizer is not None else None,
            plain=plain_facts(engine, stats), engine_id=engine.kv_events.engine_id,
            max_events=engine.kv_events.max_events, stats=stats)
        core = EngineCore(engine, conn)
    except BaseException as exc:  # noqa: BLE001 - reported to the HTTP process, which fails start-up
        logger.exception("building the engine failed")
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", facts))
    try:
        core.run()
    except (EOFError, OSError):   # the HTTP process went away
        pass
