"""create_app(config): the gateway's ASGI app, its pieces built once here.
The proxied routes go straight to Gateway.handle (gateway/fast_path.py); the
rest is a FastAPI app.

    request -> auth + rate limit -> read and check body -> hash prompt
            -> pick endpoints -> proxy (retries, streaming, metrics)
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import aiohttp
import httpx
from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from pagedkube.access_log import AccessLog
from pagedkube.gateway import engine_api
from pagedkube.gateway.access_log import LOGGER as ACCESS_LOGGER, AccessLogMiddleware, note_route
from pagedkube.gateway.auth import ApiKeys, RateLimiter, retry_after_header
from pagedkube.gateway.autoscaler.policy import DEFAULT_MAX_HELD
from pagedkube.gateway.config import GatewayConfig
from pagedkube.gateway.counting import CountResponses, outcome_of
from pagedkube.gateway.discovery import KubeDiscovery, normalize_url
from pagedkube.gateway.endpoints import NOT_READY, EndpointSet
from pagedkube.gateway.engine_watch import EngineWatcher
from pagedkube.openai_errors import MODEL_NOT_FOUND
from pagedkube.gateway.errors import (GatewayError, error_body, internal_error, no_endpoint, rate_limited,
                                      route_error, unauthorized)
from pagedkube.gateway.fast_path import PROXIED, FastPath
from pagedkube.gateway.hold import HoldQueue
from pagedkube.gateway.feed_metrics import CacheFeedAge
from pagedkube.gateway.metrics import GatewayMetrics
from pagedkube.gateway.openapi import install as install_openapi
from pagedkube.gateway.prompt import CurrentHasher
from pagedkube.gateway.proxy import Proxy, ProxyOptions
from pagedkube.gateway.routing.bounded_load import BoundedLoad
from pagedkube.gateway.routing.adapters import AdapterAffinity
from pagedkube.gateway.routing.picker import PrefixPicker
from pagedkube.gateway.routing.policies import LeastLoadPicker, RoundRobinPicker
from pagedkube.gateway.routing.prefix_index import PrefixIndex
from pagedkube.gateway.routing.ring import RingCache
from pagedkube.gateway.routing.types import Picker
from pagedkube.gateway.routing.types import RoutingInput
from pagedkube.gateway.validation import ParsedRequest, parse_request
from pagedkube.http_limits import BodyLimits
from pagedkube.tracing import build_tracing

if TYPE_CHECKING:
    from pagedkube.gateway.adapter_status import AdapterStatusReporter
    from pagedkube.gateway.autoscaler.autoscaler import Autoscaler
    from pagedkube.gateway.autoscaler.target import ScaleTarget

log = logging.getLogger("pagedkube.gateway")


def build_picker(config: GatewayConfig, index: PrefixIndex, endpoints: EndpointSet) -> Picker:
    """`prefix`: adapter affinity for LoRA requests (routing/adapters.py), then the prefix picker."""
    rings = RingCache(config.vnodes)
    if config.routing == "round-robin":
        return RoundRobinPicker()
    if config.routing == "least-load":
        return LeastLoadPicker(rings)
    prefix = PrefixPicker(index, BoundedLoad(config.load_bound, config.load_floor), rings, config.affinity_depth)
    return AdapterAffinity(prefix, endpoints.adapter_slots)


class Gateway:
    """Everything a request handler needs; app.state.gateway holds one.

    `endpoints`: the EndpointSet to route over (default: a new one; `pagedkube up`
    passes the one its LocalEngines fill). `scale_target`: what the autoscaler
    scales when the config turns it on (default: the LLMService from the config;
    `pagedkube up` passes its LocalEngines)."""

    def __init__(self, config: GatewayConfig, *, endpoints: EndpointSet | None = None,
                 scale_target: ScaleTarget | None = None):
        self.config = config
        self.api_keys = ApiKeys.from_file(config.api_keys_file) if config.api_keys_file else None
        self.rate_limiter = RateLimiter()
        self.endpoints = endpoints if endpoints is not None else EndpointSet(config.eject_after_failures,
                                                                             config.eject_seconds)
        self.index = PrefixIndex(config.index_capacity, pending_ttl=config.pending_ttl)
        self.picker = build_picker(config, self.index, self.endpoints)
        self.metrics = GatewayMetrics(self.endpoints.counts_by_state, self.endpoints.load_parts)
        self.static_urls = [normalize_url(u) for u in config.endpoints]
        self.prompt = CurrentHasher(config.ring_key_blocks)   # the engine watcher swaps in the engines' hasher
        self.client: aiohttp.ClientSession | None = None
        self.watcher: EngineWatcher | None = None
        self.proxy: Proxy | None = None
        self.kube: KubeDiscovery | None = None
        self.hold = HoldQueue(self.endpoints, config.hold_timeout,
                              config.autoscale.max_held if config.autoscale else DEFAULT_MAX_HELD)
        self.scale_target = scale_target
        self.autoscaler: Autoscaler | None = None
        self.adapter_status: AdapterStatusReporter | None = None
        self.tokenize_pool: ThreadPoolExecutor | None = None

    async def start(self) -> None:
        self.tokenize_pool = ThreadPoolExecutor(self.config.tokenize_workers, thread_name_prefix="tokenize")
        # Idle connections expire before uvicorn's 5 s keep-alive closes them on the
        # engine side, so the proxy rarely reuses a connection the engine is closing.
        # aiohttp sets TCP_NODELAY on its connections (headers and body may go in separate
        # writes; with Nagle the body would wait for the engine's delayed ACK of the headers).
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=2.0, force_close=False)
        timeout = aiohttp.ClientTimeout(total=None, sock_read=self.config.upstream_timeout,
                                        connect=self.config.connect_timeout)
        # Engines answer uncompressed (usage is read from the bytes) and the bytes pass through as they are.
        self.client = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False,
                                            skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type"))
        # Control-plane calls (feed, metrics, probes) must not wait the long upstream timeout.
        engine_auth = f"Bearer {self.config.engine_api_key}" if self.config.engine_api_key else None
        # No connection cap: every engine holds one cache-feed long-poll open at all times, and
        # httpx's default of 100 would leave a fleet of 100 engines no connection to scrape with.
        self.control = httpx.AsyncClient(timeout=httpx.Timeout(5.0, connect=self.config.connect_timeout),
                                         limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
                                         headers={"Authorization": engine_auth} if engine_auth else None)
        self.proxy = Proxy(self.client, self.endpoints, self.metrics, ProxyOptions(
            max_attempts=self.config.max_attempts, upstream_timeout=self.config.upstream_timeout,
            strip_authorization=self.api_keys is not None, route_headers=self.config.route_headers,
            engine_authorization=engine_auth, hold_timeout=self.config.hold_timeout))
        self.watcher = EngineWatcher(self.endpoints, self.index, self.control, self.prompt,
                                     probe_ready=bool(self.static_urls),
                                     feed_interval=self.config.feed_interval, feed_wait=self.config.feed_wait,
                                     scrape_interval=self.config.scrape_interval)
        self.watcher.start()
        self.metrics.registry.register(CacheFeedAge(self.watcher, self.endpoints.label))
        if self.static_urls:
            self.endpoints.update({u: NOT_READY for u in self.static_urls})  # the probe makes them ready
        elif self.config.kube_service:
            self.kube = KubeDiscovery(self.endpoints, self.config.kube_service, self.config.namespace)
            self.kube.start()
        if self.config.kube_service and self.config.llmservice:
            from pagedkube.gateway.adapter_status import AdapterStatusReporter
            from pagedkube.gateway.autoscaler.kube import default_api

            self.adapter_status = AdapterStatusReporter(default_api(), self.config.namespace, self.config.llmservice,
                                                        self.watcher.served_adapters)
            self.adapter_status.start()
        if self.config.autoscale is not None:
            from pagedkube.gateway.autoscaler.wiring import build_autoscaler

            self.autoscaler = build_autoscaler(self.config, self.endpoints, self.hold, self.metrics.registry,
                                               self.scale_target, self.control, self.watcher.max_model_len)
            self.autoscaler.start()

    async def stop(self) -> None:
        if self.autoscaler is not None:
            await self.autoscaler.stop()
        if self.adapter_status is not None:
            await self.adapter_status.stop()
        if self.kube is not None:
            self.kube.stop()
        if self.watcher is not None:
            await self.watcher.stop()
        if self.client is not None:
            await self.client.close()
        if getattr(self, "control", None) is not None:
            await self.control.aclose()
        if self.tokenize_pool is not None:
            self.tokenize_pool.shutdown(wait=False, cancel_futures=True)

    def key_holder(self, request: Request) -> bool:
        """The request carries a valid API key, or the gateway needs none."""
        return self.api_keys is None or self.api_keys.lookup(request.headers.get("authorization")) is not None

    def authenticate(self, request: Request, rate_limit: bool = True) -> tuple[str | None, str | None]:
        """(key name, cache salt) for this request; raises 401/429."""
        if self.api_keys is None:
            return None, None
        key = self.api_keys.lookup(request.headers.get("authorization"))
        if key is None:
            raise unauthorized()
        wait = self.rate_limiter.acquire(key.name, key.requests_per_minute) if rate_limit else None
        if wait is not None:
            raise rate_limited(key.name, retry_after_header(wait))
        return key.name, key.cache_salt

    async def handle(self, request: Request, path: str) -> Response:
        started = time.monotonic()
        assert self.watcher is not None and self.proxy is not None, "start() builds them before any request"
        outcome = outcome_of(request.scope)
        try:
            _, tenant_salt = self.authenticate(request)
            raw = await request.body()   # size and read deadline: BodyLimits, in front of the app
            known = self.watcher.known_models()
            try:
                parsed = parse_request(path, raw, known)
            except GatewayError as e:
                if e.code != MODEL_NOT_FOUND:
                    raise
                await self.watcher.refresh_models()   # an adapter loaded since the last read?
                known = self.watcher.known_models()
                parsed = parse_request(path, raw, known)
            if parsed.model and known and parsed.model in known:
                outcome.model = parsed.model
            salt = tenant_salt if tenant_salt is not None else parsed.body.get("cache_salt")
            # an adapter's blocks hash with its name, as the engine hashes them (pagedkube/hashing.py)
            lora = parsed.model if parsed.model and parsed.model in self.watcher.adapter_names() else None
            routing_input = await self.routing_input(parsed, salt, lora)
            routable = await self.hold.routable()
            if not routable:
                raise no_endpoint()
            if lora is not None:   # only engines that serve the adapter can answer it; then prefix/load as usual
                routable = self.watcher.serving(lora, routable) or routable
        except GatewayError as e:
            return e.response()
        decision = self.picker.pick(routing_input, routable, self.endpoints.loads(routable))
        if self.config.routing == "prefix":   # its blocks are pending there until the feed reports them
            self.index.routed(decision.endpoint, routing_input.block_hashes)
        self.metrics.routing_decisions.labels(decision.reason).inc()
        note_route(request.scope, decision, outcome.model)
        if decision.predicted_cached_tokens:
            self.metrics.predicted_cached_tokens.inc(decision.predicted_cached_tokens)
        body = parsed.forward_body(tenant_salt)
        return await self.proxy.forward(request, path, body, decision, outcome, started)

    async def routing_input(self, parsed: ParsedRequest, salt: str | None, lora: str | None = None) -> RoutingInput:
        """Renders, tokenizes and hashes the prompt. A small body is done here, on the
        event loop, with the hasher's caches (a thread hop would cost more than the
        work); a large one goes to the bounded tokenize pool, uncached, so /health and
        running streams keep flowing while a multi-megabyte prompt is worked through."""
        hasher = self.prompt.hasher
        if len(parsed.raw) <= self.config.inline_tokenize_bytes:
            return hasher.routing_input(parsed.kind, parsed.body, salt, lora_name=lora)
        work = functools.partial(hasher.routing_input, parsed.kind, parsed.body, salt, cached=False, lora_name=lora)
        return await asyncio.get_running_loop().run_in_executor(self.tokenize_pool, work)

    async def merged_models(self) -> dict:
        """Every ready engine's /v1/models, read now (the watcher's copy, refreshed: the same one
        that requests are checked against), one card per id."""
        assert self.watcher is not None, "start() builds it before any request"
        await self.watcher.refresh_models()
        merged: dict[str | None, dict] = {}
        for url in self.endpoints.routable():
            for m in self.watcher.models.get(url, ()):
                if isinstance(m, dict) and m.get("id") not in merged:
                    merged[m.get("id")] = m
        return {"object": "list", "data": [merged[k] for k in sorted(merged, key=str)]}


def create_app(config: GatewayConfig, *, endpoints: EndpointSet | None = None,
               scale_target: ScaleTarget | None = None) -> CountResponses:
    """The gateway's ASGI app (`endpoints`, `scale_target`: see Gateway), outermost first:

        CountResponses       every response counted (gateway/counting.py)
        AccessLogMiddleware  x-request-id, one access-log line and span per request (gateway/access_log.py)
        BodyLimits           413 / 408 before anything reads the body (pagedkube/http_limits.py)
        FastPath             the two proxied routes (gateway/fast_path.py)
        FastAPI              /v1/models[/{id}], /tokenize, /detokenize, /version (engine_api.py),
                             /health, /ready, /metrics; 404 / 405 for the rest
    """
    gateway = Gateway(config, endpoints=endpoints, scale_target=scale_target)
    tracing = build_tracing("pagedkube-gateway", config.observability.otlp_traces_endpoint)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await gateway.start()
        try:
            yield
        finally:
            await gateway.stop()
            if tracing is not None:
                tracing.shutdown()

    app = FastAPI(title="pagedkube gateway", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.gateway = gateway

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> Response:
        log.exception("unhandled error")
        return internal_error(exc).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # Starlette's router raises these for unknown paths (404) and methods (405);
        # answer them in OpenAI's shape, as every other error.
        if exc.status_code == 404:
            message = f"Unknown route {request.method} {request.url.path}."
        elif exc.status_code == 405:
            message = f"Method {request.method} is not allowed on {request.url.path}."
        else:
            message = str(exc.detail)
        return route_error(exc.status_code, message, dict(exc.headers or {})).response()

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        try:
            gateway.authenticate(request, rate_limit=False)
        except GatewayError as e:
            return e.response()
        return JSONResponse(await gateway.merged_models())

    engine_api.install(app, gateway)

    @app.get("/health")
    async def health() -> Response:
        return JSONResponse({"status": "ok"})

    @app.get("/ready")
    async def ready(request: Request) -> Response:
        routable = gateway.endpoints.routable()
        body: dict = {"ready": bool(routable)}
        if gateway.key_holder(request):   # the probe needs only the status; details are for key holders
            label = gateway.endpoints.label
            body.update(endpoints=gateway.endpoints.counts_by_state(),
                        tokenizer=gateway.prompt.hasher.tokenizer is not None,
                        feeds=dict(sorted((label(url), seq) for url, seq in gateway.watcher.feed_seq.items()))
                        if gateway.watcher else {})
        return Response(json.dumps(body), status_code=200 if routable else 503, media_type="application/json")

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(gateway.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    install_openapi(app, lambda: gateway.watcher.known_models() if gateway.watcher else None, gateway.key_holder)
    limited = BodyLimits(FastPath(app, gateway.handle), max_bytes=config.max_body_bytes,
                         read_timeout_s=config.body_read_timeout, error=error_body)
    logged = AccessLogMiddleware(limited, AccessLog(ACCESS_LOGGER, config.observability.access_log), tracing, PROXIED)
    counted = CountResponses(logged, gateway.metrics)
    counted.state = app.state   # callers (pagedkube up, tests) reach the Gateway as app.state.gateway
    return counted
