"""The Kubernetes scale target: the LLMService scale subresource.

Calls (the gateway's Role allows exactly these, docs/interfaces.md "Gateway RBAC"):

    GET   /apis/pagedkube.io/v1alpha1/namespaces/NS/llmservices/NAME/scale      spec.replicas
    PATCH /apis/pagedkube.io/v1alpha1/namespaces/NS/llmservices/NAME/scale      merge {"spec":{"replicas":N}}
    LIST  /apis/discovery.k8s.io/v1/namespaces/NS/endpointslices?labelSelector= engine URL -> pod name
    PATCH /api/v1/namespaces/NS/pods/POD   merge {"metadata":{"annotations":{pod-deletion-cost: "C"}}}

Before a scale-in every ready engine pod gets `controller.kubernetes.io/pod-deletion-cost`
= its recent prefix-cache hits (capped to int32), and the chosen victims get -1, so
the ReplicaSet deletes them first (it deletes lower costs first); annotating all
of them overwrites costs left from earlier scale-ins. The operator then copies
spec.replicas into the engine Deployment. Objects stay plain dicts; the official
client carries auth and TLS. Its calls block, so they run in a thread.
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Mapping, Sequence

from pagedkube.gateway.autoscaler.lease import LeaseElector
from pagedkube.gateway.discovery import SERVICE_LABEL, slice_pod_names
from pagedkube.kube_call import kube_call

log = logging.getLogger("pagedkube.autoscaler")

GROUP, VERSION, PLURAL = "pagedkube.io", "v1alpha1", "llmservices"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
MERGE_PATCH = "application/merge-patch+json"
_INT32_MAX = 2**31 - 1


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


def pods_by_url(slices: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Engine URL (as discovery builds it) -> pod name, from EndpointSlice dicts."""
    return {url: pod for s in slices for url, pod in slice_pod_names(s).items()}


def deletion_costs(worth: Mapping[str, float], victims: Sequence[str]) -> dict[str, int]:
    costs = {url: min(_INT32_MAX, max(0, int(hits))) for url, hits in worth.items()}
    for url in victims:
        costs[url] = -1
    return costs


class KubeScaleTarget:
    def __init__(self, api: KubeApi, namespace: str, llmservice: str, engine_service: str,
                 lease: LeaseElector | None):
        self.api = api
        self.namespace = namespace
        self.llmservice = llmservice
        self.engine_service = engine_service
        self.lease = lease
        self.scale_path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{llmservice}/scale"

    async def is_leader(self) -> bool:
        if self.lease is None:
            return True
        return await asyncio.to_thread(self.lease.try_acquire_or_renew)

    async def get_replicas(self) -> int:
        scale = await asyncio.to_thread(self.api.ok, "GET", self.scale_path)
        return int((scale.get("spec") or {}).get("replicas") or 0)

    async def scale(self, replicas: int, victims: Sequence[str], worth: Mapping[str, float]) -> None:
        if victims:
            await asyncio.to_thread(self._mark_victims, victims, worth)
        await asyncio.to_thread(self.api.ok, "PATCH", self.scale_path,
                                body={"spec": {"replicas": int(replicas)}}, content_type=MERGE_PATCH)

    def _mark_victims(self, victims: Sequence[str], worth: Mapping[str, float]) -> None:
        listing = self.api.ok("GET", f"/apis/discovery.k8s.io/v1/namespaces/{self.namespace}/endpointslices",
                              query=[("labelSelector", f"{SERVICE_LABEL}={self.engine_service}")])
        pods = pods_by_url(listing.get("items") or [])
        for url, cost in sorted(deletion_costs(worth, victims).items()):
            pod = pods.get(url)
            if pod is None:
                log.warning("no pod found for engine %s: cannot set its deletion cost", url)
                continue
            body = {"metadata": {"annotations": {DELETION_COST: str(cost)}}}
            try:
                self.api.ok("PATCH", f"/api/v1/namespaces/{self.namespace}/pods/{pod}", body=body,
                            content_type=MERGE_PATCH)
            except RuntimeError as e:   # a pod already gone: the scale-in still goes ahead
                log.warning("pod-deletion-cost on %s: %s", pod, e)

    async def close(self) -> None:
        if self.lease is not None:
            await asyncio.to_thread(self.lease.release)
