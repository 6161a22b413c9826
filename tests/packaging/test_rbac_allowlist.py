"""Every permission pagedkube asks for, as rendered (the chart's RBAC, manifests/install.yaml and
the Role the operator builds for each gateway), against an allow-list that gives each its reason.

A wildcard anywhere fails; a cluster-wide (ClusterRole) permission fails unless listed in
CLUSTER_WIDE with why it cannot be namespaced or named; a namespaced permission that
resourceNames do not pin to named objects fails unless listed in NAMESPACE_WIDE. Adding a
permission means adding its reason here, where a reviewer sees it."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from pagedkube.operator.builders.rbac import build_gateway_role
from pagedkube.operator.install import install_objects
from pagedkube.operator.spec import LLMServiceSpec

ROOT = Path(__file__).resolve().parents[2]
CHILD = "creates, reads and re-applies this child of every LLMService (server-side apply: create + patch)"
GRANT = ("granted to each gateway's Role (pinned there by resourceNames); Kubernetes lets a subject grant "
         "only what it holds itself")

# (apiGroup, resource, verb) -> why the operator holds it in every namespace.
CLUSTER_WIDE: dict[tuple[str, str, str], str] = {
    **{("pagedkube.io", "llmservices", v): "kopf watches LLMServices in every namespace it serves"
       for v in ("get", "list", "watch")},
    ("pagedkube.io", "llmservices", "patch"): "kopf's finalizer and last-handled annotation",
    **{("pagedkube.io", "llmservices/status", v): "status reported from what runs" for v in ("get", "patch")},
    **{(g, r, v): CHILD for g, r in (("apps", "deployments"), ("", "services"), ("", "serviceaccounts"),
                                     ("rbac.authorization.k8s.io", "roles"),
                                     ("rbac.authorization.k8s.io", "rolebindings"),
                                     ("policy", "poddisruptionbudgets"), ("networking.k8s.io", "networkpolicies"))
       for v in ("get", "list", "watch", "create", "patch")},
    **{("", "configmaps", v): "the NAME-adapters child (spec.adapters, which the engines follow); " + CHILD
       for v in ("get", "list", "watch", "create", "patch")},
    ("networking.k8s.io", "networkpolicies", "delete"): "spec.networkPolicy.enabled false removes it",
    ("apps", "deployments", "delete"): "an engine Deployment replaced by a LeaderWorkerSet (nodesPerReplica > 1)",
    **{("leaderworkerset.x-k8s.io", "leaderworkersets", v): "the multi-node engine child (nodesPerReplica > 1); "
       + CHILD for v in ("get", "list", "watch", "create", "patch")},
    ("leaderworkerset.x-k8s.io", "leaderworkersets", "delete"): "nodesPerReplica back to 1 replaces it by a Deployment",
    ("", "secrets", "create"): "the generated Secrets, made once by create (409 = exists); never read",
    ("coordination.k8s.io", "leases", "create"): "each gateway's autoscaler Lease, made once, empty",
    **{("coordination.k8s.io", "leases", v): GRANT for v in ("get", "update")},
    **{("monitoring.coreos.com", "servicemonitors", v): "the optional ServiceMonitor child"
       for v in ("get", "create", "patch")},
    ("monitoring.coreos.com", "servicemonitors", "delete"): "spec.monitoring.enabled false removes it",
    **{("apiextensions.k8s.io", "customresourcedefinitions", v): "kopf's CRD observer; the ServiceMonitor CRD probe"
       for v in ("get", "list", "watch")},
    **{("", "pods", v): "status (Ready, CrashLooping) from the engine pods" for v in ("list", "watch")},
    ("", "events", "create"): "Events on LLMServices",
    **{("discovery.k8s.io", "endpointslices", v): GRANT for v in ("get", "list", "watch")},
    **{("pagedkube.io", "llmservices/scale", v): GRANT for v in ("get", "patch")},
}
# (apiGroup, resource, verb) -> why a gateway's Role holds it for every object of its namespace.
NAMESPACE_WIDE: dict[tuple[str, str, str], str] = {
    **{("discovery.k8s.io", "endpointslices", v): "the engine Service's slices have generated names; the "
       "gateway selects them by the kubernetes.io/service-name label" for v in ("get", "list", "watch")},
}
NEVER = {"escalate", "bind", "impersonate", "*"}


def triples(rule: dict) -> list[tuple[str, str, str]]:
    return [(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]]


def chart_rbac(helm: Path) -> list[dict]:
    """The chart's roles as `helm template` renders them with default values."""
    out = subprocess.run([str(helm), "template", "t", str(ROOT / "charts" / "pagedkube"), "--namespace", "ns"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return [o for o in yaml.safe_load_all(out) if o and o["kind"] in ("ClusterRole", "Role")]


def gateway_roles() -> list[dict]:
    specs = [{"model": {"source": "builtin://tiny"}},
             {"model": {"source": "builtin://tiny"}, "autoscaling": {"enabled": True},
              "gateway": {"replicas": 3, "apiKeySecretRef": {"name": "k"}}}]
    return [build_gateway_role(LLMServiceSpec.from_body({"metadata": {"name": "x", "namespace": "ns", "uid": "u"},
                                                         "spec": spec})) for spec in specs]


def check(role: dict) -> list[str]:
    """Each permission of `role` the allow-lists do not give a reason for."""
    problems = []
    for rule in role["rules"]:
        if "*" in rule["apiGroups"] + rule["resources"] + rule["verbs"] + rule.get("resourceNames", []):
            problems.append(f"wildcard in {rule}")
        for triple in triples(rule):
            if triple[2] in NEVER:
                problems.append(f"{triple}: never")
            elif role["kind"] == "ClusterRole" and triple not in CLUSTER_WIDE:
                problems.append(f"{triple}: cluster-wide without a reason")
            elif role["kind"] == "Role" and not rule.get("resourceNames") and triple not in NAMESPACE_WIDE:
                problems.append(f"{triple}: every object of the namespace without a reason")
    return problems


def test_every_rendered_permission_has_a_reason(helm) -> None:
    roles = chart_rbac(helm) + [o for o in install_objects() if o["kind"] == "ClusterRole"] \
        + gateway_roles()
    assert [r["kind"] for r in roles] == ["ClusterRole", "ClusterRole", "Role", "Role"]
    assert [p for role in roles for p in check(role)] == []


def test_the_gateway_role_pins_what_it_can_by_name() -> None:
    for role in gateway_roles():
        named = {(t[1], tuple(rule["resourceNames"])) for rule in role["rules"] if rule.get("resourceNames")
                 for t in triples(rule)}
        assert named == {("llmservices/scale", ("x",)), ("llmservices", ("x",)), ("llmservices/status", ("x",)),
                         ("leases", ("x-autoscaler",))}
        assert not [t for rule in role["rules"] for t in triples(rule) if t[2] == "create"]


def test_the_operator_reads_no_secret_and_patches_no_pod() -> None:
    (role,) = [o for o in install_objects() if o["kind"] == "ClusterRole"]
    assert {t[2] for rule in role["rules"] for t in triples(rule) if t[1] == "secrets"} == {"create"}
    assert {t[2] for rule in role["rules"] for t in triples(rule) if t[1] == "pods"} == {"list", "watch"}
    for gateway in gateway_roles():
        assert not [rule for rule in gateway["rules"] if "pods" in rule["resources"]]


@pytest.mark.parametrize("rule, problem", [
    ({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}, "cluster-wide without a reason"),
    ({"apiGroups": ["*"], "resources": ["pods"], "verbs": ["list"]}, "wildcard"),
    ({"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["bind"]}, "never"),
])
def test_the_check_catches_what_it_must(rule: dict, problem: str) -> None:
    assert any(problem in p for p in check({"kind": "ClusterRole", "rules": [rule]}))
    namespaced = check({"kind": "Role", "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]})
    assert namespaced == ["('', 'configmaps', 'get'): every object of the namespace without a reason"]


def test_chart_and_manifests_agree(helm) -> None:
    chart = [r for r in chart_rbac(helm) if r["kind"] == "ClusterRole"]
    plain = [o for o in yaml.safe_load_all((ROOT / "manifests/install.yaml").read_text()) if o["kind"] == "ClusterRole"]
    assert [r["rules"] for r in chart] == [r["rules"] for r in plain]
