"""The operator's own install objects, the source of manifests/install.yaml (pure).

The ClusterRole holds exactly the verbs the operator's code (and kopf) uses,
plus everything the gateway Role grants (GATEWAY_RULES): Kubernetes refuses to
let anyone create a Role granting permissions it does not hold itself (unless
it has `escalate`/`bind`, which would be far broader).
"""
from __future__ import annotations

from typing import Any

from pagedkube.operator import naming
from pagedkube.operator.builders.common import LIVENESS_FAILURES, LIVENESS_PERIOD_S, PROBE_TIMEOUT_S, RUN_AS_USER
from pagedkube.operator.builders.rbac import GATEWAY_RULES
from pagedkube.operator.crd import build_crd

NAMESPACE = "pagedkube-system"
OPERATOR_NAME = "pagedkube-operator"
HEALTH_PORT = 8080
# Children are never deleted by the operator (ownerReferences and the garbage collector do it),
# but for the two a spec switch turns off (ServiceMonitor, NetworkPolicy);
# server-side apply that creates needs `create` as well as `patch`.
CHILD_VERBS = ("get", "list", "watch", "create", "patch")

# (apiGroup, resource, verbs) the operator itself uses; see handlers.py and kube.py.
OPERATOR_RULES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (naming.GROUP, naming.PLURAL, ("get", "list", "watch", "patch")),   # kopf: watch, finalizers, annotations
    (naming.GROUP, f"{naming.PLURAL}/status", ("get", "patch")),
    ("apps", "deployments", (*CHILD_VERBS, "delete")),   # delete: an engine that became a LeaderWorkerSet
    ("leaderworkerset.x-k8s.io", "leaderworkersets", (*CHILD_VERBS, "delete")),   # nodesPerReplica > 1, and back
    ("", "services", CHILD_VERBS),
    ("", "configmaps", CHILD_VERBS),                # spec.adapters' list, which the engines read
    ("", "serviceaccounts", CHILD_VERBS),
    ("rbac.authorization.k8s.io", "roles", CHILD_VERBS),
    ("rbac.authorization.k8s.io", "rolebindings", CHILD_VERBS),
    ("policy", "poddisruptionbudgets", CHILD_VERBS),
    ("networking.k8s.io", "networkpolicies", (*CHILD_VERBS, "delete")),   # delete: networkPolicy off
    ("", "secrets", ("create",)),              # the generated Secrets: made once, never read, listed or changed
    ("coordination.k8s.io", "leases", ("create",)),   # the gateway's autoscaler Lease, made once, empty
    ("monitoring.coreos.com", "servicemonitors", ("get", "create", "patch", "delete")),  # delete: monitoring off
    ("apiextensions.k8s.io", "customresourcedefinitions", ("get", "list", "watch")),  # kopf observer; CRD probe
    ("", "pods", ("list", "watch")),                                    # status from engine pods
    ("", "events", ("create",)),                                        # kopf.info / kopf.warn
)


def operator_rules() -> list[dict[str, Any]]:
    """OPERATOR_RULES merged with GATEWAY_RULES, one rule per (group, resource), verbs in a fixed order."""
    merged: dict[tuple[str, str], list[str]] = {}
    for group, resource, verbs in OPERATOR_RULES + GATEWAY_RULES:
        have = merged.setdefault((group, resource), [])
        have += [v for v in verbs if v not in have]
    order = ("get", "list", "watch", "create", "update", "patch", "delete")
    return [{"apiGroups": [group], "resources": [resource], "verbs": sorted(verbs, key=order.index)}
            for (group, resource), verbs in merged.items()]


def _labels() -> dict[str, str]:
    return {"app.kubernetes.io/name": "pagedkube", "app.kubernetes.io/component": "operator"}


def operator_deployment(image: str = naming.GATEWAY_IMAGE) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": OPERATOR_NAME, "namespace": NAMESPACE, "labels": _labels()},
        "spec": {
            "replicas": 1,
            # kopf peering is not leader election: never two operators at once.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": _labels()},
            "template": {
                "metadata": {"labels": _labels()},
                "spec": {
                    "serviceAccountName": OPERATOR_NAME,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "operator",
                        "image": image,
                        "command": ["pagedkube"],
                        "args": ["operator", "--all-namespaces", "--standalone",
                                 "--liveness", f"http://0.0.0.0:{HEALTH_PORT}/healthz"],
                        "env": [{"name": "HOME", "value": "/tmp"}],
                        "ports": [{"name": "health", "containerPort": HEALTH_PORT, "protocol": "TCP"}],
                        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "health"},
                                          "periodSeconds": LIVENESS_PERIOD_S, "timeoutSeconds": PROBE_TIMEOUT_S,
                                          "failureThreshold": LIVENESS_FAILURES},
                        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"},
                                      "limits": {"memory": "512Mi"}},
                        "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                                            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}},
                        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                    }],
                    "volumes": [{"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }


def install_objects() -> list[dict[str, Any]]:
    meta = {"name": OPERATOR_NAME, "labels": _labels()}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE, "labels": _labels()}},
        build_crd(),
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {**meta, "namespace": NAMESPACE}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": meta,
         "rules": operator_rules()},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": OPERATOR_NAME},
         "subjects": [{"kind": "ServiceAccount", "name": OPERATOR_NAME, "namespace": NAMESPACE}]},
        operator_deployment(),
    ]
