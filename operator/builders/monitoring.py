"""The ServiceMonitor (Prometheus Operator), built only when its CRD exists (pure).

One monitor scrapes both parts: the headless engine Service (vLLM metric names,
so the same dashboards serve runtime pagedkube and vllm) and the gateway
Service (pagedkube_gateway_*, pagedkube_autoscaler_*); both name their port `http`.
"""
from __future__ import annotations

from typing import Any

from pagedkube.operator import naming
from pagedkube.operator.spec import LLMServiceSpec

SERVICEMONITOR_CRD = "servicemonitors.monitoring.coreos.com"


def build_service_monitor(svc: LLMServiceSpec) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": naming.metadata(svc.name, svc.namespace, svc.name, svc.uid, None),
        "spec": {
            "selector": {"matchLabels": {
                "app.kubernetes.io/name": "pagedkube",
                "app.kubernetes.io/instance": svc.name,
            }},
            "endpoints": [{"port": "http", "path": "/metrics", "interval": svc.scrape_interval}],
        },
    }
