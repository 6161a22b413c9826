"""manifests/crd.yaml and install.yaml: up to date, valid, and the CRD's schema and CEL rules offline."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from pagedkube.gateway.autoscaler.policy import SPEC_NAMES, check_bounds
from pagedkube.operator.install import NAMESPACE, OPERATOR_NAME
from pagedkube.operator.manifests import render

sys.path.insert(0, str(Path(__file__).parent))
from llms_crd_check import validate  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / "manifests/crd.yaml").read_text())
EXAMPLES = sorted((ROOT / "manifests/examples").glob("*.yaml"))


def test_generated_manifests_are_up_to_date() -> None:
    for rel, text in render().items():
        assert (ROOT / rel).read_text() == text, f"{rel} is stale: run python -m pagedkube.operator.manifests"


def test_install_yaml_objects_are_valid_kubernetes() -> None:
    objs = list(yaml.safe_load_all((ROOT / "manifests/install.yaml").read_text()))
    assert [o["kind"] for o in objs] == ["Namespace", "CustomResourceDefinition", "ServiceAccount",
                                         "ClusterRole", "ClusterRoleBinding", "Deployment"]
    assert objs[1] == CRD
    for obj in objs:
        assert kubernetes_validate.validate(obj, "1.37", strict=True) == "1.37", obj["kind"]
    deployment = objs[-1]
    assert deployment["metadata"]["namespace"] == NAMESPACE
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}  # kopf peering is no leader election
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    assert c["args"] == ["operator", "--all-namespaces", "--standalone", "--liveness", "http://0.0.0.0:8080/healthz"]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == OPERATOR_NAME


def test_crd_shape() -> None:
    assert CRD["metadata"]["name"] == "llmservices.pagedkube.io"
    names = CRD["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"], names["categories"]) == (
        "LLMService", "llmservices", ["llms"], ["pagedkube"])
    (version,) = CRD["spec"]["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}, "scale": {
        "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector"}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == ["Model", "Replicas", "Ready", "URL",
                                                                       "Adapters", "Age"]


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_accepted(path: Path) -> None:
    docs = list(yaml.safe_load_all(path.read_text()))
    assert docs and all(d["kind"] == "LLMService" for d in docs)
    for doc in docs:
        assert validate(CRD, doc) == []


def test_defaults_are_applied_like_the_api_server() -> None:
    from llms_crd_check import apply_defaults
    schema = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    obj = apply_defaults(schema, {"spec": {"model": {"source": "builtin://tiny"}}})
    assert obj["spec"]["replicas"] == 1
    assert obj["spec"]["engine"] == {"runtime": "pagedkube", "blockSize": 16, "maxNumSeqs": 256,
                                     "requireApiKey": True, "toolCallParser": "auto",
                                     "structuredOutputsBackend": "auto", "tensorParallelSize": 1,
                                     "nodesPerReplica": 1}
    # drainTimeoutSeconds has no schema default: the operator derives it
    assert obj["spec"]["gateway"]["routing"] == {"policy": "prefix", "loadBound": 1.5}
    assert obj["spec"]["gateway"]["routeHeaders"] is False
    assert obj["spec"]["networkPolicy"] == {"enabled": True}   # metricsFrom unset: the operator's default


BASE = {"apiVersion": "pagedkube.io/v1alpha1", "kind": "LLMService", "metadata": {"name": "x"},
        "spec": {"model": {"source": "builtin://tiny"}}}


def variant(**spec_changes: object) -> dict:
    obj = copy.deepcopy(BASE)
    obj["spec"].update(spec_changes)
    return obj


INVALID = [
    ("no model", {**BASE, "spec": {"replicas": 1}}, "spec: 'model' is a required property"),
    ("unknown scheme", variant(model={"source": "s3://bucket/llama"}), "spec.model.source: 's3://bucket/llama' does not match"),
    ("min > max", variant(autoscaling={"enabled": False, "minReplicas": 5, "maxReplicas": 2}),
     ".spec.autoscaling: autoscaling.minReplicas must not exceed maxReplicas"),
    ("replicas above max", variant(autoscaling={"enabled": True, "minReplicas": 1, "maxReplicas": 3}, replicas=4),
     ".spec: replicas must lie within [autoscaling.minReplicas, autoscaling.maxReplicas] when autoscaling"),
    ("replicas below min", variant(autoscaling={"enabled": True, "minReplicas": 2}, replicas=1),
     ".spec: replicas must lie within"),
    ("vllm builtin", variant(engine={"runtime": "vllm"}), ".spec: the vllm runtime cannot serve builtin:// models"),
    ("bad runtime", variant(engine={"runtime": "tgi"}), "spec.engine.runtime: 'tgi' is not one of"),
    ("bad block size", variant(engine={"blockSize": 24}), "spec.engine.blockSize: 24 is not one of"),
    ("zero ranks", variant(engine={"tensorParallelSize": 0}),
     "spec.engine.tensorParallelSize: 0 is less than the minimum of 1"),
    ("too many ranks", variant(engine={"tensorParallelSize": 65}),
     "spec.engine.tensorParallelSize: 65 is greater than the maximum of 64"),
    ("negative replicas", variant(replicas=-1), "spec.replicas: -1 is less than the minimum of 0"),
    ("load bound below 1", variant(gateway={"routing": {"loadBound": 0.9}}),
     "spec.gateway.routing.loadBound: 0.9 is less than the minimum of 1.0"),
    ("unknown policy", variant(gateway={"routing": {"policy": "random"}}), "spec.gateway.routing.policy: 'random'"),
    ("zero queue target", variant(autoscaling={"targetQueueDepth": 0}),
     "spec.autoscaling.targetQueueDepth: 0 is less than or equal to the minimum of 0"),
    ("unknown field", variant(replica=2), "spec: Additional properties are not allowed ('replica' was unexpected)"),
    ("name too long", {**variant(), "metadata": {"name": "x" * 56}},
     "<root>: metadata.name must be at most 55 characters"),
    ("api keys without name", variant(gateway={"apiKeySecretRef": {}}),
     "spec.gateway.apiKeySecretRef: 'name' is a required property"),
    ("engine key without name", variant(engine={"apiKeySecretRef": {}}),
     "spec.engine.apiKeySecretRef: 'name' is a required property"),
    ("no key but a key secret", variant(engine={"requireApiKey": False, "apiKeySecretRef": {"name": "k"}}),
     ".spec.engine: engine.requireApiKey false contradicts engine.apiKeySecretRef"),
    ("empty metrics peer", variant(networkPolicy={"metricsFrom": [{}]}), "spec.networkPolicy.metricsFrom.0: {}"),
    ("pvc dot-dot", variant(model={"source": "pvc://c/../x"}), ".spec.model: model.source must not have a '..' segment"),
    ("pvc climbing out", variant(model={"source": "pvc://claim/../../var/run/secrets/kubernetes.io/token"}),
     ".spec.model: model.source must not have a '..' segment"),
    ("hf revision dot-dot", variant(model={"source": "hf://org/name@../x"}),
     ".spec.model: model.source must not have a '..' segment"),
    ("open gateway with keys", variant(gateway={"requireApiKey": False, "apiKeySecretRef": {"name": "k"}}),
     ".spec.gateway: gateway.requireApiKey false contradicts gateway.apiKeySecretRef"),
]


@pytest.mark.parametrize("case, obj, reason", INVALID, ids=[c[0] for c in INVALID])
def test_invalid_llmservices_fail_for_the_stated_reason(case: str, obj: dict, reason: str) -> None:
    errors = validate(CRD, obj)
    assert len(errors) == 1, errors
    assert errors[0].startswith(reason), errors


def test_the_crd_and_check_bounds_accept_the_same_autoscaling_bounds() -> None:
    """The API server's rules (schema minimums, the min <= max CEL rule) and the one function
    the operator's spec and the gateway's flags call agree on every bound in a grid."""
    verdicts = []
    for min_replicas in (-1, 0, 1, 3):
        for max_replicas in (0, 1, 3):
            for depth in (-1.0, 0.0, 0.5, 4.0):
                obj = variant(autoscaling={"minReplicas": min_replicas, "maxReplicas": max_replicas,
                                           "targetQueueDepth": depth})
                try:
                    check_bounds(min_replicas, max_replicas, depth, SPEC_NAMES)
                    accepted = True
                except ValueError:
                    accepted = False
                verdicts.append(((min_replicas, max_replicas, depth), validate(CRD, obj) == [], accepted))
    assert [v for v in verdicts if v[1] != v[2]] == []
    assert sum(v[2] for v in verdicts) == 10   # (0|1, 1|3) and (3, 3) with the two positive depths


def test_the_same_specs_pass_when_fixed() -> None:
    ok = variant(autoscaling={"enabled": True, "minReplicas": 0, "maxReplicas": 3}, replicas=0,
                 engine={"runtime": "vllm", "apiKeySecretRef": {"name": "engine-key"}, "requireApiKey": True},
                 gateway={"routeHeaders": True},
                 networkPolicy={"metricsFrom": [{"namespaceSelector": {"matchLabels": {"team": "obs"}}}]},
                 model={"source": "pvc://weights/llama"})
    assert validate(CRD, ok) == []
    for source in ("pvc://c/models/llama..v2/x", "pvc://c/a.b/...", "hf://org/name@v1.0", "pvc://c/./x"):
        assert validate(CRD, variant(model={"source": source})) == [], source   # dots, but no '..' segment
    assert validate(CRD, variant(gateway={"requireApiKey": False})) == []
