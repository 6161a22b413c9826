"""What the handlers of one app share (kept on `app.state.server`, never a module global)."""
from __future__ import annotations

import concurrent.futures
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Protocol

from pagedkube.engine.server.config import ServerConfig
from pagedkube.engine.server.constraints import ConstraintCheck
from pagedkube.engine.server.engine_client import EngineClient, EngineInfo
from pagedkube.engine.server.errors import APIError
from pagedkube.engine.server.lora_routes import LoRARegistry, resolve_model
from pagedkube.openai_errors import DRAINING, NOT_READY
from pagedkube.piece_cache import CachedEncoder

if TYPE_CHECKING:
    from pagedkube.engine.lora.request import LoRARequest
    from pagedkube.engine.server.cache_feed import FeedWaiters
    from pagedkube.engine.server.metrics import EngineMetrics
    from pagedkube.engine.server.tool_parsers import ToolParser

logger = logging.getLogger("pagedkube.serve")


class RequestBody(Protocol):
    """A parsed request (protocol.py) that kept the names of the fields it ignored."""
    def unknown_fields(self) -> list[str]: ...


@dataclass
class ServerState:
    config: ServerConfig
    engine: EngineClient                    # engine_client.py; the app's is a core_client.EngineCoreClient
    workers: concurrent.futures.Executor    # tokenizes huge prompts off the event loop (prepare.prepare)
    engine_id: str = field(default_factory=lambda: str(uuid.uuid4()))   # the KV event log's, once built
    created: int = field(default_factory=lambda: int(time.time()))
    metrics: EngineMetrics | None = None    # built with the served model name (lifespan start-up)
    model_name: str = ""
    draining: bool = False                  # after SIGTERM: going away
    drain_requested: bool = False           # POST /drain: a scale-in chose this engine (DELETE /drain undoes it)
    in_flight: int = 0                      # generation requests not yet answered in full
    feed_waiters: FeedWaiters | None = None  # wakes cache-feed long-polls (lifespan start-up)
    startup_error: str | None = None        # building the engine failed by the user's mistake (one line)
    exit_code: int = 0                      # the process's, once it stops: 1 after a fatal engine failure
    stop_server: Callable[[], None] | None = None   # set by the HTTP server (draining.py): stops it
    tool_parser: ToolParser | None = None   # for tool_choice "auto" (tool_parsers.py), set with info
    sampling_defaults: dict[str, float | int] = field(default_factory=dict)   # --generation-config's, set with info
    constraint_check: ConstraintCheck = field(default_factory=ConstraintCheck)   # parses each new constraint once
    loras: LoRARegistry = field(default_factory=LoRARegistry)   # adapters served by name (lora_routes.py)
    _info: EngineInfo | None = field(default=None, repr=False)
    _chat_encoder: CachedEncoder | None = field(default=None, repr=False)
    _warned_fields: set[str] = field(default_factory=set, repr=False)

    def fatal(self) -> None:
        """The engine core died: stop serving and exit non-zero, so that a supervisor restarts us."""
        self.exit_code = 1
        if self.stop_server is not None:
            self.stop_server()

    @property
    def loaded(self) -> bool:
        """The engine is built and has reported its facts (the lifespan's start-up is done)."""
        return self._info is not None

    @property
    def info(self) -> EngineInfo:
        """What the engine reported once built; APIError 503 `not_ready` before that."""
        if self._info is None:
            raise APIError(503, "the engine is not ready", code=NOT_READY, headers={"Retry-After": "1"})
        return self._info

    @info.setter
    def info(self, info: EngineInfo) -> None:
        self._info = info

    def warn_unknown_fields(self, body: RequestBody) -> None:
        """One warning per unknown request field name for the life of the server (vLLM does the same)."""
        for name in body.unknown_fields():
            if name not in self._warned_fields:
                self._warned_fields.add(name)
                logger.warning("ignoring unknown request field %r (logged once)", name)

    def chat_encoder(self) -> CachedEncoder:
        """Encodes rendered chats, caching each message's tokens (a conversation
        re-sends its history every turn). Only the event loop calls it."""
        if self._chat_encoder is None:
            tokenizer = self.info.tokenizer
            assert tokenizer is not None, "callers check for a tokenizer first (prepare.tokenizer_for)"
            self._chat_encoder = CachedEncoder(tokenizer)
        return self._chat_encoder

    @property
    def refusing(self) -> bool:
        """New generation requests get 503 `draining` (and /ready 503): shutting down, or drained."""
        return self.draining or self.drain_requested

    @property
    def ready(self) -> bool:
        return self.loaded and not self.refusing and self.engine.running and self.engine.healthy

    def check_model(self, model: str | None) -> LoRARequest | None:
        """The adapter `model` names (None: the base model); APIError 404 for any other name."""
        return resolve_model(self, model)

    def check_accepting(self) -> None:
        if self.refusing:
            why = "shutting down" if self.draining else "draining for a scale-in"
            raise APIError(503, f"the server is {why}; retry on another replica",
                           code=DRAINING, headers={"Retry-After": "1"})
        if not self.ready:
            raise APIError(503, "the engine is not ready", code=NOT_READY, headers={"Retry-After": "1"})
