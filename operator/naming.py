"""Names, labels, images and owner references of an LLMService's children (pure).

Labels follow the Kubernetes recommended set:

    app.kubernetes.io/name=pagedkube            every child
    app.kubernetes.io/instance=<llmservice>     every child
    app.kubernetes.io/component=engine|gateway  per part (a multi-node engine's
                                                worker pods: engine-worker, so that
                                                what selects engines finds leaders only)
    app.kubernetes.io/managed-by=pagedkube-operator
    pagedkube.io/llmservice=<llmservice>        the owner, for `kubectl get -l`

A Deployment's selector is immutable, so selectors use only name, instance and
component, never a version.
"""
from __future__ import annotations

from typing import Any

from pagedkube import __version__
from pagedkube.defaults import default_of
from pagedkube.engine.config import EngineConfig
from pagedkube.engine.server.config import ServerConfig
from pagedkube.gateway.config import GatewayConfig
# The resource's coordinates, defined once for the operator and the gateway's autoscaler alike.
from pagedkube.llmservice import API_VERSION, GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION  # noqa: F401

FIELD_MANAGER = "pagedkube-operator"
MANAGED_BY = "pagedkube-operator"
OWNER_LABEL = "pagedkube.io/llmservice"
HASH_ANNOTATION = "pagedkube.io/applied-hash"

ENGINE_IMAGE = f"ghcr.io/pagedkube/engine:{__version__}"
GATEWAY_IMAGE = f"ghcr.io/pagedkube/gateway:{__version__}"  # the operator runs from it too
VLLM_IMAGE = "vllm/vllm-openai:v0.11.0"

ENGINE_PORT: int = default_of(ServerConfig, "port")     # `pagedkube serve`'s (and vLLM's) default
GATEWAY_PORT: int = default_of(GatewayConfig, "port")   # `pagedkube gateway`'s default
GATEWAY_SERVICE_PORT = 80
# A multi-node engine (spec.engine.nodesPerReplica > 1) is a LeaderWorkerSet (sigs.k8s.io/lws)
LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = "LeaderWorkerSet"
LWS_CRD = "leaderworkersets.leaderworkerset.x-k8s.io"
ENGINE_WORKER = "engine-worker"     # the component label of a multi-node engine's worker pods
MASTER_PORT: int = default_of(EngineConfig, "master_port")   # the leader's TCPStore, which workers join


def engine_name(name: str) -> str:
    """Engine Deployment, headless Service, PodDisruptionBudget and NetworkPolicy."""
    return f"{name}-engine"


def gateway_name(name: str) -> str:
    """Gateway Deployment, ServiceAccount, Role and RoleBinding."""
    return f"{name}-gateway"


def engine_secret_name(name: str) -> str:
    """The generated Secret: the engines' API key and the cache hash seed (builders/security.py)."""
    return f"{name}-engine-secret"


def gateway_keys_secret_name(name: str) -> str:
    """The generated Secret of the gateway's client API key, for users to read (builders/security.py)."""
    return f"{name}-api-key"


def adapters_config_map_name(name: str) -> str:
    """The ConfigMap listing spec.adapters, which engine pods read (builders/adapters.py)."""
    return f"{name}-adapters"


def gateway_service_name(name: str) -> str:
    """The user-facing Service is the LLMService's own name."""
    return name


def service_url(name: str, namespace: str) -> str:
    return f"http://{gateway_service_name(name)}.{namespace}.svc.cluster.local"


def selector_labels(name: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "pagedkube",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": component,
    }


def labels(name: str, component: str | None = None) -> dict[str, str]:
    out = {
        "app.kubernetes.io/name": "pagedkube",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        "app.kubernetes.io/version": __version__,
        OWNER_LABEL: name,
    }
    if component:
        out["app.kubernetes.io/component"] = component
    return dict(sorted(out.items()))


def selector_string(match_labels: dict[str, str]) -> str:
    """The string form of a label selector, as `status.selector` and HPA expect it."""
    return ",".join(f"{k}={v}" for k, v in sorted(match_labels.items()))


def engine_selector(name: str) -> str:
    return selector_string(selector_labels(name, "engine"))


def owner_reference(name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def metadata(name: str, namespace: str, owner: str, uid: str, component: str | None) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": namespace,
        "labels": labels(owner, component),
        "ownerReferences": [owner_reference(owner, uid)],
    }
