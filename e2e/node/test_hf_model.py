"""An hf://ORG/NAME model: the engine pod's model-download init container fetches
it with huggingface_hub from a Hub-compatible mirror the test runs on the node's
address (spec.engine.env HF_ENDPOINT, which the operator passes to the download
too), and the engine serves the downloaded model through the gateway."""
from __future__ import annotations

import openai
import pytest

from kubeutil import ROOT, Kube, Processes
from nodeutil import engine_pods, forward_to_gateway, hub_on_node, llmservice
from hfhub import HubRepo, HubServer  # tests/helpers/hfhub.py (pyproject pythonpath)

NS = "e2e-hf"
NAME = "hf"
REPO = "pagedkube-e2e/tiny-chat"


@pytest.fixture(scope="module")
def hub(kube: Kube):
    server = hub_on_node(kube, HubRepo.of(REPO, ROOT / "pagedkube" / "builtin" / "tiny"))
    yield server
    server.close()


@pytest.fixture(scope="module")
def served(chart: Kube, hub: HubServer, processes: Processes):
    chart.run("create", "namespace", NS, check=False)
    chart.apply(llmservice(NAME, NS, {
        "model": {"name": "tiny-chat", "source": f"hf://{REPO}"},
        "replicas": 1,
        "engine": {"env": [{"name": "HF_ENDPOINT", "value": hub.url}]}}))
    pf = forward_to_gateway(chart, processes, NAME, NS, 1)
    yield chart, pf
    pf.close()
    chart.run("delete", "namespace", NS, "--timeout", "180s", check=False)


def test_the_init_container_downloads_from_the_mirror_and_the_engine_serves_it(served, hub: HubServer) -> None:
    kube, pf = served
    (pod,) = engine_pods(kube, NAME, NS)
    (init,) = pod["status"]["initContainerStatuses"]
    assert init["name"] == "model-download"
    assert init["state"]["terminated"]["exitCode"] == 0
    got = [path for method, path in hub.seen() if method == "GET" and "/resolve/" in path]
    assert {p.rsplit("/", 1)[1] for p in got} >= {"model.safetensors", "config.json", "tokenizer.json"}
    log = kube.run("logs", pod["metadata"]["name"], "-n", NS, "-c", "model-download").stdout
    assert "Error" not in log and "Traceback" not in log, log
    client = openai.OpenAI(base_url=f"{pf.url}/v1", api_key=pf.api_key, max_retries=0, timeout=120)
    assert [m.id for m in client.models.list().data] == ["tiny-chat"]
    reply = client.chat.completions.create(model="tiny-chat", messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=8, temperature=0)
    assert reply.choices[0].message.content
