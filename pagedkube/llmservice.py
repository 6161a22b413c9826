"""Where the LLMService lives in the Kubernetes API: its group, version, kind and plural.

The operator (its CRD, its watches, its children's owner references) and the gateway's
autoscaler (the scale subresource it writes) both name the resource; this torch-free,
dependency-free module is the one place they read it from. The CRD itself is generated from
these (operator/crd.py), and so are the manifests and the chart (`pagedkube operator
manifests`).
"""
from __future__ import annotations

GROUP = "pagedkube.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "LLMService"
PLURAL = "llmservices"
SINGULAR = "llmservice"
SHORT_NAMES = ("llms",)


def collection_path(namespace: str) -> str:
    """The REST path of the LLMServices of one namespace."""
    return f"/apis/{API_VERSION}/namespaces/{namespace}/{PLURAL}"


def scale_path(namespace: str, name: str) -> str:
    """The REST path of one LLMService's scale subresource (what HPA, KEDA and our autoscaler write)."""
    return f"{collection_path(namespace)}/{name}/scale"
