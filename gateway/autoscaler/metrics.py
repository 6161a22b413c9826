"""pagedkube_autoscaler_* metrics (docs/interfaces.md "Metric names"), registered
in the gateway's own registry so /metrics carries them."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

DIRECTIONS = ("up", "down")


class AutoscalerMetrics:
    def __init__(self, registry: CollectorRegistry):
        p = "pagedkube_autoscaler_"
        self.desired_replicas = Gauge(p + "desired_replicas", "Engine replicas the autoscaler asks for",
                                      registry=registry)
        self.ready_replicas = Gauge(p + "ready_replicas", "Engines ready to serve", registry=registry)
        self.queue_depth = Gauge(p + "queue_depth",
                                 "Queue depth the last decision used: requests in flight beyond the ready engines' "
                                 "running slots (with --scale-signal waiting: the engines' waiting requests), "
                                 "held ones included", registry=registry)
        self.in_flight = Gauge(p + "in_flight", "Requests in flight on every engine (running + waiting) and held",
                               registry=registry)
        self.draining_replicas = Gauge(p + "draining_replicas",
                                       "Engines a scale-in drains: no new requests, removed once idle",
                                       registry=registry)
        self.target_queue_depth = Gauge(p + "target_queue_depth", "Target mean queue depth per ready engine",
                                        registry=registry)
        # The bounds, so an alert can tell "at max replicas and the queue still grows" (PrometheusRule).
        self.min_replicas = Gauge(p + "min_replicas", "Fewest engine replicas allowed", registry=registry)
        self.max_replicas = Gauge(p + "max_replicas", "Most engine replicas allowed", registry=registry)
        self.held_requests = Gauge(p + "held_requests", "Requests held while no engine is ready",
                                   registry=registry)
        self.leader = Gauge(p + "leader", "1 when this gateway replica acts (holds the Lease)", registry=registry)
        self.scale_events = Counter(p + "scale_events", "Replica count changes, by direction", ["direction"],
                                    registry=registry)
        for direction in DIRECTIONS:
            self.scale_events.labels(direction)
