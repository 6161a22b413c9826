"""Builds the autoscaler for a Gateway (called from Gateway.start)."""
from __future__ import annotations

from typing import Any

from pagedkube.gateway.autoscaler.autoscaler import Autoscaler
from pagedkube.gateway.autoscaler.metrics import AutoscalerMetrics
from pagedkube.gateway.autoscaler.target import ScaleTarget


def kube_target(config: Any, api: Any = None) -> ScaleTarget:
    """The LLMService scale subresource, acting only while holding the Lease `<llmservice>-autoscaler`."""
    from pagedkube.gateway.autoscaler.kube import KubeScaleTarget, default_api
    from pagedkube.gateway.autoscaler.lease import DEFAULT_LEASE_DURATION_S, LeaseElector, default_identity

    a = config.autoscale
    api = api if api is not None else default_api()
    duration = max(DEFAULT_LEASE_DURATION_S, int(3 * a.interval) + 1)
    lease = LeaseElector(api, config.namespace, f"{a.llmservice}-autoscaler", default_identity(), duration)
    return KubeScaleTarget(api, config.namespace, a.llmservice, config.kube_service, lease)


def build_autoscaler(gateway: Any, target: ScaleTarget | None) -> Autoscaler:
    """`target` None: the Kubernetes target from the gateway's config."""
    config = gateway.config
    if target is None:
        target = kube_target(config)
    metrics = AutoscalerMetrics(gateway.metrics.registry)
    return Autoscaler(config.autoscale, gateway.endpoints, gateway.hold, target, metrics, client=gateway.control)
