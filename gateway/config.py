"""The gateway's configuration, validated once at start-up."""
from __future__ import annotations

from dataclasses import dataclass, field

from pagedkube.gateway.autoscaler.policy import AutoscalerConfig
from pagedkube.gateway.endpoints import DEFAULT_EJECT_AFTER_FAILURES, DEFAULT_EJECT_SECONDS
from pagedkube.gateway.prompt import DEFAULT_RING_KEY_BLOCKS
from pagedkube.gateway.routing.bounded_load import DEFAULT_LOAD_BOUND
from pagedkube.gateway.routing.prefix_index import DEFAULT_CAPACITY
from pagedkube.gateway.routing.ring import DEFAULT_VNODES
from pagedkube.gateway.validation import DEFAULT_MAX_BODY_BYTES
from pagedkube.observability import ObservabilityConfig

ROUTING_POLICIES = ("prefix", "round-robin", "least-load")
MAX_FEED_WAIT_S = 30.0   # the longest cache-feed long-poll an engine holds (docs/interfaces.md)


@dataclass(slots=True)
class GatewayConfig:
    endpoints: list[str] = field(default_factory=list)   # static engine URLs
    kube_service: str | None = None                      # or: the engine Service's EndpointSlices
    namespace: str = "default"
    host: str = "127.0.0.1"
    port: int = 8080
    routing: str = "prefix"
    load_bound: float = DEFAULT_LOAD_BOUND
    api_keys_file: str | None = None
    engine_api_key: str | None = None     # bearer token of engines started with --api-key
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_attempts: int = 3                 # endpoints tried per request (connect errors, 5xx)
    connect_timeout: float = 2.0          # an engine in the same cluster connects in ms
    upstream_timeout: float = 600.0       # between bytes; a long non-streamed generation counts whole
    eject_after_failures: int = DEFAULT_EJECT_AFTER_FAILURES
    eject_seconds: float = DEFAULT_EJECT_SECONDS
    feed_interval: float = 0.05           # least time between two cache feed requests to one engine
    feed_wait: float = 5.0                # cache feed long-poll (0: plain polls every feed_interval)
    scrape_interval: float = 1.0          # /metrics (waiting queue) and, for a static list, /ready
    ring_key_blocks: int = DEFAULT_RING_KEY_BLOCKS
    vnodes: int = DEFAULT_VNODES
    index_capacity: int = DEFAULT_CAPACITY
    hold_timeout: float = 0.0             # wait this long for a ready engine before a 503
    route_headers: bool = True            # x-pagedkube-endpoint / x-pagedkube-route on responses
    autoscale: AutoscalerConfig | None = None   # --autoscale (docs/autoscaling.md)
    supervised: bool = False              # pagedkube up: its supervisor fills the EndpointSet
    observability: ObservabilityConfig = field(default_factory=ObservabilityConfig)   # access log, tracing

    def __post_init__(self) -> None:
        if bool(self.endpoints) + bool(self.kube_service) + self.supervised != 1:
            raise ValueError("give either --endpoints URL,... or --kube-service NAME (exactly one)")
        if self.autoscale is not None and not self.supervised:
            if not self.kube_service or not self.autoscale.llmservice:
                raise ValueError("--autoscale needs --kube-service NAME and --llmservice NAME "
                                 "(locally, `pagedkube up --autoscale` scales engine processes)")
        if self.routing not in ROUTING_POLICIES:
            raise ValueError(f"--routing must be one of {', '.join(ROUTING_POLICIES)}, got {self.routing!r}")
        if not self.load_bound >= 1.0:
            raise ValueError(f"--load-bound must be >= 1.0, got {self.load_bound}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be 0..65535, got {self.port}")
        for name in ("max_body_bytes", "max_attempts", "ring_key_blocks", "vnodes", "index_capacity",
                     "eject_after_failures"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("connect_timeout", "upstream_timeout", "feed_interval", "scrape_interval"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.engine_api_key is not None and not self.engine_api_key.strip():
            raise ValueError("--engine-api-key must not be empty")
        if self.eject_seconds < 0 or self.hold_timeout < 0:
            raise ValueError("eject_seconds and hold_timeout must be >= 0")
        if not 0 <= self.feed_wait <= MAX_FEED_WAIT_S:
            raise ValueError(f"--feed-wait must be 0..{MAX_FEED_WAIT_S:g} seconds, got {self.feed_wait}")
