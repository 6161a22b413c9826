"""The Kubernetes scale target against kmock's Kubernetes emulator (a real HTTP API,
in memory): the scale subresource PATCH (and no pod write: a scale-in drains its
engines first, and the ReplicaSet removes the not-ready pods), and the Lease that
lets one gateway replica act."""
from __future__ import annotations

import asyncio
import datetime

import aiohttp.web
import attrs
import kmock as kmocklib
import kubernetes
import pytest
import pytest_asyncio

from pagedkube.gateway.autoscaler.autoscaler import Autoscaler
from pagedkube.gateway.autoscaler.kube import KubeApi, KubeScaleTarget
from pagedkube.gateway.autoscaler.lease import LeaseElector
from pagedkube.gateway.autoscaler.metrics import AutoscalerMetrics
from pagedkube.gateway.autoscaler.policy import AutoscalerConfig
from pagedkube.gateway.endpoints import NOT_READY, READY, TERMINATING, EndpointSet
from pagedkube.gateway.hold import HoldQueue
from kmock._internal import enums
from prometheus_client import CollectorRegistry



@attrs.define(kw_only=True)
class Emulator(kmocklib.KubernetesEmulator):
    """kmock merges PATCHes but has no PUT; the Lease is written with PUT (`update`,
    the verb the gateway's Role grants), which replaces the object as the API server does."""

    async def _handle(self, request):
        if request.resource is not None and request.method == enums.method.PUT and request.name:
            self.objects[request.resource, request.namespace, request.name] = request.data
            return aiohttp.web.json_response(request.data)
        return await super()._handle(request)


pytestmark = [pytest.mark.asyncio, pytest.mark.kmock(cls=Emulator), pytest.mark.timeout(60)]

NS, NAME = "team-a", "chat"
SCALE_PATH = f"/apis/pagedkube.io/v1alpha1/namespaces/{NS}/llmservices/{NAME}/scale"
URLS = [f"http://10.0.0.{i}:8000" for i in (1, 2, 3)]
PODS = ["chat-engine-aaaaa", "chat-engine-bbbbb", "chat-engine-ccccc"]
VERBS = {"get", "list", "watch", "create", "update", "patch"}
RESOURCES = {
    "pagedkube.io/v1alpha1/llmservices": dict(kind="LLMService", namespaced=True, subresources={"status", "scale"}),
    "v1/pods": dict(kind="Pod", namespaced=True),
    "discovery.k8s.io/v1/endpointslices": dict(kind="EndpointSlice", namespaced=True),
    "coordination.k8s.io/v1/leases": dict(kind="Lease", namespaced=True),
}
T0 = datetime.datetime(2026, 11, 29, 10, 0, 0, tzinfo=datetime.UTC)


@pytest_asyncio.fixture
async def cluster(kmock):
    for path, info in RESOURCES.items():
        kmock.resources[path] = kmocklib.ResourceInfo(verbs=VERBS, **info)
    kmock.objects["pagedkube.io/v1alpha1/llmservices", NS, NAME] = {
        "apiVersion": "pagedkube.io/v1alpha1", "kind": "LLMService",
        "metadata": {"name": NAME, "namespace": NS}, "spec": {"replicas": 3}}
    for pod in PODS:
        kmock.objects["v1/pods", NS, pod] = {"apiVersion": "v1", "kind": "Pod",
                                             "metadata": {"name": pod, "namespace": NS}}
    kmock.objects["discovery.k8s.io/v1/endpointslices", NS, "chat-engine-x1"] = {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "chat-engine-x1", "namespace": NS,
                     "labels": {"kubernetes.io/service-name": "chat-engine"}},
        "ports": [{"name": "http", "port": 8000}],
        "endpoints": [{"addresses": [f"10.0.0.{i + 1}"], "conditions": {"ready": True},
                       "targetRef": {"kind": "Pod", "name": pod, "namespace": NS}} for i, pod in enumerate(PODS)]}
    return kmock


def api_for(cluster) -> KubeApi:
    return KubeApi(kubernetes.client.ApiClient(kubernetes.client.Configuration(host=str(cluster.url).rstrip("/"))))


def writes(cluster) -> list[tuple[str, str, str, object]]:
    """(method, path, content type, body) of every write the gateway made."""
    return [(str(r.method).upper().split(".")[-1], r.url.path, r.headers.get("Content-Type", "").split(";")[0], r.data)
            for r in list(cluster) if str(r.method).upper().split(".")[-1] in ("PATCH", "PUT", "POST")]


def scaler(cluster, endpoints: EndpointSet, identity: str = "gw-0", **config) -> Autoscaler:
    api = api_for(cluster)
    lease = LeaseElector(api, NS, f"{NAME}-autoscaler", identity, 15, now=lambda: T0)
    target = KubeScaleTarget(api, NS, NAME, "chat-engine", lease)
    cfg = AutoscalerConfig(min_replicas=1, max_replicas=4, target_queue_depth=4, scale_down_window=0,
                           llmservice=NAME, **config)
    return Autoscaler(cfg, endpoints, HoldQueue(endpoints, 0, 0), target, AutoscalerMetrics(CollectorRegistry()),
                      clock=lambda: 100.0)


async def test_scale_in_drains_the_least_busy_engines_and_patches_only_the_scale_subresource(cluster):
    endpoints = EndpointSet()
    endpoints.update(dict.fromkeys(URLS, READY))
    for url, running in zip(URLS, (3, 0, 1)):   # 4 in flight: one engine runs them all
        endpoints.set_scraped(url, running=running, waiting=0, own=0)
    auto = scaler(cluster, endpoints)
    merge = "application/merge-patch+json"
    decision = await auto.tick()                # down at once (window 0): drain 10.0.0.2 (idle) and 10.0.0.3
    assert (decision.current, decision.serving, decision.desired) == (3, 3, 1)
    assert endpoints.routable() == [URLS[0]] and endpoints.draining() == URLS[1:]
    # 10.0.0.2 is idle, but its pod is still ready: scaled in now, the ReplicaSet could delete a
    # ready engine instead of it. So the scale waits for its failing /ready to reach the slice.
    assert [w for w in writes(cluster) if w[1] == SCALE_PATH] == []
    endpoints.update({**dict.fromkeys(URLS, READY), URLS[1]: NOT_READY})
    await auto.tick()
    assert [w for w in writes(cluster) if w[1] == SCALE_PATH] == [("PATCH", SCALE_PATH, merge, {"spec": {"replicas": 2}})]
    assert list(auto.drains) == [URLS[2]]       # 10.0.0.3 still runs a request: it stays
    endpoints.set_scraped(URLS[2], running=0, waiting=0, own=0)   # its request finished
    endpoints.update({URLS[0]: READY, URLS[1]: TERMINATING, URLS[2]: NOT_READY})
    await auto.tick()
    assert [w[3] for w in writes(cluster) if w[1] == SCALE_PATH] == [{"spec": {"replicas": 2}}, {"spec": {"replicas": 1}}]
    assert not [w for w in writes(cluster) if "/pods/" in w[1]]   # no pods: patch anywhere
    assert cluster.objects["pagedkube.io/v1alpha1/llmservices", NS, NAME]["spec"]["replicas"] == 1
    assert auto.metrics.scale_events.labels("down")._value.get() == 2 and auto.drains == {}


async def test_a_victim_that_outlives_its_scale_in_serves_again(cluster):
    """The ReplicaSet deleted another pod (the victim's grace ran out while it still looked
    ready, or someone deleted a pod by hand): the drained engine must not stay out of service."""
    endpoints = EndpointSet()
    endpoints.update(dict.fromkeys(URLS[:2], READY))
    clock = [100.0]
    undrained: list[str] = []

    class Drainer:
        async def drain(self, url):
            return 0

        async def undrain(self, url):
            undrained.append(url)
    api = api_for(cluster)
    target = KubeScaleTarget(api, NS, NAME, "chat-engine", LeaseElector(api, NS, f"{NAME}-autoscaler", "gw-0", 15,
                                                                       now=lambda: T0))
    cfg = AutoscalerConfig(min_replicas=1, max_replicas=4, target_queue_depth=4, scale_down_window=0,
                           llmservice=NAME, scale_in_grace=0)
    cluster.objects["pagedkube.io/v1alpha1/llmservices", NS, NAME] = {
        "apiVersion": "pagedkube.io/v1alpha1", "kind": "LLMService",
        "metadata": {"name": NAME, "namespace": NS}, "spec": {"replicas": 2}}
    auto = Autoscaler(cfg, endpoints, HoldQueue(endpoints, 0, 0), target, AutoscalerMetrics(CollectorRegistry()),
                      clock=lambda: clock[0], drainer=Drainer())
    await auto.tick()                  # idle fleet: one engine drained; no grace: it goes at once
    (victim,) = endpoints.draining()
    (other,) = set(URLS[:2]) - {victim}
    assert cluster.objects["pagedkube.io/v1alpha1/llmservices", NS, NAME]["spec"]["replicas"] == 1
    endpoints.update({victim: READY})  # the ReplicaSet deleted the other pod
    assert endpoints.routable() == []
    clock[0] += 30
    await auto.tick()
    assert endpoints.routable() == [] and undrained == []   # not yet: deletions take seconds
    clock[0] += 31
    await auto.tick()
    assert endpoints.routable() == [victim] and undrained == [victim]
    assert other not in endpoints.urls()


async def test_scale_up_patches_replicas_without_touching_pods(cluster):
    endpoints = EndpointSet()
    endpoints.update({URLS[0]: READY})
    endpoints.set_scraped(URLS[0], running=2, waiting=14, own=0)  # 16 in flight, 2 run at once
    cluster.objects["pagedkube.io/v1alpha1/llmservices", NS, NAME] = {
        "apiVersion": "pagedkube.io/v1alpha1", "kind": "LLMService",
        "metadata": {"name": NAME, "namespace": NS}, "spec": {"replicas": 1}}
    decision = await scaler(cluster, endpoints, engine_capacity=2).tick()
    assert (decision.queue_depth, decision.current, decision.desired) == (14, 1, 3)   # ceil(16 / (2 + 4))
    assert [w for w in writes(cluster) if "/pods/" in w[1]] == []
    assert ("PATCH", SCALE_PATH, "application/merge-patch+json", {"spec": {"replicas": 3}}) in writes(cluster)


async def test_only_the_lease_holder_acts_and_an_expired_lease_is_taken_over(cluster):
    api = api_for(cluster)
    first = LeaseElector(api, NS, "chat-autoscaler", "gw-0", 15, now=lambda: T0)
    second = LeaseElector(api, NS, "chat-autoscaler", "gw-1", 15, now=lambda: T0 + datetime.timedelta(seconds=5))
    assert await asyncio.to_thread(first.try_acquire_or_renew) is True
    lease = cluster.objects["coordination.k8s.io/v1/leases", NS, "chat-autoscaler"]
    assert lease["spec"]["holderIdentity"] == "gw-0" and lease["spec"]["leaseDurationSeconds"] == 15
    assert lease["spec"]["renewTime"] == "2026-11-29T10:00:00.000000Z"
    assert await asyncio.to_thread(second.try_acquire_or_renew) is False            # held and fresh
    assert await asyncio.to_thread(first.try_acquire_or_renew) is True              # renewing keeps it
    later = LeaseElector(api, NS, "chat-autoscaler", "gw-1", 15, now=lambda: T0 + datetime.timedelta(seconds=16))
    assert await asyncio.to_thread(later.try_acquire_or_renew) is True              # expired: taken over
    lease = cluster.objects["coordination.k8s.io/v1/leases", NS, "chat-autoscaler"]
    assert lease["spec"]["holderIdentity"] == "gw-1" and lease["spec"]["leaseTransitions"] == 1
    # a follower keeps its gauges but never writes the scale subresource
    endpoints = EndpointSet()
    endpoints.update(dict.fromkeys(URLS, READY))
    follower = scaler(cluster, endpoints, identity="gw-0")
    assert await follower.tick() is None
    assert follower.metrics.leader._value.get() == 0
    assert not [w for w in writes(cluster) if w[1] == SCALE_PATH]
    await asyncio.to_thread(later.release)
    assert cluster.objects["coordination.k8s.io/v1/leases", NS, "chat-autoscaler"]["spec"]["holderIdentity"] is None
