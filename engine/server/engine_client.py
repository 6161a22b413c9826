"""What the HTTP side needs from an engine: `EngineClient`, and the facts it learns at start.

The server depends on this protocol only. Its one implementation is
`core_client.EngineCoreClient`, which drives the engine core (engine_core.py)
in its own process, or in a thread with --engine-in-process; tests may pass any
object with this shape.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from pagedkube.engine.server.core_messages import NewRequest
from pagedkube.engine.server.streams import RequestStream


@dataclass(frozen=True)
class EngineInfo:
    """Read-only facts about the engine, known once it is built."""
    tokenizer: Any          # pagedkube.tokenizer.Tokenizer, or None for a model without tokenizer.json
    vocab_size: int
    model_name: str
    max_model_len: int
    block_size: int
    hash_seed: str
    num_kv_blocks: int
    eos_token_ids: list[int]
    kv_events: Any          # the KVEventLog the cache feed reads (it lives in the HTTP process)


class EngineClient(Protocol):
    info: EngineInfo | None
    metrics: Any

    async def start(self) -> EngineInfo:
        """Builds the engine; returns once it takes requests (RuntimeError if building failed)."""

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stops the engine (what runs ends with a 503) and waits for it; thread-safe."""

    @property
    def running(self) -> bool:
        """The engine is up and not stopping."""

    @property
    def healthy(self) -> bool:
        """Its steps succeed and it answered within the heartbeat timeout."""

    def add_requests(self, requests: list[NewRequest], stream: RequestStream, *,
                     max_waiting: int | None = None) -> None:
        """Hands requests to the engine, all or none; their RequestDeltas (or a StreamError)
        arrive on `stream`. APIError 503 when stopping or when the waiting queue, counted in
        sequences, would grow past `max_waiting`."""

    def abort(self, request_ids: list[str]) -> None:
        """Ends the requests now: their streams get StreamAborted, their blocks go back."""

    def abort_all(self) -> None: ...

    def stats(self) -> tuple[Any, int]:
        """(EngineStats after the last step, sequences handed over but not yet taken)."""
