"""The control plane itself: the pinned version, RBAC on, kwok nodes, idempotent up."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kubeutil import ROOT, VERSIONS, Kube


def test_clients_see_the_pinned_kubernetes_version(kube: Kube) -> None:
    server = json.loads(kube.run("version", "-o", "json").stdout)["serverVersion"]
    assert (server["gitVersion"], server["major"], server["minor"]) == (VERSIONS["K8S_VERSION"], "1", "35")


def test_rbac_is_enforced(kube: Kube) -> None:
    p = kube.run("auth", "can-i", "create", "pods", "--as=system:serviceaccount:default:default", check=False)
    assert p.stdout.strip() == "no"
    p = kube.run("auth", "can-i", "create", "pods", check=False)
    assert p.stdout.strip() == "yes"


def test_two_kwok_nodes_are_ready(kube: Kube) -> None:
    nodes = kube.json("get", "nodes")["items"]
    assert len(nodes) == 2
    for node in nodes:
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True"
        assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"


def test_up_again_keeps_the_running_cluster(kube: Kube, cluster: Path) -> None:
    if os.environ.get("PAGEDKUBE_E2E_KUBECONFIG"):
        pytest.skip("a cluster given by PAGEDKUBE_E2E_KUBECONFIG is not ours to restart")
    uid = kube.json("get", "namespace", "kube-system")["metadata"]["uid"]
    p = subprocess.run([str(ROOT / "e2e" / "cluster" / "cluster.sh"), "up"], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PYTHON": sys.executable})
    assert p.returncode == 0, p.stderr
    assert Path(p.stdout.strip()) == cluster
    assert kube.json("get", "namespace", "kube-system")["metadata"]["uid"] == uid
