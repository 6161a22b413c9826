"""`pagedkube up`'s configuration (torch-free, light: the CLI imports it for its flag defaults).
Settings it shares with `pagedkube gateway` and `pagedkube serve` take their defaults
from GatewayConfig and ServerConfig (pagedkube/defaults.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

from pagedkube.defaults import default_of
from pagedkube.engine.server.config import ServerConfig
from pagedkube.gateway.autoscaler.policy import AutoscalerConfig
from pagedkube.gateway.config import GatewayConfig
from pagedkube.observability import ObservabilityConfig


@dataclass(slots=True)
class UpConfig:
    replicas: int = 2                # two engines: enough to show prefix affinity on one machine
    host: str = default_of(GatewayConfig, "host")
    port: int = default_of(GatewayConfig, "port")
    engine_args: list[str] = field(default_factory=list)
    model_name: str = "tiny"
    autoscale: AutoscalerConfig | None = None
    hold_timeout: float = default_of(GatewayConfig, "hold_timeout")
    routing: str = default_of(GatewayConfig, "routing")
    route_headers: bool = default_of(GatewayConfig, "route_headers")   # `pagedkube gateway --route-headers`
    drain_timeout: float = default_of(ServerConfig, "drain_timeout")   # the engines' own (`--drain-timeout`)
    scrape_interval: float = 0.5     # queue depth is read this often (the gateway's default is 1 s)
    observability: ObservabilityConfig = field(default_factory=ObservabilityConfig)

    def __post_init__(self) -> None:
        if self.replicas < 0:
            raise ValueError(f"--replicas must be >= 0, got {self.replicas}")
        if self.replicas == 0 and self.autoscale is None:
            raise ValueError("--replicas 0 needs --autoscale --min-replicas 0 (scale from zero)")

    def initial_replicas(self) -> int:
        a = self.autoscale
        return self.replicas if a is None else max(a.min_replicas, min(a.max_replicas, self.replicas))
