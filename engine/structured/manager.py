"""The engine's structured-outputs seam (vLLM's StructuredOutputManager).

    add_request ──> submit ──(grammar compiled?)── yes ──> scheduler
                       │ no: parked here, the compile runs in GrammarCompiler's pool
    each step:   poll ──> compiled: to the scheduler | failed or past the deadline: an error
                 bitmask(rows that sample) ──> Sampler masks their logits
                 accept(token) after sampling ──> the grammar moves on

A constrained request never reaches the scheduler before its grammar exists,
so the step loop never waits for a compile (and the prefix cache, preemption
and the scheduler know nothing of grammars). Each sequence owns its grammar
state (Sequence.grammar): the n samples of a request each start at the
grammar's beginning, and a preempted sequence keeps its state, since
recomputing its KV changes none of its tokens. Requests without a constraint
cost one attribute check per sampled row; the compiler (and its tokenizer
tables) is built on the first constrained request.
"""
from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass
from typing import Any, Callable

from pagedkube.engine.sequence import Sequence
from pagedkube.engine.structured.grammars import GrammarCompiler


@dataclass
class _Parked:
    seqs: list[Sequence]
    future: concurrent.futures.Future

    def compiling_for(self, now: float) -> float:
        """Seconds since a compile thread took this grammar up (0 while it queues)."""
        started = getattr(self.future, "started", None)
        return now - started[0] if started else 0.0


class StructuredOutputManager:
    def __init__(self, make_compiler: Callable[[], GrammarCompiler], compile_timeout: float):
        self._make_compiler = make_compiler
        self._compiler: GrammarCompiler | None = None
        self.compile_timeout = compile_timeout
        self._parked: dict[str, _Parked] = {}
        self._bitmask: Any = None           # reused between steps, grown when a step needs more rows

    @property
    def compiler(self) -> GrammarCompiler:
        if self._compiler is None:
            self._compiler = self._make_compiler()
        return self._compiler

    @property
    def num_parked(self) -> int:
        return len(self._parked)

    def submit(self, request_id: str, seqs: list[Sequence]) -> bool:
        """True when the grammar is ready and every sequence has its state (queue them now);
        False when the request is parked until poll() hands it back."""
        params = seqs[0].params.structured_outputs
        assert params is not None, "only constrained requests are submitted"
        future = self.compiler.compile(params)
        if future.done() and future.exception() is None:
            self._attach(seqs, future.result())
            return True
        self._parked[request_id] = _Parked(seqs, future)
        return False

    def _attach(self, seqs: list[Sequence], compiled: Any) -> None:
        for seq in seqs:
            seq.grammar = self.compiler.state(compiled)

    def poll(self) -> tuple[list[tuple[str, list[Sequence]]], list[tuple[str, str]]]:
        """(requests whose grammar is now ready, (request id, error) of those that failed)."""
        ready, failed = [], []
        now = time.monotonic()
        for request_id, parked in list(self._parked.items()):
            if parked.future.done():
                del self._parked[request_id]
                exc = parked.future.exception()
                if exc is None:
                    self._attach(parked.seqs, parked.future.result())
                    ready.append((request_id, parked.seqs))
                else:
                    failed.append((request_id, str(exc)))
            elif parked.compiling_for(now) >= self.compile_timeout:
                del self._parked[request_id]
                kind = parked.seqs[0].params.structured_outputs.kind  # type: ignore[union-attr]  # parked: constrained
                failed.append((request_id, f"{kind}: the constraint did not compile within "
                                           f"{self.compile_timeout:g} s"))
        return ready, failed

    def wait(self, timeout: float) -> None:
        """Block up to `timeout` s for a parked compile (the engine has nothing else to run)."""
        if self._parked:
            concurrent.futures.wait([p.future for p in self._parked.values()], timeout=timeout,
                                    return_when=concurrent.futures.FIRST_COMPLETED)

    def abort(self, request_id: str) -> bool:
        """Drop a parked request; True if it was parked (it never reached the scheduler)."""
        return self._parked.pop(request_id, None) is not None

    def bitmask(self, seqs: list[Sequence]) -> tuple[Any, list[int]] | None:
        """The next-token bitmask of the constrained rows among `seqs` (int32 [len(rows), words])
        and those rows' indices; None when no row is constrained (the sampler does nothing)."""
        rows = [i for i, seq in enumerate(seqs) if seq.grammar is not None]
        if not rows:
            return None
        if self._bitmask is None or self._bitmask.shape[0] < len(rows):
            self._bitmask = self.compiler.allocate_bitmask(max(len(rows), 8))
        bitmask = self._bitmask[:len(rows)]
        for j, i in enumerate(rows):
            grammar = seqs[i].grammar
            assert grammar is not None
            grammar.fill(bitmask, j)
        return bitmask, rows

    @staticmethod
    def accept(seq: Sequence, token_id: int) -> bool:
        """Move seq's grammar past its new token; False if the grammar rejects it (it cannot, since
        the token was drawn from the grammar's mask) or has ended (the sequence must stop)."""
        grammar = seq.grammar
        assert grammar is not None
        return grammar.accept(token_id) and not grammar.terminated

    def close(self) -> None:
        if self._compiler is not None:
            self._compiler.close()
