"""status.adapters, written by the gateway (gateway/adapter_status.py), against kmock's Kubernetes
emulator (a real HTTP API, in memory): one entry per adapter of the spec, ready when every ready
engine serves it, a PATCH of the status subresource only when the list changes, and the key
removed when the spec lists no adapter any more."""
from __future__ import annotations

import asyncio

import httpx
import kmock as kmocklib
import kubernetes
import pytest

from pagedkube.gateway.adapter_status import AdapterStatusReporter, adapter_status
from pagedkube.gateway.autoscaler.kube import KubeApi
from pagedkube.gateway.endpoints import NOT_READY, READY, EndpointSet
from pagedkube.gateway.engine_watch import EngineWatcher
from pagedkube.gateway.prompt import CurrentHasher
from pagedkube.gateway.routing.prefix_index import PrefixIndex

pytestmark = [pytest.mark.timeout(60)]

NS, NAME = "team-a", "chat"
OBJ = ("pagedkube.io/v1alpha1/llmservices", NS, NAME)
PATH = f"/apis/pagedkube.io/v1alpha1/namespaces/{NS}/llmservices/{NAME}"
URLS = [f"http://10.0.0.{i}:8000" for i in (1, 2, 3)]
BASE = {"id": "smollm2", "object": "model", "owned_by": "pagedkube"}


def card(name: str) -> dict:
    return {"id": name, "object": "model", "owned_by": "pagedkube", "parent": "smollm2", "root": f"/a/{name}"}


@pytest.fixture
def cluster(kmock):
    kmock.resources["pagedkube.io/v1alpha1/llmservices"] = kmocklib.ResourceInfo(
        kind="LLMService", namespaced=True, subresources={"status", "scale"}, verbs={"get", "list", "patch"})
    kmock.objects[OBJ] = {
        "apiVersion": "pagedkube.io/v1alpha1", "kind": "LLMService", "metadata": {"name": NAME, "namespace": NS},
        "spec": {"replicas": 3, "adapters": [{"name": "vet-triage", "source": "hf://org/vet"},
                                             {"name": "puppy-care", "source": "pvc://claim/puppy"}]},
        "status": {"readyReplicas": 3}}
    return kmock


def patches(cluster) -> list[object]:
    return [r.data for r in list(cluster) if str(r.method).upper().endswith("PATCH")]


@pytest.mark.asyncio
async def test_the_status_follows_what_the_ready_engines_serve(cluster):
    endpoints = EndpointSet()
    endpoints.update({URLS[0]: READY, URLS[1]: READY, URLS[2]: NOT_READY})
    async with httpx.AsyncClient() as client:
        watcher = EngineWatcher(endpoints, PrefixIndex(), client, CurrentHasher(4), probe_ready=False)
        # what each engine's /v1/models listed (the watcher's scrape fills this)
        watcher.models = {URLS[0]: [BASE, card("vet-triage"), card("puppy-care")],
                          URLS[1]: [BASE, card("vet-triage")],
                          URLS[2]: [BASE]}             # not ready: not counted
        api = KubeApi(kubernetes.client.ApiClient(kubernetes.client.Configuration(host=str(cluster.url).rstrip("/"))))
        reporter = AdapterStatusReporter(api, NS, NAME, watcher.served_adapters)

        assert await reporter.report_once()
        status = cluster.objects[OBJ]["status"]
        assert status["readyReplicas"] == 3   # the operator's keys stay
        assert status["adapters"] == [
            {"name": "vet-triage", "ready": True, "engines": 2, "message": "served by 2 of 2 ready engines"},
            {"name": "puppy-care", "ready": False, "engines": 1, "message": "served by 1 of 2 ready engines"}]
        assert patches(cluster) == [{"status": {"adapters": status["adapters"]}}]

        assert not await reporter.report_once()   # nothing changed: no write
        assert len(patches(cluster)) == 1

        watcher.models[URLS[1]].append(card("puppy-care"))   # the second engine loaded it
        assert await reporter.report_once()
        assert [a["ready"] for a in cluster.objects[OBJ]["status"]["adapters"]] == [True, True]

        await asyncio.to_thread(api.ok, "PATCH", PATH, body={"spec": {"adapters": []}},   # the user removes them
                                content_type="application/merge-patch+json")
        assert await reporter.report_once()
        assert patches(cluster)[-1] == {"status": {"adapters": None}}   # (the one before is the user's)
        assert "adapters" not in cluster.objects[OBJ]["status"]
        assert not await reporter.report_once()


def test_entries_without_ready_engines_or_without_the_adapter():
    assert adapter_status(["a"], {}) == [{"name": "a", "ready": False, "engines": 0, "message": "no ready engine"}]
    (entry,) = adapter_status(["a"], {"u1": {"b"}, "u2": set()})
    assert (entry["ready"], entry["engines"]) == (False, 0)
    assert entry["message"].startswith("served by none of 2 ready engines")
    assert [e["name"] for e in adapter_status(["z", "a", "m"], {"u": {"a", "m", "z"}})] == ["z", "a", "m"]
