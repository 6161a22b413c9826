"""The operator's ClusterRole (install.yaml) against the gateway Role it grants, and torch-freedom."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from pagedkube.operator.builders.rbac import build_gateway_role
from pagedkube.operator.spec import LLMServiceSpec

ROOT = Path(__file__).resolve().parents[2]


def triples(rules: list[dict]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def cluster_role() -> dict:
    docs = yaml.safe_load_all((ROOT / "manifests/install.yaml").read_text())
    (role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    return role


def test_the_operator_holds_everything_it_grants_the_gateway_and_no_wildcards() -> None:
    svc = LLMServiceSpec.from_body({"metadata": {"name": "x", "namespace": "ns", "uid": "u"},
                                    "spec": {"model": {"source": "builtin://tiny"}}})
    granted = triples(build_gateway_role(svc)["rules"])
    held = triples(cluster_role()["rules"])
    assert granted <= held  # else the API server refuses the Role (RBAC escalation check)
    for role in (cluster_role()["rules"], build_gateway_role(svc)["rules"]):
        for rule in role:
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
    assert not any(v in {"escalate", "bind", "impersonate"} for _, _, v in held)


def test_children_are_never_deleted_by_the_operator_but_those_a_switch_turns_off() -> None:
    deletable = {(g, r) for g, r, v in triples(cluster_role()["rules"]) if v == "delete"}
    # spec.engine.nodesPerReplica crossing 1 swaps the engine's Deployment for a LeaderWorkerSet, and back
    assert deletable == {("monitoring.coreos.com", "servicemonitors"), ("networking.k8s.io", "networkpolicies"),
                         ("apps", "deployments"), ("leaderworkerset.x-k8s.io", "leaderworkersets")}


def test_secrets_are_only_created_never_read() -> None:
    assert {v for g, r, v in triples(cluster_role()["rules"]) if (g, r) == ("", "secrets")} == {"create"}


def test_operator_modules_import_without_torch() -> None:
    code = ("import sys, pagedkube.operator.cli, pagedkube.operator.handlers, pagedkube.operator.reconcile, "
            "pagedkube.operator.manifests; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
