"""install.yaml and the Helm chart against the real API server; the CRD's schema
and CEL rules enforced by kube-apiserver itself."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kubeutil import ROOT, Kube, load_module

CRD_TESTS = load_module(ROOT / "tests" / "operator" / "test_crd.py", "_pagedkube_e2e_test_crd")

# The API server's message for each invalid LLMService of tests/operator/test_crd.py.
API_MESSAGES = {
    "no model": "spec.model: Required value",
    "unknown scheme": 'spec.model.source: Invalid value: "s3://bucket/llama": spec.model.source in body should match',
    "min > max": "spec.autoscaling: Invalid value: autoscaling.minReplicas must not exceed maxReplicas",
    "replicas above max": "spec: Invalid value: replicas must lie within [autoscaling.minReplicas, "
                          "autoscaling.maxReplicas] when autoscaling",
    "replicas below min": "spec: Invalid value: replicas must lie within [autoscaling.minReplicas, "
                          "autoscaling.maxReplicas] when autoscaling",
    "vllm builtin": "spec: Invalid value: the vllm runtime cannot serve builtin:// models; use hf:// or pvc://",
    "bad runtime": 'spec.engine.runtime: Unsupported value: "tgi": supported values: "pagedkube", "vllm"',
    "bad block size": 'spec.engine.blockSize: Unsupported value: 24: supported values: "8", "16", "32", "64", "128"',
    "negative replicas": "spec.replicas: Invalid value: -1: spec.replicas in body should be greater than or equal to 0",
    "load bound below 1": "spec.gateway.routing.loadBound: Invalid value: 0.9: spec.gateway.routing.loadBound in "
                          "body should be greater than or equal to 1",
    "unknown policy": 'spec.gateway.routing.policy: Unsupported value: "random": supported values: "prefix", '
                      '"round-robin", "least-load"',
    "zero queue target": "spec.autoscaling.targetQueueDepth: Invalid value: 0: spec.autoscaling.targetQueueDepth "
                         "in body should be greater than 0",
    "unknown field": 'strict decoding error: unknown field "spec.replica"',
    "zero ranks": "spec.engine.tensorParallelSize: Invalid value: 0: spec.engine.tensorParallelSize in body should "
                  "be greater than or equal to 1",
    "too many ranks": "spec.engine.tensorParallelSize: Invalid value: 65: spec.engine.tensorParallelSize in body "
                      "should be less than or equal to 64",
    "name too long": "<nil>: Invalid value: metadata.name must be at most 55 characters (children append -gateway)",
    "api keys without name": "spec.gateway.apiKeySecretRef.name: Required value",
    "engine key without name": "spec.engine.apiKeySecretRef.name: Required value",
    "no key but a key secret": "spec.engine: Invalid value: engine.requireApiKey false contradicts "
                               "engine.apiKeySecretRef; drop one",
    "empty metrics peer": "spec.networkPolicy.metricsFrom[0]: Invalid value: 0: spec.networkPolicy.metricsFrom[0] "
                          "in body should have at least 1 properties",
    "pvc dot-dot": "spec.model: Invalid value: model.source must not have a '..' segment",
    "pvc climbing out": "spec.model: Invalid value: model.source must not have a '..' segment",
    "hf revision dot-dot": "spec.model: Invalid value: model.source must not have a '..' segment",
    "open gateway with keys": "spec.gateway: Invalid value: gateway.requireApiKey false contradicts "
                              "gateway.apiKeySecretRef; drop one",
}


def test_every_operator_invalid_case_has_an_api_message() -> None:
    assert sorted(API_MESSAGES) == sorted(c[0] for c in CRD_TESTS.INVALID)


def test_install_yaml_applies_and_the_crd_is_structural(installed: Kube) -> None:
    crd = installed.json("get", "crd", "llmservices.pagedkube.io")
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions["Established"] == "True" and conditions["NamesAccepted"] == "True"
    assert "NonStructuralSchema" not in conditions
    assert crd["status"]["acceptedNames"]["shortNames"] == ["llms"]
    assert installed.json("get", "clusterrole", "pagedkube-operator")["rules"]
    sa = installed.json("get", "serviceaccount", "pagedkube-operator", "-n", "pagedkube-system")
    assert sa["metadata"]["name"] == "pagedkube-operator"
    # the API server serves the resource (discovery), with its short name and category
    resources = installed.run("api-resources", "--api-group", "pagedkube.io", "-o", "wide").stdout
    assert "llms" in resources and "pagedkube" in resources and "LLMService" in resources


@pytest.mark.parametrize("case, obj, reason", CRD_TESTS.INVALID, ids=[c[0] for c in CRD_TESTS.INVALID])
def test_invalid_llmservices_are_rejected_by_the_api_server(installed: Kube, case: str, obj: dict,
                                                           reason: str) -> None:
    p = installed.apply(obj, namespace="default", check=False)
    assert p.returncode != 0, f"{case}: the API server accepted it:\n{p.stdout}"
    assert API_MESSAGES[case] in p.stderr, p.stderr
    assert installed.get("llms", obj["metadata"]["name"], "default") is None


def test_fixed_spec_is_accepted_with_defaults(installed: Kube) -> None:
    obj = CRD_TESTS.variant(autoscaling={"enabled": True, "minReplicas": 0, "maxReplicas": 3}, replicas=0,
                            engine={"runtime": "vllm"}, model={"source": "pvc://weights/llama"})
    obj["metadata"]["name"] = "e2e-fixed"
    installed.run("create", "namespace", "e2e-valid", check=False)
    installed.apply(obj, namespace="e2e-valid", check=True)
    try:
        got = installed.json("get", "llms", "e2e-fixed", "-n", "e2e-valid")
        assert got["spec"]["engine"]["blockSize"] == 16  # structural defaulting by the API server
        assert got["spec"]["gateway"]["routing"] == {"policy": "prefix", "loadBound": 1.5}
        assert got["spec"]["autoscaling"]["targetQueueDepth"] == 4
    finally:
        installed.run("delete", "namespace", "e2e-valid", "--wait=false")


def test_helm_install_of_the_chart(installed: Kube, binaries, tmp_path: Path) -> None:
    """The chart next to install.yaml (the CRD is install.yaml's, so crds.install=false):
    every object is accepted and, with kwok running the pods, `--wait` sees it ready."""
    helm = str(binaries.helm_path())
    env = ["--kubeconfig", str(installed.kubeconfig)]
    p = subprocess.run([helm, *env, "install", "e2e-chart", str(ROOT / "charts" / "pagedkube"),
                        "-n", "e2e-helm", "--create-namespace", "--set", "crds.install=false",
                        "--wait", "--timeout", "3m"], capture_output=True, text=True, timeout=240)
    try:
        assert p.returncode == 0, p.stderr
        deployments = installed.json("get", "deployments", "-n", "e2e-helm")["items"]
        assert [d["status"].get("readyReplicas") for d in deployments] == [1]
        sa = deployments[0]["spec"]["template"]["spec"]["serviceAccountName"]
        assert installed.get("serviceaccount", sa, "e2e-helm") is not None
        can = installed.run("auth", "can-i", "patch", "llmservices/status", "--all-namespaces",
                            f"--as=system:serviceaccount:e2e-helm:{sa}", check=False)
        assert can.stdout.strip() == "yes", can.stdout + can.stderr
    finally:
        subprocess.run([helm, *env, "uninstall", "e2e-chart", "-n", "e2e-helm", "--wait", "--timeout", "2m"],
                       capture_output=True, timeout=180)


def test_the_charts_crd_is_accepted(installed: Kube, binaries) -> None:
    """The chart's own CRD (templates/crd.yaml, with helm.sh/resource-policy: keep), applied
    to the API server as a server-side dry run over install.yaml's."""
    p = subprocess.run([str(binaries.helm_path()), "template", "e2e-chart", str(ROOT / "charts" / "pagedkube"),
                        "--show-only", "templates/crd.yaml"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "helm.sh/resource-policy: keep" in p.stdout
    out = installed.run("apply", "--dry-run=server", "-f", "-", input=p.stdout).stdout
    assert out.strip() == "customresourcedefinition.apiextensions.k8s.io/llmservices.pagedkube.io " \
                          "configured (server dry run)"
