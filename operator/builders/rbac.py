"""The gateway's ServiceAccount, Role, RoleBinding and Lease (pure).

The Role holds exactly what the gateway does (docs/interfaces.md, "Gateway
RBAC"): watch the engine EndpointSlices, read and patch this LLMService's
scale subresource (autoscaler), read this LLMService and patch its status
(status.adapters, gateway/adapter_status.py), and read and renew its own Lease (one active
autoscaler), which the operator creates empty so that no `create` (which
resourceNames cannot limit) is granted. Names are pinned by resourceNames
wherever Kubernetes allows it; EndpointSlices have generated names. The
operator must hold every one of these itself to grant them (RBAC escalation
check), so install.py builds its ClusterRole from GATEWAY_RULES too.
"""
from __future__ import annotations

from typing import Any

from pagedkube.gateway.autoscaler.lease import lease_name
from pagedkube.operator import naming
from pagedkube.operator.spec import LLMServiceSpec

# (apiGroup, resource, verbs); resourceNames are added per LLMService where they apply (_names).
GATEWAY_RULES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("discovery.k8s.io", "endpointslices", ("get", "list", "watch")),
    (naming.GROUP, f"{naming.PLURAL}/scale", ("get", "patch")),
    (naming.GROUP, naming.PLURAL, ("get",)),
    (naming.GROUP, f"{naming.PLURAL}/status", ("patch",)),
    ("coordination.k8s.io", "leases", ("get", "update")),
)


def _names(svc: LLMServiceSpec, resource: str) -> list[str] | None:
    """The only objects of `resource` the gateway of `svc` may touch; None: any in the namespace."""
    return {f"{naming.PLURAL}/scale": [svc.name], naming.PLURAL: [svc.name], f"{naming.PLURAL}/status": [svc.name],
            "leases": [lease_name(svc.name)]}.get(resource)


def build_gateway_lease(svc: LLMServiceSpec) -> dict[str, Any]:
    """The autoscaler Lease, empty: created once by the operator (not applied: the gateway writes
    its spec), so the gateway needs no `create`."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": naming.metadata(lease_name(svc.name), svc.namespace, svc.name, svc.uid, "gateway"),
        "spec": {},
    }


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
        if (names := _names(svc, resource)) is not None:
            rule["resourceNames"] = names
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
