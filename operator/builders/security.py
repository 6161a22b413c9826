"""Secure by default (docs/design.md "Operator"): the generated Secrets and the engines' NetworkPolicy (pure).

The Secret `<name>-engine-secret` holds two random values made once, when the
operator first finds it missing, and never rotated by reconciling:

    api-key    the bearer token engines require (PAGEDKUBE_API_KEY) and the
               gateway sends (PAGEDKUBE_ENGINE_API_KEY); unused while
               spec.engine.apiKeySecretRef names the user's own Secret
    hash-seed  the seed of the engines' chained block hashes (PAGEDKUBE_HASH_SEED),
               so cache-probing by guessed prompts needs the seed too

Both are always generated, so switching between the generated and a named key
never needs the operator to change an existing Secret (it holds get/create only).
The values come in as arguments: the reconciler draws them (reconcile.py).

The Secret `<name>-api-key` (unless spec.gateway.apiKeySecretRef names the user's
own, or spec.gateway.requireApiKey is false) holds the one client key the gateway
requires, made once the same way: the gateway is closed to anyone without it.

The NetworkPolicy admits to engine pods only this LLMService's gateway pods and
the metrics scraper (spec.networkPolicy.metricsFrom), on the engine port.
"""
from __future__ import annotations

import base64
import hashlib
import json
from typing import Any, Mapping

from pagedkube.operator import naming
from pagedkube.operator.spec import LLMServiceSpec

API_KEY_KEY = "api-key"        # also the key inside spec.engine.apiKeySecretRef's Secret (docs/operator.md)
HASH_SEED_KEY = "hash-seed"
API_KEYS_FILE_KEY = "api-keys.yaml"   # the gateway's keys file inside its Secret (docs/interfaces.md)
GENERATED_KEY_NAME = "default"      # the generated client key's name in metrics and logs
SECRET_VERSION_ANNOTATION = "pagedkube.io/engine-secret-hash"   # on pod templates: a new Secret rolls the pods
KEYS_VERSION_ANNOTATION = "pagedkube.io/api-key-hash"          # the gateway's: a new generated key rolls it


def api_key_secret(svc: LLMServiceSpec) -> str:
    """The Secret engines take their API key from; "" when the user switched keys off."""
    if not svc.engine.require_api_key:
        return ""
    return svc.engine.api_key_secret or naming.engine_secret_name(svc.name)


def gateway_keys_secret(svc: LLMServiceSpec) -> str:
    """The Secret (key api-keys.yaml) the gateway takes its client keys from; "" when the user
    opted out (spec.gateway.requireApiKey false): closed by default."""
    if not svc.gateway.require_api_key:
        return ""
    return svc.gateway.api_key_secret or naming.gateway_keys_secret_name(svc.name)


def generates_gateway_key(svc: LLMServiceSpec) -> bool:
    return svc.gateway.require_api_key and not svc.gateway.api_key_secret


def build_gateway_keys_secret(svc: LLMServiceSpec, api_key: str) -> dict[str, Any]:
    """`<name>-api-key`: the one client key (`api-key`, for the user to read) and the gateway's
    keys file made of it (`api-keys.yaml`, JSON being YAML)."""
    if not api_key:
        raise ValueError("the gateway key Secret needs a non-empty key")
    keys = json.dumps({"keys": [{"key": api_key, "name": GENERATED_KEY_NAME}]})
    return _opaque_secret(svc, naming.gateway_keys_secret_name(svc.name), "gateway",
                          {API_KEY_KEY: api_key, API_KEYS_FILE_KEY: keys})


def _opaque_secret(svc: LLMServiceSpec, name: str, component: str, data: dict[str, str]) -> dict[str, Any]:
    """A Secret owned by the LLMService, its values base64-encoded."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": naming.metadata(name, svc.namespace, svc.name, svc.uid, component),
        "type": "Opaque",
        "data": {key: _b64(value) for key, value in data.items()},
    }


def secret_env(name: str, secret: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def engine_api_key_env(svc: LLMServiceSpec, name: str) -> list[dict[str, Any]]:
    """`name` set from the engines' API key Secret, unless keys are switched off."""
    secret = api_key_secret(svc)
    return [secret_env(name, secret, API_KEY_KEY)] if secret else []


def hash_seed_env(svc: LLMServiceSpec) -> list[dict[str, Any]]:
    """PAGEDKUBE_HASH_SEED for our engines. vLLM seeds its block hashes from os.urandom per
    process unless PYTHONHASHSEED is set, which is random enough and needs nothing from us."""
    if svc.engine.runtime == "vllm":
        return []
    return [secret_env("PAGEDKUBE_HASH_SEED", naming.engine_secret_name(svc.name), HASH_SEED_KEY)]


def build_engine_secret(svc: LLMServiceSpec, api_key: str, hash_seed: str) -> dict[str, Any]:
    if not api_key or not hash_seed:
        raise ValueError("the engine Secret needs a non-empty api key and hash seed")
    return _opaque_secret(svc, naming.engine_secret_name(svc.name), "engine",
                          {API_KEY_KEY: api_key, HASH_SEED_KEY: hash_seed})


def secret_version(secret: Mapping[str, Any] | None) -> str:
    """A short digest of a Secret's data ("" for none): the pod-template annotation."""
    if not secret:
        return ""
    data = json.dumps(secret.get("data") or {}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(data.encode()).hexdigest()[:16]


def build_engine_network_policy(svc: LLMServiceSpec) -> dict[str, Any]:
    port = [{"protocol": "TCP", "port": naming.ENGINE_PORT}]
    ingress = [{"from": [{"podSelector": {"matchLabels": naming.selector_labels(svc.name, "gateway")}}],
                "ports": port}]
    if svc.network_policy.metrics_from:
        ingress.append({"from": [dict(p) for p in svc.network_policy.metrics_from], "ports": port})
    selector: dict[str, Any] = {"matchLabels": naming.selector_labels(svc.name, "engine")}
    if svc.engine.nodes_per_replica > 1:
        # A multi-node engine's pods talk among themselves on any port: the leader's store
        # (MASTER_PORT) and gloo/NCCL's own, which each rank picks at start-up.
        labels = naming.selector_labels(svc.name, "engine")
        del labels["app.kubernetes.io/component"]
        selector = {"matchLabels": labels, "matchExpressions": [{
            "key": "app.kubernetes.io/component", "operator": "In", "values": ["engine", naming.ENGINE_WORKER]}]}
        ingress.append({"from": [{"podSelector": selector}]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": naming.metadata(naming.engine_name(svc.name), svc.namespace, svc.name, svc.uid, "engine"),
        "spec": {
            "podSelector": selector,
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()
