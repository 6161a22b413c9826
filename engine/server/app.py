"""The engine server's FastAPI app: `create_app(config)`.

Everything an app needs lives on `app.state.server` (a ServerState), built here
and filled in by the lifespan once the engine is up; two apps in one process
share nothing. The engine is built and stepped by the engine core in its own
process (engine_core.py, driven through core_client.py; in a thread with
--engine-in-process) during start-up, so the server answers only once the model
is loaded.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import hmac
import logging
from contextlib import asynccontextmanager
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from pagedkube.access_log import AccessLog
from pagedkube.engine.server.access_log import LOGGER as ACCESS_LOGGER, EngineAccessMiddleware
from pagedkube.engine.server.cache_feed import FeedWaiters, router as cache_router
from pagedkube.engine.server.config import ServerConfig
from pagedkube.engine.server.core_client import EngineBuildError, EngineCoreClient
from pagedkube.engine.server.engine_core import EngineFactory, build_engine
from pagedkube.engine.server.errors import APIError, install_error_handlers
from pagedkube.engine.server.http_counting import CountHTTPResponses
from pagedkube.engine.server.lora_file import LoRAFileFollower
from pagedkube.engine.server.lora_routes import load_adapter, router as lora_router
from pagedkube.engine.server.metrics import EngineMetrics
from pagedkube.engine.server.openai_routes import router as openai_router
from pagedkube.engine.server.state import ServerState
from pagedkube.engine.server.sampling_defaults import sampling_defaults
from pagedkube.engine.server.tool_parsers import resolve as resolve_tool_parser
from pagedkube.engine.tokenizer_source import local_tokenizer_files
from pagedkube.http_limits import BodyLimits
from pagedkube.openai_errors import DRAINING, ENGINE_UNHEALTHY, INVALID_API_KEY, NOT_READY, error_body
from pagedkube.tracing import build_tracing

logger = logging.getLogger(__name__)

# Reachable without the API key: probes and scrapes (as vLLM leaves them open).
OPEN_PATHS = ("/health", "/ready", "/metrics")
# Threads that tokenize huge prompts (prepare.prepare). Two: on a 2-core node one can
# tokenize while the engine core steps; more would only queue on the same cores.
PREPARE_WORKERS = 2


class APIKeyMiddleware:
    """Pure ASGI (a BaseHTTPMiddleware would get in the way of streaming and of
    disconnect detection): every path but OPEN_PATHS needs `Authorization: Bearer KEY`."""

    def __init__(self, app: Any, api_key: str):
        self.app = app
        self.expected = api_key.encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        # RFC 9110: the scheme is case-insensitive (`bearer` too), one or more spaces before the token.
        scheme, _, token = dict(scope.get("headers") or []).get(b"authorization", b"").partition(b" ")
        if scheme.lower() == b"bearer" and hmac.compare_digest(token.lstrip(b" "), self.expected):
            return await self.app(scope, receive, send)
        response = JSONResponse(error_body(401, "Incorrect API key provided (expected `Authorization: Bearer KEY`)",
                                           code=INVALID_API_KEY), status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)


def create_app(config: ServerConfig, engine_factory: EngineFactory | None = None,
               launched: tuple[Connection, BaseProcess] | None = None) -> FastAPI:
    """launched: the engine core already started (engine_core.spawn_core, core_launch.CoreLaunch) for engine_factory."""
    factory = engine_factory or functools.partial(build_engine, config.engine)
    # The engine steps in its own process by default (no GIL shared with the HTTP event
    # loop); --engine-in-process runs the same core in a thread of this one, for debugging.
    engine = EngineCoreClient(factory, in_process=config.engine_in_process, launched=launched,
                              heartbeat_timeout=config.heartbeat_timeout, on_fatal=lambda: state.fatal(),
                              tokenizer_files=functools.partial(local_tokenizer_files, config.engine))
    state = ServerState(config=config, engine=engine,
                        workers=concurrent.futures.ThreadPoolExecutor(PREPARE_WORKERS, thread_name_prefix="prepare"))
    tracing = build_tracing("pagedkube-engine", config.observability.otlp_traces_endpoint)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        try:
            info = await state.engine.start()
        except EngineBuildError as exc:
            if exc.user_error:
                state.startup_error = exc.reason   # serve_cli prints it as one line and exits 2
            raise
        state.model_name = config.served_model_name or info.model_name
        state.engine_id = info.kv_events.engine_id
        state.metrics = EngineMetrics(state.model_name, state.engine.stats,
                                      max_lora=config.engine.max_loras if config.engine.enable_lora else None)
        state.engine.metrics = state.metrics
        state.feed_waiters = FeedWaiters(asyncio.get_running_loop())
        info.kv_events.subscribe(state.feed_waiters.notify)
        state.info = info
        for module in config.lora_modules:   # a bad one fails start-up, with the reason
            try:
                await load_adapter(state, module)
            except APIError as e:
                await asyncio.to_thread(state.engine.shutdown)
                raise RuntimeError(f"--lora-modules {module.name}: {e.message}") from None
        follower = LoRAFileFollower(Path(config.lora_modules_file)) if config.lora_modules_file else None
        follow: asyncio.Task[None] | None = None
        if follower is not None:   # a bad file fails start-up; a bad adapter in it is left out (lora_file.py)
            try:
                await follower.sync(state)
            except (ValueError, OSError) as e:
                await asyncio.to_thread(state.engine.shutdown)
                raise RuntimeError(str(e)) from None
            follow = asyncio.create_task(follower.run(state), name="lora-modules-file")
        state.tool_parser = resolve_tool_parser(config.tool_call_parser,
                                                info.tokenizer.chat_template if info.tokenizer else None)
        state.sampling_defaults = sampling_defaults(config.generation_config,
                                                    info.tokenizer.files if info.tokenizer else None)
        if state.sampling_defaults:
            logger.info("sampling defaults from the generation config (--generation-config %s): %s",
                        config.generation_config, state.sampling_defaults)
        logger.info("tool-call parser: %s (--tool-call-parser %s)",
                    state.tool_parser.name if state.tool_parser else "none", config.tool_call_parser)
        logger.info("engine ready: model %s, max_model_len %d, %d KV blocks of %d tokens",
                    state.model_name, info.max_model_len, info.num_kv_blocks, info.block_size)
        try:
            yield
        finally:
            if follow is not None:
                follow.cancel()
            await asyncio.to_thread(state.engine.shutdown)
            state.workers.shutdown(wait=False, cancel_futures=True)
            if tracing is not None:
                tracing.shutdown()

    app = FastAPI(title="pagedkube engine", version="0.1.0", lifespan=lifespan)
    app.state.server = state
    install_error_handlers(app)
    # Middleware added later wraps what was added before. From the outside in: every
    # response counted; one access-log line (and span) per request with its x-request-id;
    # the API key checked before a byte of body is read; the body's size and read
    # deadline bounded before the app parses it.
    app.add_middleware(BodyLimits, max_bytes=config.max_body_bytes, read_timeout_s=config.body_read_timeout,
                       error=error_body)
    if config.api_key:
        app.add_middleware(APIKeyMiddleware, api_key=config.api_key)
    app.add_middleware(EngineAccessMiddleware, access_log=AccessLog(ACCESS_LOGGER, config.observability.access_log),
                       tracing=tracing)
    http_registry = CollectorRegistry()
    app.add_middleware(CountHTTPResponses, registry=http_registry)
    app.include_router(openai_router)
    app.include_router(cache_router)
    if config.allow_runtime_lora_updating:
        app.include_router(lora_router)

    @app.get("/health")
    async def health() -> Response:
        """Liveness: the engine core runs, answers within its heartbeat timeout, and its steps succeed."""
        if state.loaded and not (state.engine.running and state.engine.healthy):
            reason = "is not running" if not state.engine.running else "is not responding or its steps fail"
            return JSONResponse(error_body(500, f"the engine core {reason}", code=ENGINE_UNHEALTHY),
                                status_code=500)
        return JSONResponse({"status": "ok"})

    @app.get("/ready")
    async def ready() -> Response:
        """Readiness: the engine is loaded and the server is not draining."""
        if state.ready:
            return JSONResponse({"status": "ready"})
        reason, code = ("draining", DRAINING) if state.refusing else ("not ready", NOT_READY)
        return JSONResponse(error_body(503, f"the server is {reason}", code),
                            status_code=503, headers={"Retry-After": "1"})

    # Operational, not part of the API a client generator or a fuzzer should call: not in /openapi.json.
    @app.post("/drain", include_in_schema=False)
    async def drain() -> dict:
        """A scale-in chose this engine: refuse new requests (503 `draining`, /ready 503, so a
        Kubernetes ReplicaSet removes this pod first), finish those in flight. The answer says
        how many are left; the autoscaler polls it until 0 (docs/autoscaling.md)."""
        state.drain_requested = True
        return {"draining": True, "in_flight": state.in_flight}

    @app.delete("/drain", include_in_schema=False)
    async def undrain() -> dict:
        """The scale-in was called off: serve again (not after SIGTERM, which is final)."""
        state.drain_requested = False
        return {"draining": state.draining, "in_flight": state.in_flight}

    @app.get("/metrics")
    async def metrics() -> Response:
        if state.metrics is None:
            raise APIError(503, "the engine is not ready", headers={"Retry-After": "1"})
        return Response(state.metrics.render() + generate_latest(http_registry), media_type=CONTENT_TYPE_LATEST)

    return app
