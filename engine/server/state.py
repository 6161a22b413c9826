"""What the handlers of one app share (kept on `app.state.server`, never a module global)."""
from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from pagedkube.engine.server.engine_client import EngineInfo
from pagedkube.engine.server.config import ServerConfig
from pagedkube.echo import echo
from pagedkube.engine.server.errors import DRAINING, NOT_READY, APIError
from pagedkube.piece_cache import CachedEncoder

logger = logging.getLogger("pagedkube.serve")


@dataclass
class ServerState:
    config: ServerConfig
    engine: Any                             # an EngineClient (engine_client.py): EngineCoreClient
    engine_id: str = field(default_factory=lambda: str(uuid.uuid4()))   # the KV event log's, once built
    created: int = field(default_factory=lambda: int(time.time()))
    info: EngineInfo | None = None          # set once the engine is built (lifespan start-up)
    metrics: Any = None                     # EngineMetrics, built with the served model name
    model_name: str = ""
    draining: bool = False                  # after SIGTERM: going away
    drain_requested: bool = False           # POST /drain: a scale-in chose this engine (DELETE /drain undoes it)
    in_flight: int = 0                      # generation requests not yet answered in full
    feed_waiters: Any = None                # cache_feed.FeedWaiters: wakes cache-feed long-polls
    exit_code: int = 0                      # the process's, once it stops: 1 after a fatal engine failure
    stop_server: Any = None                 # set by the HTTP server (draining.py): stops it
    workers: Any = None                     # concurrent.futures executor for huge prompts (serving.prepare)
    _chat_encoder: CachedEncoder | None = field(default=None, repr=False)
    _warned_fields: set[str] = field(default_factory=set, repr=False)

    def fatal(self) -> None:
        """The engine core died: stop serving and exit non-zero, so that a supervisor restarts us."""
        self.exit_code = 1
        if self.stop_server is not None:
            self.stop_server()

    def warn_unknown_fields(self, body: Any) -> None:
        """One warning per unknown request field name for the life of the server (vLLM does the same)."""
        for name in body.unknown_fields():
            if name not in self._warned_fields:
                self._warned_fields.add(name)
                logger.warning("ignoring unknown request field %r (logged once)", name)

    def chat_encoder(self) -> CachedEncoder:
        """Encodes rendered chats, caching each message's tokens (a conversation
        re-sends its history every turn). Only the event loop calls it."""
        if self._chat_encoder is None:
            self._chat_encoder = CachedEncoder(self.info.tokenizer)
        return self._chat_encoder

    @property
    def refusing(self) -> bool:
        """New generation requests get 503 `draining` (and /ready 503): shutting down, or drained."""
        return self.draining or self.drain_requested

    @property
    def ready(self) -> bool:
        return self.info is not None and not self.refusing and self.engine.running and self.engine.healthy

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(404, f"The model `{echo(model)}` does not exist.", param="model", code="model_not_found")

    def check_accepting(self) -> None:
        if self.refusing:
            why = "shutting down" if self.draining else "draining for a scale-in"
            raise APIError(503, f"the server is {why}; retry on another replica",
                           code=DRAINING, headers={"Retry-After": "1"})
        if not self.ready:
            raise APIError(503, "the engine is not ready", code=NOT_READY, headers={"Retry-After": "1"})
