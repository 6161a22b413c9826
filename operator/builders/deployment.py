"""The Deployment around an LLMService component's pod (pure): what the engine and gateway share.

Both are a Deployment named and labelled for their component, selected by the immutable
selector labels (naming.py), rolled with `RollingUpdate`, with pods that carry the Secret's
version annotation (a re-created key rolls both sides together) and the hardened pod security
context. The caller gives only what differs: the replica count, the rolling-update bounds and
the rest of the pod spec.
"""
from __future__ import annotations

from typing import Any

from pagedkube.operator import naming
from pagedkube.operator.builders.common import maybe, pod_security_context
from pagedkube.operator.builders.security import SECRET_VERSION_ANNOTATION
from pagedkube.operator.spec import LLMServiceSpec


def component_deployment(svc: LLMServiceSpec, component: str, name: str, *, replicas: int,
                         rolling_update: dict[str, int], secret_version: str,
                         pod: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """`pod`: the pod spec's own fields (containers, volumes, ...), added after the shared ones;
    `annotations`: the pod template's own (the secret version's is added here)."""
    annotations = {**(secret_version and {SECRET_VERSION_ANNOTATION: secret_version} or {}), **(annotations or {})}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": naming.metadata(name, svc.namespace, svc.name, svc.uid, component),
        "spec": {
            "replicas": replicas,
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": naming.selector_labels(svc.name, component)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": rolling_update},
            "template": {
                "metadata": {"labels": naming.labels(svc.name, component),
                             **maybe("annotations", annotations)},
                "spec": {"enableServiceLinks": False, "securityContext": pod_security_context(), **pod},
            },
        },
    }
