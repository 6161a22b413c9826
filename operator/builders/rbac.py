"""The gateway's ServiceAccount, Role and RoleBinding (pure).

The Role holds exactly what the gateway does (docs/interfaces.md, "Gateway
RBAC"): watch the engine EndpointSlices, read and patch this LLMService's
scale subresource (autoscaler), patch engine pods (pod-deletion-cost before
a scale-in) and hold a Lease (one active autoscaler). The operator must hold
every one of these itself to grant them (RBAC escalation check), so
install.py builds its ClusterRole from GATEWAY_RULES too.
"""
from __future__ import annotations

from typing import Any

from pagedkube.operator import naming
from pagedkube.operator.spec import LLMServiceSpec

# (apiGroup, resource, verbs); resourceNames are added per LLMService where they apply.
GATEWAY_RULES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("discovery.k8s.io", "endpointslices", ("get", "list", "watch")),
    (naming.GROUP, f"{naming.PLURAL}/scale", ("get", "patch")),
    ("", "pods", ("patch",)),
    ("coordination.k8s.io", "leases", ("get", "create", "update")),
)


def build_gateway_service_account(svc: LLMServiceSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": naming.metadata(naming.gateway_name(svc.name), svc.namespace, svc.name, svc.uid, "gateway"),
    }


def build_gateway_role(svc: LLMServiceSpec) -> dict[str, Any]:
    rules = []
    for group, resource, verbs in GATEWAY_RULES:
        rule: dict[str, Any] = {"apiGroups": [group], "resources": [resource], "verbs": list(verbs)}
        if resource == f"{naming.PLURAL}/scale":  # only its own LLMService
            rule["resourceNames"] = [svc.name]
        rules.append(rule)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": naming.metadata(naming.gateway_name(svc.name), svc.namespace, svc.name, svc.uid, "gateway"),
        "rules": rules,
    }


def build_gateway_role_binding(svc: LLMServiceSpec) -> dict[str, Any]:
    name = naming.gateway_name(svc.name)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": naming.metadata(name, svc.namespace, svc.name, svc.uid, "gateway"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": svc.namespace}],
    }
