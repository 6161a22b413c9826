"""A Hub model with spec.model.cache on the real node: the first engine pod downloads it from
the test's Hub mirror into the named claim, and a scale from 1 to 2 and a deleted pod's
replacement start from that cache without one request to the mirror (its request log).

The claim is bound to a hostPath PersistentVolume on the node (a folder of this machine,
owned by the images' uid 10001, as docs/operator.md asks of a node folder)."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import openai
import pytest

from hfhub import HubRepo, HubServer  # tests/helpers/hfhub.py (pyproject pythonpath)
from kubeutil import ROOT, Kube, Processes, wait_for
from nodeutil import engine_pods, forward_to_gateway, hub_on_node, llmservice, ready_llms

NS = "e2e-model-cache"
NAME = "cached"
REPO = "pagedkube-e2e/tiny-cached"
CLAIM = "models"
IMAGE_UID = 10001   # operator/builders/common.py RUN_AS_USER


@pytest.fixture(scope="module")
def hub(kube: Kube):
    server = hub_on_node(kube, HubRepo.of(REPO, ROOT / "pagedkube" / "builtin" / "tiny"))
    yield server
    server.close()


@pytest.fixture(scope="module")
def cache_dir():
    path = Path(tempfile.mkdtemp(prefix="pagedkube-e2e-models-"))
    os.chown(path, IMAGE_UID, IMAGE_UID)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def served(chart: Kube, hub: HubServer, cache_dir: Path, processes: Processes):
    chart.run("create", "namespace", NS, check=False)
    chart.apply({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{NS}-{CLAIM}"},
                 "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                          "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                          "hostPath": {"path": str(cache_dir), "type": "Directory"},
                          "claimRef": {"namespace": NS, "name": CLAIM}}})
    chart.apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": CLAIM, "namespace": NS},
                 "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": f"{NS}-{CLAIM}",
                          "resources": {"requests": {"storage": "1Gi"}}}})
    chart.apply(llmservice(NAME, NS, {
        "model": {"name": "tiny-cached", "source": REPO, "cache": {"claimName": CLAIM}},
        "replicas": 1,
        "engine": {"env": [{"name": "HF_ENDPOINT", "value": hub.url}]}}))
    pf = forward_to_gateway(chart, processes, NAME, NS, 1)
    yield chart, pf
    pf.close()
    chart.run("delete", "namespace", NS, "--timeout", "180s", check=False)
    chart.run("delete", "pv", f"{NS}-{CLAIM}", check=False)


def fetched(hub: HubServer) -> list[str]:
    return sorted(p.rsplit("/", 1)[1] for m, p in hub.seen() if m == "GET" and "/resolve/" in p)


def init_log(kube: Kube, pod: dict) -> str:
    return kube.run("logs", pod["metadata"]["name"], "-n", NS, "-c", "model-download").stdout


def test_a_scale_up_and_a_deleted_pod_start_from_the_cache_without_a_hub_request(served, hub: HubServer) -> None:
    kube, pf = served
    assert fetched(hub) == ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                            "tokenizer_config.json"]    # once, and never the README
    (first,) = engine_pods(kube, NAME, NS)
    assert "downloaded" in init_log(kube, first)
    hub.clear()

    kube.run("scale", "llms", NAME, "-n", NS, "--replicas", "2")
    ready_llms(kube, NAME, NS, 2)
    kube.run("delete", "pod", first["metadata"]["name"], "-n", NS, "--wait=true", timeout=300)
    wait_for(lambda: first["metadata"]["name"] not in {p["metadata"]["name"] for p in engine_pods(kube, NAME, NS)},
             "the deleted pod gone", timeout=300)
    ready_llms(kube, NAME, NS, 2)

    assert hub.seen() == []
    pods = engine_pods(kube, NAME, NS)
    assert len(pods) == 2 and first["metadata"]["uid"] not in {p["metadata"]["uid"] for p in pods}
    for pod in pods:
        assert "(no Hub request)" in init_log(kube, pod), init_log(kube, pod)
    client = openai.OpenAI(base_url=f"{pf.url}/v1", api_key=pf.api_key, max_retries=2, timeout=120)
    reply = client.chat.completions.create(model="tiny-cached", messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=8, temperature=0)
    assert reply.usage.completion_tokens > 0
