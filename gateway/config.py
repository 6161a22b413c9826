"""The gateway's configuration, validated once at start-up."""
from __future__ import annotations

from dataclasses import dataclass, field

from pagedkube.gateway.autoscaler.policy import AutoscalerConfig
from pagedkube.gateway.endpoints import DEFAULT_EJECT_AFTER_FAILURES, DEFAULT_EJECT_SECONDS
from pagedkube.gateway.prompt import DEFAULT_RING_KEY_BLOCKS
from pagedkube.gateway.routing.bounded_load import DEFAULT_LOAD_BOUND, DEFAULT_LOAD_FLOOR
from pagedkube.gateway.routing.pending import DEFAULT_PENDING_TTL_S
from pagedkube.gateway.routing.picker import DEFAULT_AFFINITY_DEPTH
from pagedkube.gateway.routing.prefix_index import DEFAULT_CAPACITY
from pagedkube.gateway.routing.ring import DEFAULT_VNODES
from pagedkube.http_head_limits import HeadLimits
from pagedkube.http_limits import DEFAULT_BODY_READ_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES
from pagedkube.gateway.routing.types import ROUTING_POLICIES
from pagedkube.observability import ObservabilityConfig

# Prompts in bodies above this many bytes are tokenized in the pool, off the event loop.
# Measured with the built-in tokenizer (docs/gateway.md "Big prompts"): a first-seen
# 64 KiB chat renders, encodes and hashes in ~15 ms on an idle core, the next turn of
# the same conversation in ~2 ms (the piece and head caches, which only the event
# loop's calls use); smaller work costs less than a hop to a thread and back.
DEFAULT_INLINE_TOKENIZE_BYTES = 64 * 1024
# Big prompts at once: each holds a core while its text is encoded (the tokenizers
# library releases the GIL), and the gateway's own loop needs the rest.
DEFAULT_TOKENIZE_WORKERS = 2
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
    load_floor: int = DEFAULT_LOAD_FLOOR      # requests an engine always takes (bounded_load.py)
    affinity_depth: int | None = DEFAULT_AFFINITY_DEPTH   # 0: any held prefix; None: the whole head (picker.py)
    pending_ttl: float = DEFAULT_PENDING_TTL_S   # routed-but-unreported blocks count as held (0: off; pending.py)
    api_keys_file: str | None = None
    engine_api_key: str | None = None     # bearer token of engines started with --api-key
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES          # 413 beyond (pagedkube/http_limits.py)
    body_read_timeout: float = DEFAULT_BODY_READ_TIMEOUT_S  # 408 when the body takes longer
    head_limits: HeadLimits = field(default_factory=HeadLimits)   # 431 / 408 / 503 (pagedkube/http_head_limits.py)
    tokenize_workers: int = DEFAULT_TOKENIZE_WORKERS
    inline_tokenize_bytes: int = DEFAULT_INLINE_TOKENIZE_BYTES
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
    route_headers: bool = False           # x-pagedkube-endpoint / -route on responses (internal addresses)
    autoscale: AutoscalerConfig | None = None   # --autoscale (docs/autoscaling.md)
    llmservice: str | None = None         # with kube_service: the LLMService fronted (scale, status.adapters)
    supervised: bool = False              # pagedkube up: its supervisor fills the EndpointSet
    observability: ObservabilityConfig = field(default_factory=ObservabilityConfig)   # access log, tracing

    def __post_init__(self) -> None:
        if bool(self.endpoints) + bool(self.kube_service) + self.supervised != 1:
            raise ValueError("give either --endpoints URL,... or --kube-service NAME (exactly one)")
        if self.autoscale is not None and not self.supervised:
            if not self.kube_service or not self.autoscale.llmservice:
                raise ValueError("--autoscale needs --kube-service NAME and --llmservice NAME "
                                 "(locally, `pagedkube up --autoscale` scales engine processes)")
        if self.llmservice and not self.kube_service:
            raise ValueError("--llmservice needs --kube-service NAME (the engines of that LLMService)")
        if self.routing not in ROUTING_POLICIES:
            raise ValueError(f"--routing must be one of {', '.join(ROUTING_POLICIES)}, got {self.routing!r}")
        if not self.load_bound >= 1.0:
            raise ValueError(f"--load-bound must be >= 1.0, got {self.load_bound}")
        if self.load_floor < 0:
            raise ValueError(f"--load-floor must be >= 0, got {self.load_floor}")
        if self.affinity_depth is not None and self.affinity_depth < 0:
            raise ValueError(f"--affinity-depth must be 'head' or an integer >= 0, got {self.affinity_depth}")
        if not self.pending_ttl >= 0:
            raise ValueError(f"--pending-ttl must be >= 0 seconds (0: off), got {self.pending_ttl}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be 0..65535, got {self.port}")
        for name in ("max_body_bytes", "max_attempts", "ring_key_blocks", "vnodes", "index_capacity",
                     "eject_after_failures", "tokenize_workers"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.inline_tokenize_bytes < 0:
            raise ValueError(f"inline_tokenize_bytes must be >= 0, got {self.inline_tokenize_bytes}")
        for name in ("connect_timeout", "upstream_timeout", "feed_interval", "scrape_interval", "body_read_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.engine_api_key is not None and not self.engine_api_key.strip():
            raise ValueError("--engine-api-key must not be empty")
        if self.eject_seconds < 0 or self.hold_timeout < 0:
            raise ValueError("eject_seconds and hold_timeout must be >= 0")
        if not 0 <= self.feed_wait <= MAX_FEED_WAIT_S:
            raise ValueError(f"--feed-wait must be 0..{MAX_FEED_WAIT_S:g} seconds, got {self.feed_wait}")
