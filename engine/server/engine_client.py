"""What the HTTP side needs from an engine: `EngineClient`, and the facts it learns at start.

The server depends on this protocol only. Its one implementation is
`core_client.EngineCoreClient`, which drives the engine core (engine_core.py)
in its own process, or in a thread with --engine-in-process; tests may pass any
object with this shape.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Protocol

from pagedkube.engine.server.core_messages import EngineFacts, NewRequest
from pagedkube.engine.server.streams import RequestStream

if TYPE_CHECKING:   # annotations only (metrics.py pulls prometheus_client, tokenizer.py tokenizers)
    from pagedkube.engine.kv_events import KVEventLog
    from pagedkube.engine.llm_engine import EngineStats
    from pagedkube.engine.lora.request import LoRARequest
    from pagedkube.engine.server.metrics import EngineMetrics
    from pagedkube.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class EngineInfo(EngineFacts):
    """What the core reported once it was built (EngineFacts), and what the HTTP side
    made of it: the tokenizer loaded from its files and the cache feed's event log."""
    tokenizer: Tokenizer | None   # None for a model without tokenizer.json
    kv_events: KVEventLog         # the log the cache feed reads (it lives in the HTTP process)

    @classmethod
    def from_facts(cls, facts: EngineFacts, tokenizer: Tokenizer | None, kv_events: KVEventLog) -> EngineInfo:
        return cls(**{f.name: getattr(facts, f.name) for f in fields(EngineFacts)},
                   tokenizer=tokenizer, kv_events=kv_events)


class EngineClient(Protocol):
    info: EngineInfo | None
    metrics: EngineMetrics | None   # set by the app once the model name is known; the client feeds it

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

    async def load_lora(self, lora_request: LoRARequest) -> None:
        """Reads and checks an adapter in the engine; APIError 400/404 when it cannot be served."""

    def unload_lora(self, lora_int_id: int) -> None:
        """The adapter is gone from the API; requests already running under it finish."""

    def stats(self) -> tuple[EngineStats | None, int]:
        """(EngineStats after the last step, sequences handed over but not yet taken)."""
