"""Secure by default (docs/design.md "Operator"), the pure builders: the generated engine Secret, the
NetworkPolicy, the key and hash-seed env on both Deployments, routing headers off; every
object strictly valid against Kubernetes 1.37."""
from __future__ import annotations

import base64

import kubernetes_validate
import pytest

from pagedkube.operator import naming
from pagedkube.operator.builders import build_children
from pagedkube.operator.builders.security import (
    SECRET_VERSION_ANNOTATION, build_engine_network_policy, build_engine_secret, secret_version)
from pagedkube.operator.spec import LLMServiceSpec

K8S_VERSION = "1.37"
UID = "0b9e3a4c-1111-2222-3333-444455556666"
GENERATED = "demo-engine-secret"


def svc(**spec) -> LLMServiceSpec:
    return LLMServiceSpec.from_body({"metadata": {"name": "demo", "namespace": "team-a", "uid": UID},
                                     "spec": {"model": {"source": "builtin://tiny"}, **spec}})


def objects(s: LLMServiceSpec, secret_ver: str = "") -> dict[str, dict]:
    return {f"{c['kind']}/{c['metadata']['name']}": c
            for c in build_children(s, with_service_monitor=False, secret_version=secret_ver)}


def container(objs: dict[str, dict], deployment: str) -> dict:
    (c,) = objs[f"Deployment/{deployment}"]["spec"]["template"]["spec"]["containers"]
    return c


def ref(secret: str, key: str) -> dict:
    return {"secretKeyRef": {"name": secret, "key": key}}


def test_the_engine_secret_holds_the_key_and_the_seed_and_is_owned() -> None:
    secret = build_engine_secret(svc(), api_key="k" * 43, hash_seed="s" * 43)
    assert kubernetes_validate.validate(secret, K8S_VERSION, strict=True) == K8S_VERSION
    assert secret["metadata"]["name"] == GENERATED
    assert secret["metadata"]["ownerReferences"][0]["uid"] == UID
    assert secret["type"] == "Opaque"
    assert {k: base64.b64decode(v).decode() for k, v in secret["data"].items()} == {
        "api-key": "k" * 43, "hash-seed": "s" * 43}
    with pytest.raises(ValueError, match="non-empty"):
        build_engine_secret(svc(), api_key="", hash_seed="s")


def test_by_default_both_deployments_read_the_generated_secret() -> None:
    objs = objects(svc())
    engine, gateway = container(objs, "demo-engine"), container(objs, "demo-gateway")
    assert [e for e in engine["env"] if "valueFrom" in e] == [
        {"name": "PAGEDKUBE_API_KEY", "valueFrom": ref(GENERATED, "api-key")},
        {"name": "PAGEDKUBE_HASH_SEED", "valueFrom": ref(GENERATED, "hash-seed")}]
    assert {"name": "PAGEDKUBE_ENGINE_API_KEY", "valueFrom": ref(GENERATED, "api-key")} in gateway["env"]
    assert "PAGEDKUBE_HASH_SEED" not in {e["name"] for e in gateway["env"]}   # it reads /v1/cache/config
    assert "--route-headers" not in gateway["args"]


def test_your_own_key_replaces_only_the_key_not_the_seed() -> None:
    objs = objects(svc(engine={"apiKeySecretRef": {"name": "mine"}}))
    engine, gateway = container(objs, "demo-engine"), container(objs, "demo-gateway")
    assert [e for e in engine["env"] if "valueFrom" in e] == [
        {"name": "PAGEDKUBE_API_KEY", "valueFrom": ref("mine", "api-key")},
        {"name": "PAGEDKUBE_HASH_SEED", "valueFrom": ref(GENERATED, "hash-seed")}]
    assert {"name": "PAGEDKUBE_ENGINE_API_KEY", "valueFrom": ref("mine", "api-key")} in gateway["env"]


def test_keys_switched_off_leave_only_the_seed() -> None:
    objs = objects(svc(engine={"requireApiKey": False}))
    engine, gateway = container(objs, "demo-engine"), container(objs, "demo-gateway")
    assert [e["name"] for e in engine["env"] if "valueFrom" in e] == ["PAGEDKUBE_HASH_SEED"]
    assert "PAGEDKUBE_ENGINE_API_KEY" not in {e["name"] for e in gateway["env"]}
    with pytest.raises(ValueError, match="requireApiKey false contradicts"):
        svc(engine={"requireApiKey": False, "apiKeySecretRef": {"name": "mine"}})


def test_route_headers_is_an_opt_in_gateway_flag() -> None:
    gateway = container(objects(svc(gateway={"routeHeaders": True})), "demo-gateway")
    assert gateway["args"][-1] == "--route-headers"
    with pytest.raises(ValueError, match="routeHeaders must be true or false"):
        svc(gateway={"routeHeaders": "yes"})


def test_a_new_secret_rolls_engines_and_gateways_together() -> None:
    secret = build_engine_secret(svc(), api_key="a", hash_seed="b")
    version = secret_version(secret)
    assert len(version) == 16 and version == secret_version(dict(secret))
    assert version != secret_version(build_engine_secret(svc(), api_key="a", hash_seed="c"))
    objs = objects(svc(), version)
    for name in ("demo-engine", "demo-gateway"):
        template = objs[f"Deployment/{name}"]["spec"]["template"]
        assert template["metadata"]["annotations"] == {SECRET_VERSION_ANNOTATION: version}
        assert kubernetes_validate.validate(objs[f"Deployment/{name}"], K8S_VERSION, strict=True)
    assert "annotations" not in objects(svc())["Deployment/demo-engine"]["spec"]["template"]["metadata"]


def test_network_policy_admits_only_this_gateway_and_prometheus_to_the_engine_port() -> None:
    policy = build_engine_network_policy(svc())
    assert kubernetes_validate.validate(policy, K8S_VERSION, strict=True) == K8S_VERSION
    assert policy["metadata"]["name"] == "demo-engine"
    assert policy["spec"] == {
        "podSelector": {"matchLabels": naming.selector_labels("demo", "engine")},
        "policyTypes": ["Ingress"],
        "ingress": [
            {"from": [{"podSelector": {"matchLabels": {
                "app.kubernetes.io/name": "pagedkube", "app.kubernetes.io/instance": "demo",
                "app.kubernetes.io/component": "gateway"}}}],
             "ports": [{"protocol": "TCP", "port": 8000}]},
            {"from": [{"namespaceSelector": {},
                       "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}],
             "ports": [{"protocol": "TCP", "port": 8000}]},
        ]}
    # The gateway's pods carry the admitted labels; the engines' own selector is the Deployment's.
    objs = objects(svc())
    gateway_pod = objs["Deployment/demo-gateway"]["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"].items() <= gateway_pod.items()
    assert policy["spec"]["podSelector"]["matchLabels"] == \
        objs["Deployment/demo-engine"]["spec"]["selector"]["matchLabels"]


def test_network_policy_takes_your_scraper_or_none_or_is_switched_off() -> None:
    scraper = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
               "podSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["vmagent"]}]}}
    policy = build_engine_network_policy(svc(networkPolicy={"metricsFrom": [scraper, {"ipBlock": {
        "cidr": "10.0.0.0/8"}}]}))
    assert kubernetes_validate.validate(policy, K8S_VERSION, strict=True) == K8S_VERSION
    assert policy["spec"]["ingress"][1]["from"] == [scraper, {"ipBlock": {"cidr": "10.0.0.0/8"}}]
    assert len(build_engine_network_policy(svc(networkPolicy={"metricsFrom": []}))["spec"]["ingress"]) == 1
    assert "NetworkPolicy/demo-engine" not in objects(svc(networkPolicy={"enabled": False}))
    with pytest.raises(ValueError, match="metricsFrom must be a list of NetworkPolicy peers"):
        svc(networkPolicy={"metricsFrom": [{"pods": "prometheus"}]})


def test_the_gateway_is_closed_by_default_with_a_generated_key() -> None:
    from pagedkube.operator.builders.security import KEYS_VERSION_ANNOTATION, build_gateway_keys_secret
    s = svc()
    secret = build_gateway_keys_secret(s, api_key="sk-generated")
    assert secret["metadata"]["name"] == "demo-api-key"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == UID
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert data == {"api-key": "sk-generated",
                    "api-keys.yaml": '{"keys": [{"key": "sk-generated", "name": "default"}]}'}
    assert kubernetes_validate.validate(secret, K8S_VERSION, strict=True) == K8S_VERSION
    objs = {f"{c['kind']}/{c['metadata']['name']}": c
            for c in build_children(s, with_service_monitor=False, keys_version="abc")}
    c = container(objs, "demo-gateway")
    assert c["args"][c["args"].index("--api-keys") + 1] == "/etc/pagedkube/api-keys/api-keys.yaml"
    pod = objs["Deployment/demo-gateway"]["spec"]["template"]
    assert {"name": "api-keys", "secret": {"secretName": "demo-api-key", "items": [
        {"key": "api-keys.yaml", "path": "api-keys.yaml"}]}} in pod["spec"]["volumes"]
    assert pod["metadata"]["annotations"][KEYS_VERSION_ANNOTATION] == "abc"


def test_your_own_gateway_keys_or_an_explicit_opt_out() -> None:
    own = container(objects(svc(gateway={"apiKeySecretRef": {"name": "tenants"}})), "demo-gateway")
    assert "--api-keys" in own["args"]
    mine = objects(svc(gateway={"apiKeySecretRef": {"name": "tenants"}}))["Deployment/demo-gateway"]
    assert mine["spec"]["template"]["spec"]["volumes"][-1]["secret"]["secretName"] == "tenants"
    open_ = objects(svc(gateway={"requireApiKey": False}))["Deployment/demo-gateway"]["spec"]["template"]["spec"]
    assert "--api-keys" not in open_["containers"][0]["args"]
    assert [v["name"] for v in open_["volumes"]] == ["tmp"]


def test_the_gateway_image_is_the_operators_unless_the_cluster_allows_a_choice() -> None:
    s = svc(gateway={"image": "registry.example.com/my-gateway:evil"})
    pinned = {f"{c['kind']}/{c['metadata']['name']}": c for c in build_children(s, with_service_monitor=False)}
    assert container(pinned, "demo-gateway")["image"] == naming.GATEWAY_IMAGE
    allowed = {f"{c['kind']}/{c['metadata']['name']}": c
               for c in build_children(s, with_service_monitor=False, allow_gateway_image=True)}
    assert container(allowed, "demo-gateway")["image"] == "registry.example.com/my-gateway:evil"
