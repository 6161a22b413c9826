"""LoRA adapters declared on the LLMService, on the real node: a Hub model and two Hub adapters
(real ones, trained with peft on pet-care text: tests/helpers/lora_adapters.py) served by a mirror
on the node's address. The init container fetches all three, the engine serves both adapters
through the gateway pod (the openai client picks one by `model`), `status.adapters` says so, and
an edit of `spec.adapters` (one removed, one added) reaches the running engine through the
mounted list: no pod is restarted or replaced."""
from __future__ import annotations

import openai
import pytest

from kubeutil import ROOT, Kube, Processes, wait_for
from hfhub import HubRepo, HubServer  # tests/helpers (pyproject pythonpath)
from lora_adapters import trained_adapters
from nodeutil import engine_pods, forward_to_gateway, hub_on_node, llmservice

NS = "e2e-lora"
NAME = "lora"
MODEL = "pagedkube-e2e/tiny-chat"
TINY = ROOT / "pagedkube" / "builtin" / "tiny"
# the kubelet refreshes a mounted ConfigMap within about a minute; the engine reads it every 5 s
EDIT_TIMEOUT_S = 300


def adapter_repo(name: str) -> str:
    return f"pagedkube-e2e/lora-{name}"


@pytest.fixture(scope="module")
def hub(kube: Kube):
    adapters = trained_adapters("tiny", TINY)   # {"dogs", "cats", "diet"}: folders in PEFT's format
    repos = [HubRepo.of(MODEL, TINY)] + [HubRepo.of(adapter_repo(n), path) for n, path in adapters.items()]
    server = hub_on_node(kube, repos)
    yield server
    server.close()


@pytest.fixture(scope="module")
def served(chart: Kube, hub: HubServer, processes: Processes):
    chart.run("create", "namespace", NS, check=False)
    chart.apply(llmservice(NAME, NS, {
        "model": {"name": "tiny-chat", "source": f"hf://{MODEL}"},
        "replicas": 1,
        "adapters": [{"name": "dogs", "source": f"hf://{adapter_repo('dogs')}"},
                     {"name": "cats", "source": f"hf://{adapter_repo('cats')}"}],
        "engine": {"env": [{"name": "HF_ENDPOINT", "value": hub.url}]}}))
    pf = forward_to_gateway(chart, processes, NAME, NS, 1)
    yield chart, pf
    pf.close()
    chart.run("delete", "namespace", NS, "--timeout", "180s", check=False)


def ask(client: openai.OpenAI, model: str) -> str:
    reply = client.completions.create(model=model, prompt="My dog limps after a walk.", max_tokens=8,
                                      temperature=0)
    return reply.choices[0].text


def adapter_status(kube: Kube) -> dict[str, bool]:
    obj = kube.get("llms", NAME, NS) or {}
    return {a["name"]: a["ready"] for a in (obj.get("status") or {}).get("adapters") or []}


def test_both_adapters_serve_through_the_gateway_and_the_status_says_so(served) -> None:
    kube, pf = served
    client = openai.OpenAI(base_url=f"{pf.url}/v1", api_key=pf.api_key, max_retries=0, timeout=120)
    models = {m.id: m for m in client.models.list().data}
    assert set(models) == {"tiny-chat", "dogs", "cats"}
    assert models["dogs"].model_extra["parent"] == "tiny-chat"
    base, dogs, cats = ask(client, "tiny-chat"), ask(client, "dogs"), ask(client, "cats")
    assert dogs and cats and len({base, dogs, cats}) > 1, (base, dogs, cats)   # learned deltas, not the base
    wait_for(lambda: adapter_status(kube) == {"dogs": True, "cats": True}, "status.adapters: both ready",
             timeout=120, interval=2)


def test_editing_the_adapters_loads_and_unloads_without_a_restart(served) -> None:
    kube, pf = served
    client = openai.OpenAI(base_url=f"{pf.url}/v1", api_key=pf.api_key, max_retries=0, timeout=120)
    before = {p["metadata"]["uid"]: p["status"]["containerStatuses"][0]["restartCount"]
              for p in engine_pods(kube, NAME, NS)}
    kube.run("patch", "llms", NAME, "-n", NS, "--type", "merge", "-p",
             '{"spec":{"adapters":[{"name":"dogs","source":"hf://%s"},{"name":"diet","source":"hf://%s"}]}}'
             % (adapter_repo("dogs"), adapter_repo("diet")))

    def switched() -> bool:
        return {m.id for m in client.models.list().data} == {"tiny-chat", "dogs", "diet"}
    wait_for(switched, "the gateway lists diet and not cats", timeout=EDIT_TIMEOUT_S, interval=3)
    assert ask(client, "diet")
    with pytest.raises(openai.NotFoundError):
        ask(client, "cats")
    assert ask(client, "dogs")
    after = {p["metadata"]["uid"]: p["status"]["containerStatuses"][0]["restartCount"]
             for p in engine_pods(kube, NAME, NS)}
    assert after == before, "an engine pod was restarted or replaced"
    wait_for(lambda: adapter_status(kube) == {"dogs": True, "diet": True}, "status.adapters follows the edit",
             timeout=120, interval=2)
