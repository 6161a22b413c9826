"""KubeDiscovery against kmock's Kubernetes emulator (a real HTTP API in memory):
the EndpointSlices of the engine Service become the gateway's endpoint set."""
from __future__ import annotations

import asyncio

import kmock as kmocklib
import kubernetes
import pytest
import pytest_asyncio

from pagedkube.gateway.discovery import KubeDiscovery
from pagedkube.gateway.endpoints import EndpointSet

pytestmark = [pytest.mark.asyncio, pytest.mark.kmock(cls=kmocklib.KubernetesEmulator), pytest.mark.timeout(60)]

NS = "team-a"
SLICES = "discovery.k8s.io/v1/endpointslices"


def endpoint_slice(name: str, service: str, endpoints: list[tuple[str, dict]]) -> dict:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": name, "namespace": NS, "labels": {"kubernetes.io/service-name": service}},
            "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
            "endpoints": [{"addresses": [ip], "conditions": cond,
                           "targetRef": {"kind": "Pod", "name": f"{service}-pod-{ip.rsplit('.', 1)[1]}"}}
                          for ip, cond in endpoints]}


@pytest_asyncio.fixture
async def cluster(kmock):
    kmock.resources[SLICES] = kmocklib.ResourceInfo(kind="EndpointSlice", namespaced=True,
                                                    verbs={"get", "list", "watch"})
    kmock.objects[SLICES, NS, "chat-engine-1"] = endpoint_slice("chat-engine-1", "chat-engine", [
        ("10.0.0.1", {"ready": True}), ("10.0.0.2", {"ready": False}),
        ("10.0.0.3", {"ready": False, "terminating": True})])
    kmock.objects[SLICES, NS, "other-1"] = endpoint_slice("other-1", "other", [("10.9.9.9", {"ready": True})])
    return kmock


async def test_endpointslices_become_the_endpoint_set(cluster):
    api = kubernetes.client.DiscoveryV1Api(kubernetes.client.ApiClient(
        kubernetes.client.Configuration(host=str(cluster.url).rstrip("/"))))
    endpoints = EndpointSet()
    discovery = KubeDiscovery(endpoints, "chat-engine", NS, api_factory=lambda: api, watch_timeout=1)
    discovery.start()
    try:
        for _ in range(200):
            if endpoints.urls():
                break
            await asyncio.sleep(0.05)
        assert endpoints.counts_by_state() == {"ready": 1, "not_ready": 1, "terminating": 1, "ejected": 0}
        assert endpoints.routable() == ["http://10.0.0.1:8000"]
        # Metrics name engines by pod, not by address.
        assert endpoints.label("http://10.0.0.1:8000") == "chat-engine-pod-1"
        assert sorted(endpoints.load_parts()) == ["chat-engine-pod-1", "chat-engine-pod-2", "chat-engine-pod-3"]
        assert endpoints.label("http://10.7.7.7:8000") == "http://10.7.7.7:8000"   # unknown: as given
        # A watch event (a change made through the API): 10.0.0.1 turns not-ready, 10.0.0.2 ready.
        patch = {"endpoints": endpoint_slice("chat-engine-1", "chat-engine", [
            ("10.0.0.1", {"ready": False}), ("10.0.0.2", {"ready": True})])["endpoints"]}
        await asyncio.to_thread(api.patch_namespaced_endpoint_slice, "chat-engine-1", NS, patch)
        for _ in range(200):
            if endpoints.routable() == ["http://10.0.0.2:8000"]:
                break
            await asyncio.sleep(0.05)
        assert endpoints.routable() == ["http://10.0.0.2:8000"]
        assert endpoints.counts_by_state()["not_ready"] == 1
        assert endpoints.label("http://10.0.0.2:8000") == "chat-engine-pod-2"   # names from watch events too
    finally:
        discovery.stop()
        await asyncio.to_thread(discovery._thread.join, 15)  # the open watch ends within watch_timeout + 5 s
        assert not discovery._thread.is_alive()
