"""The operator, as a process with its ServiceAccount's token, against the real
control plane: the CPU example becomes Ready (kwok runs the pods) secure by default
(a generated engine Secret, a NetworkPolicy, the key and hash seed by secretKeyRef),
scales through the scale subresource, has hand edits put back, and is garbage-collected.

The tests run in file order on one LLMService (each step builds on the last).
"""
from __future__ import annotations

import base64
import json

import pytest
import yaml

from kubeutil import ROOT, Kube, wait_for

NS = "e2e-operator"
EXAMPLE = ROOT / "manifests" / "examples" / "llmservice.yaml"
# The example a newcomer applies first (its name and model follow the default model).
NAME = yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"]
SOURCE = yaml.safe_load(EXAMPLE.read_text())["spec"]["model"]["source"]
CHILDREN = [("deployment", f"{NAME}-engine"), ("deployment", f"{NAME}-gateway"),
            ("service", f"{NAME}-engine"), ("service", NAME), ("serviceaccount", f"{NAME}-gateway"),
            ("role", f"{NAME}-gateway"), ("rolebinding", f"{NAME}-gateway"),
            ("poddisruptionbudget", f"{NAME}-engine"), ("networkpolicy", f"{NAME}-engine"),
            ("secret", f"{NAME}-engine-secret")]
GENERATED = f"{NAME}-engine-secret"


@pytest.fixture(scope="module")
def llms(installed: Kube, operator) -> Kube:
    installed.run("create", "namespace", NS, check=False)
    yield installed
    installed.run("delete", "namespace", NS, "--wait=false", check=False)


def condition(obj: dict, type_: str) -> dict:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type_), {})


def engine_replicas(kube: Kube) -> int | None:
    d = kube.get("deployment", f"{NAME}-engine", NS)
    return d and d["spec"]["replicas"]


def ready_with(kube: Kube, replicas: int, operator) -> dict | None:
    assert operator.proc.poll() is None, f"operator died:\n{operator.log()[-6000:]}"
    obj = kube.get("llms", NAME, NS)
    if obj and condition(obj, "Ready").get("status") == "True" and obj["status"].get("readyReplicas") == replicas \
            and obj["status"].get("replicas") == replicas:
        return obj
    return None


def test_the_operator_holds_only_its_service_account(installed: Kube, operator) -> None:
    who = installed.run("--kubeconfig", str(operator.kubeconfig), "auth", "whoami", "-o", "json")
    assert json.loads(who.stdout)["status"]["userInfo"]["username"] == \
        "system:serviceaccount:pagedkube-system:pagedkube-operator"


def test_example_becomes_ready_with_owned_children(llms: Kube, operator) -> None:
    llms.apply(EXAMPLE, namespace=NS)
    obj = wait_for(lambda: ready_with(llms, 2, operator), f"LLMService {NAME} Ready with 2 engines", timeout=180)
    status = obj["status"]
    assert status["url"] == f"http://{NAME}.{NS}.svc.cluster.local"
    assert status["selector"] == (f"app.kubernetes.io/component=engine,app.kubernetes.io/instance={NAME},"
                                  "app.kubernetes.io/name=pagedkube")
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    uid = obj["metadata"]["uid"]
    for kind, name in CHILDREN:
        child = llms.get(kind, name, NS)
        assert child is not None, f"{kind}/{name} missing:\n{operator.log()[-4000:]}"
        (owner,) = child["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == ("LLMService", NAME, uid, True)
    pods = llms.json("get", "pods", "-n", NS, "-l", status["selector"])["items"]
    assert len(pods) == 2 and all(p["status"]["phase"] == "Running" for p in pods)
    assert llms.json("get", "service", f"{NAME}-engine", "-n", NS)["spec"]["clusterIP"] == "None"


def env_of(kube: Kube, deployment: str) -> list[dict]:
    d = kube.get("deployment", deployment, NS)
    return d["spec"]["template"]["spec"]["containers"][0].get("env", []) if d else []


def secret_ref(secret: str, key: str) -> dict:
    return {"secretKeyRef": {"name": secret, "key": key}}


def test_secure_by_default_secret_network_policy_and_env(llms: Kube, operator) -> None:
    """The API server accepted and stored what the builders made: a random key and seed, a
    NetworkPolicy admitting only this gateway and Prometheus, both read by secretKeyRef."""
    secret = llms.get("secret", GENERATED, NS)
    values = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert sorted(values) == ["api-key", "hash-seed"]
    assert all(len(v) >= 43 for v in values.values()) and values["api-key"] != values["hash-seed"]
    policy = llms.get("networkpolicy", f"{NAME}-engine", NS)
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "engine"
    assert [rule["from"] for rule in policy["spec"]["ingress"]] == [
        [{"podSelector": {"matchLabels": {"app.kubernetes.io/component": "gateway",
                                          "app.kubernetes.io/instance": NAME, "app.kubernetes.io/name": "pagedkube"}}}],
        [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]]
    assert {"name": "PAGEDKUBE_API_KEY", "valueFrom": secret_ref(GENERATED, "api-key")} in env_of(llms, f"{NAME}-engine")
    assert {"name": "PAGEDKUBE_HASH_SEED", "valueFrom": secret_ref(GENERATED, "hash-seed")} in \
        env_of(llms, f"{NAME}-engine")
    assert {"name": "PAGEDKUBE_ENGINE_API_KEY", "valueFrom": secret_ref(GENERATED, "api-key")} in \
        env_of(llms, f"{NAME}-gateway")
    for deployment in (f"{NAME}-engine", f"{NAME}-gateway"):
        assert values["api-key"] not in json.dumps(llms.get("deployment", deployment, NS))
    args = llms.get("deployment", f"{NAME}-gateway", NS)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--route-headers" not in args
    # Closed by default: a generated client key, and the gateway reads its keys file.
    client = {k: base64.b64decode(v).decode() for k, v in llms.get("secret", f"{NAME}-api-key", NS)["data"].items()}
    assert sorted(client) == ["api-key", "api-keys.yaml"] and len(client["api-key"]) >= 43
    assert json.loads(client["api-keys.yaml"]) == {"keys": [{"key": client["api-key"], "name": "default"}]}
    assert args[args.index("--api-keys") + 1] == "/etc/pagedkube/api-keys/api-keys.yaml"
    volumes = llms.get("deployment", f"{NAME}-gateway", NS)["spec"]["template"]["spec"]["volumes"]
    assert {"name": "api-keys", "secret": {"secretName": f"{NAME}-api-key", "defaultMode": 420, "items": [
        {"key": "api-keys.yaml", "path": "api-keys.yaml"}]}} in volumes


def test_kubectl_get_llms_prints_the_columns(llms: Kube) -> None:
    out = llms.run("get", "llms", "-n", NS).stdout.splitlines()
    assert out[0].split() == ["NAME", "MODEL", "REPLICAS", "READY", "URL", "AGE"]
    assert out[1].split()[:5] == [NAME, SOURCE, "2", "2", f"http://{NAME}.{NS}.svc.cluster.local"]


def test_kubectl_scale_changes_the_engine_deployment(llms: Kube, operator) -> None:
    llms.run("scale", f"llms/{NAME}", "-n", NS, "--replicas=3")
    wait_for(lambda: engine_replicas(llms) == 3, "engine Deployment at 3 replicas")
    wait_for(lambda: ready_with(llms, 3, operator), "status at 3 ready engines")
    scale = json.loads(llms.run("get", "--raw",
                                f"/apis/pagedkube.io/v1alpha1/namespaces/{NS}/llmservices/{NAME}/scale").stdout)
    assert scale["spec"]["replicas"] == 3 and scale["status"]["replicas"] == 3
    assert scale["status"]["selector"].startswith("app.kubernetes.io/component=engine")


def test_an_hpa_style_scale_subresource_write_is_applied(llms: Kube, operator) -> None:
    """What HPA and KEDA do: PATCH .../llmservices/NAME/scale."""
    llms.run("patch", "llms", NAME, "-n", NS, "--subresource=scale", "--type=merge",
             "-p", '{"spec":{"replicas":1}}')
    wait_for(lambda: engine_replicas(llms) == 1, "engine Deployment at 1 replica")
    wait_for(lambda: ready_with(llms, 1, operator), "status at 1 ready engine")


def test_a_hand_edit_of_a_child_is_put_back(llms: Kube, operator) -> None:
    llms.run("scale", "deployment", f"{NAME}-engine", "-n", NS, "--replicas=4")
    llms.run("label", "service", NAME, "-n", NS, "app.kubernetes.io/name=edited", "--overwrite")
    wait_for(lambda: engine_replicas(llms) == 1, "engine replicas restored to 1")
    wait_for(lambda: llms.json("get", "service", NAME, "-n", NS)["metadata"]["labels"]
             ["app.kubernetes.io/name"] == "pagedkube", "the gateway Service's label restored")
    llms.run("delete", "role", f"{NAME}-gateway", "-n", NS)
    wait_for(lambda: llms.get("role", f"{NAME}-gateway", NS), "the deleted Role re-created")
    events = llms.json("get", "events", "-n", NS, "--field-selector", "reason=Restored")["items"]
    assert events, "no Restored event"


def test_your_own_engine_key_replaces_the_generated_one(llms: Kube, operator) -> None:
    """spec.engine.apiKeySecretRef, accepted by the real API server, becomes a secretKeyRef
    on the engines (PAGEDKUBE_API_KEY) and the gateway (PAGEDKUBE_ENGINE_API_KEY); the
    generated Secret stays as it was and still gives the hash seed."""
    before = llms.get("secret", GENERATED, NS)["data"]
    llms.run("create", "secret", "generic", "tiny-engine-key", "-n", NS, "--from-literal=api-key=e2e-key")
    llms.run("patch", "llms", NAME, "-n", NS, "--type=merge",
             "-p", '{"spec":{"engine":{"apiKeySecretRef":{"name":"tiny-engine-key"}}}}')
    ref = secret_ref("tiny-engine-key", "api-key")
    wait_for(lambda: {"name": "PAGEDKUBE_API_KEY", "valueFrom": ref} in env_of(llms, f"{NAME}-engine"),
             "the engine Deployment reads the key from the Secret")
    wait_for(lambda: {"name": "PAGEDKUBE_ENGINE_API_KEY", "valueFrom": ref} in env_of(llms, f"{NAME}-gateway"),
             "the gateway Deployment reads the key from the Secret")
    assert {"name": "PAGEDKUBE_HASH_SEED", "valueFrom": secret_ref(GENERATED, "hash-seed")} in \
        env_of(llms, f"{NAME}-engine")
    assert llms.get("secret", GENERATED, NS)["data"] == before   # never rotated by reconcile
    assert "e2e-key" not in json.dumps(llms.get("deployment", f"{NAME}-engine", NS))
    wait_for(lambda: ready_with(llms, 1, operator), "Ready again after the rollout")


def test_deleting_the_llmservice_collects_every_child(llms: Kube) -> None:
    llms.run("delete", "llms", NAME, "-n", NS)
    for kind, name in CHILDREN:
        wait_for(lambda: llms.get(kind, name, NS) is None, f"{kind}/{name} garbage-collected")
    wait_for(lambda: not llms.json("get", "pods", "-n", NS)["items"], "engine and gateway pods gone")
    assert yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"] == NAME
