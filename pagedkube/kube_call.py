"""One raw call to the Kubernetes API through a `kubernetes.client.ApiClient`.

The gateway's autoscaler and the operator both speak to paths the typed client
does not cover well (scale subresources, server-side apply, custom resources);
they share this request step and decide for themselves what a status means.
Torch-free, and it never imports `kubernetes`: it only uses the client it is given.
"""
from __future__ import annotations

from typing import Any


def kube_call(api_client: Any, method: str, path: str, *, body: Any = None,
              content_type: str = "application/json",
              query: list[tuple[str, str]] | None = None) -> tuple[Any, bytes]:
    """Sends the request; returns (the raw response, its body bytes)."""
    _, url, headers, body, _ = api_client.param_serialize(
        method, path, query_params=query or [], body=body, auth_settings=["BearerToken"],
        header_params={"Accept": "application/json", "Content-Type": content_type})
    response = api_client.call_api(method, url, header_params=headers, body=body)
    return response, response.read()


def load_kube_credentials(kubernetes: Any) -> None:
    """In-cluster credentials, else ~/.kube/config (as kopf's own login does). Takes the
    imported `kubernetes` module, so that this module still never imports it."""
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
