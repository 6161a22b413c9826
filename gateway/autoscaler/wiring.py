"""Builds the autoscaler from the parts a Gateway passes (called from Gateway.start)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import httpx

from pagedkube.gateway.autoscaler.autoscaler import Autoscaler
from pagedkube.gateway.autoscaler.drain import EngineDrainer
from pagedkube.gateway.autoscaler.metrics import AutoscalerMetrics
from pagedkube.gateway.autoscaler.target import ScaleTarget
from pagedkube.gateway.endpoints import EndpointSet
from pagedkube.gateway.hold import HoldQueue

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry


def kube_target(config: Any, api: Any = None) -> ScaleTarget:
    """The LLMService scale subresource, acting only while holding the Lease `<llmservice>-autoscaler`."""
    from pagedkube.gateway.autoscaler.kube import KubeScaleTarget, default_api
    from pagedkube.gateway.autoscaler.lease import DEFAULT_LEASE_DURATION_S, LeaseElector, default_identity, lease_name

    a = config.autoscale
    api = api if api is not None else default_api()
    duration = max(DEFAULT_LEASE_DURATION_S, int(3 * a.interval) + 1)
    lease = LeaseElector(api, config.namespace, lease_name(a.llmservice), default_identity(), duration)
    return KubeScaleTarget(api, config.namespace, a.llmservice, config.kube_service, lease)


def build_autoscaler(config: Any, endpoints: EndpointSet, hold: HoldQueue, registry: CollectorRegistry,
                     target: ScaleTarget | None, control: httpx.AsyncClient,
                     max_model_len: Callable[[], int | None]) -> Autoscaler:
    """The autoscaler of a gateway with GatewayConfig `config` (its `autoscale` set), over the
    gateway's endpoints and hold queue, its gauges in `registry`. `target` None: the Kubernetes
    target from the config; `pagedkube up` passes its local engines. `control`: the gateway's
    client for engine calls (it carries the engine key), which drains engines before a scale-in;
    `max_model_len()`: the engines' longest context, as the engine watcher read it."""
    if target is None:
        target = kube_target(config)
    return Autoscaler(config.autoscale, endpoints, hold, target, AutoscalerMetrics(registry),
                      drainer=EngineDrainer(control), max_model_len=max_model_len)
