"""The Kubernetes scale target: the LLMService scale subresource.

Calls (the gateway's Role allows exactly these, docs/interfaces.md "Gateway RBAC"):

    GET   /apis/pagedkube.io/v1alpha1/namespaces/NS/llmservices/NAME/scale      spec.replicas
    PATCH /apis/pagedkube.io/v1alpha1/namespaces/NS/llmservices/NAME/scale      merge {"spec":{"replicas":N}}

Which pod a scale-in removes needs no call of its own: the autoscaler drains the engines it
chose first (their /ready fails, so the pods turn not ready) and scales in only once they
are idle, and a ReplicaSet deletes not-ready pods before ready ones. (Before, the gateway
patched `controller.kubernetes.io/pod-deletion-cost` on the pods, which needed `pods: patch`
on every pod of the namespace.) The operator then copies spec.replicas into the engine
Deployment. Objects stay plain dicts; the official client carries auth and TLS. Its calls
block, so they run in a thread.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Mapping, Sequence

from pagedkube.gateway.autoscaler.lease import LeaseElector
from pagedkube.kube_call import kube_call
from pagedkube.llmservice import scale_path

log = logging.getLogger("pagedkube.autoscaler")

MERGE_PATCH = "application/merge-patch+json"


class KubeApi:
    """Minimal JSON calls over the official client's ApiClient."""

    def __init__(self, api_client: Any):
        self.api_client = api_client

    def call(self, method: str, path: str, *, body: Any = None, content_type: str = "application/json",
             query: list[tuple[str, str]] | None = None) -> tuple[int, Any]:
        response, data = kube_call(self.api_client, method, path, body=body, content_type=content_type, query=query)
        try:
            parsed = json.loads(data) if data else None
        except ValueError:
            parsed = data.decode(errors="replace")
        return response.status, parsed

    def ok(self, method: str, path: str, **kwargs: Any) -> Any:
        status, data = self.call(method, path, **kwargs)
        if status >= 400:
            raise RuntimeError(f"{method} {path}: HTTP {status}: {data}")
        return data


def default_api() -> KubeApi:
    try:
        import kubernetes
    except ImportError as e:  # pragma: no cover - the gateway extra installs it
        raise SystemExit("--autoscale with --kube-service needs the kubernetes package: "
                         "pip install 'pagedkube[gateway]'") from e
    from pagedkube.kube_call import load_kube_credentials
    load_kube_credentials(kubernetes)
    return KubeApi(kubernetes.client.ApiClient())


class KubeScaleTarget:
    removes_not_ready_first = True   # the ReplicaSet picks the pods; the victims' failing /ready steers it
    def __init__(self, api: KubeApi, namespace: str, llmservice: str, engine_service: str,
                 lease: LeaseElector | None):
        self.api = api
        self.namespace = namespace
        self.llmservice = llmservice
        self.engine_service = engine_service
        self.lease = lease
        self.scale_path = scale_path(namespace, llmservice)

    async def is_leader(self) -> bool:
        if self.lease is None:
            return True
        return await asyncio.to_thread(self.lease.try_acquire_or_renew)

    async def get_replicas(self) -> int:
        scale = await asyncio.to_thread(self.api.ok, "GET", self.scale_path)
        return int((scale.get("spec") or {}).get("replicas") or 0)

    async def scale(self, replicas: int, victims: Sequence[str], worth: Mapping[str, float]) -> None:
        """`victims` are drained (not ready) by now, so the ReplicaSet removes them first."""
        await asyncio.to_thread(self.api.ok, "PATCH", self.scale_path,
                                body={"spec": {"replicas": int(replicas)}}, content_type=MERGE_PATCH)

    async def close(self) -> None:
        if self.lease is not None:
            await asyncio.to_thread(self.lease.release)
