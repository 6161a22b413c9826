"""A small Kubernetes client for the operator: get, list, server-side apply, delete.

Objects stay plain dicts end to end (the builders' output is applied as is);
the official client only carries auth, TLS and retries of the connection.
Calls block, so handlers that use it are sync: kopf runs them in threads.
"""
from __future__ import annotations

import datetime
import json
import logging
import socket
from typing import Any, Mapping

import kubernetes

from pagedkube.kube_call import kube_call, load_kube_credentials
from pagedkube.operator import naming

# kind -> plural, for every kind the operator reads or writes.
PLURALS = {
    "Deployment": "deployments", "Service": "services", "ServiceAccount": "serviceaccounts",
    "Role": "roles", "RoleBinding": "rolebindings", "PodDisruptionBudget": "poddisruptionbudgets",
    "ServiceMonitor": "servicemonitors", "Pod": "pods", "CustomResourceDefinition": "customresourcedefinitions",
    "Event": "events", "Secret": "secrets", "ConfigMap": "configmaps", "NetworkPolicy": "networkpolicies", "Lease": "leases",
    "LeaderWorkerSet": "leaderworkersets",
    naming.KIND: naming.PLURAL,
}
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
MERGE_CONTENT_TYPE = "application/merge-patch+json"
logger = logging.getLogger(__name__)


def api_path(api_version: str, kind: str, namespace: str | None, name: str | None = None) -> str:
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if namespace:
        base += f"/namespaces/{namespace}"
    base += f"/{PLURALS[kind]}"
    return f"{base}/{name}" if name else base


def object_path(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return api_path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])


def default_api_client() -> kubernetes.client.ApiClient:
    """In-cluster credentials, else ~/.kube/config (as kopf's own login does)."""
    load_kube_credentials(kubernetes)
    return kubernetes.client.ApiClient()


class Kube:
    def __init__(self, api_client: kubernetes.client.ApiClient, field_manager: str = naming.FIELD_MANAGER):
        self.api_client = api_client
        self.field_manager = field_manager

    def _call(self, method: str, path: str, *, query: list[tuple[str, str]] | None = None,
              body: Any = None, content_type: str = "application/json") -> Any:
        response, data = kube_call(self.api_client, method, path, body=body, content_type=content_type, query=query)
        if response.status >= 400:
            raise kubernetes.client.ApiException(status=response.status, reason=response.reason,
                                                 body=data.decode(errors="replace") if data else None)
        return json.loads(data) if data else None

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            return self._call("GET", api_path(api_version, kind, namespace, name))
        except kubernetes.client.ApiException as e:
            if e.status == 404:
                return None
            raise

    def list(self, api_version: str, kind: str, namespace: str | None,
             label_selector: str = "") -> list[dict[str, Any]]:
        query = [("labelSelector", label_selector)] if label_selector else []
        result = self._call("GET", api_path(api_version, kind, namespace), query=query)
        return list(result.get("items") or [])

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply as our field manager, taking over conflicting fields (force)."""
        query = [("fieldManager", self.field_manager), ("force", "true")]
        return self._call("PATCH", object_path(obj), query=query, body=obj, content_type=APPLY_CONTENT_TYPE)

    def create(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """POST a new object; None when one of that name exists already (409)."""
        meta = obj["metadata"]
        try:
            return self._call("POST", api_path(obj["apiVersion"], obj["kind"], meta.get("namespace")), body=obj,
                              query=[("fieldManager", self.field_manager)])
        except kubernetes.client.ApiException as e:
            if e.status == 409:
                return None
            raise

    def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> bool:
        try:
            self._call("DELETE", api_path(api_version, kind, namespace, name),
                       body={"propagationPolicy": "Background"})
            return True
        except kubernetes.client.ApiException as e:
            if e.status == 404:
                return False
            raise

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        path = api_path(naming.API_VERSION, naming.KIND, namespace, name) + "/status"
        self._call("PATCH", path, body={"status": status}, content_type=MERGE_CONTENT_TYPE)

    def crd_exists(self, name: str) -> bool:
        return self.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", None, name) is not None

    def create_event(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """A core/v1 Event about `body` (an LLMService). Failing to post one never fails a reconcile."""
        meta = body["metadata"]
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": naming.API_VERSION, "kind": naming.KIND, "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta.get("uid", "")},
            "type": type_, "reason": reason, "message": message[:1024],
            "source": {"component": self.field_manager},
            "reportingComponent": self.field_manager, "reportingInstance": socket.gethostname(),
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            self._call("POST", api_path("v1", "Event", meta["namespace"]), body=event)
        except kubernetes.client.ApiException as e:
            logger.warning("could not post event %s %s: %s", reason, message, e.status)
