"""The product in real containers, as a user installs it: the chart's operator pod
reconciles manifests/examples/llmservice.yaml, the engine pods pass their probes,
and chat completions go client -> kubectl port-forward -> gateway pod -> engine
pod over the pod network. Then `kubectl scale` to 3, and an engine pod deleted
under load. The tests run in file order on one LLMService.
"""
from __future__ import annotations

import concurrent.futures as cf
import copy
import json
import re
import time
import uuid

import httpx
import openai
import pytest

from kubeutil import Kube, Processes, wait_for
from nodeutil import (CHART_NS, NODE_NAME, PortForward, component_logs, engine_pods, example, forward_to_gateway,
                      llmservice, pod_report, ready_llms)

NS = "e2e-product"
EXAMPLE = example()
NAME = EXAMPLE["metadata"]["name"]
MODEL = EXAMPLE["spec"]["model"]["name"]
# The example asks 1 CPU per engine; the test scales to 3 engines on a 2-core node, so it
# asks 400m each (everything else is the example as written).
ENGINE_CPU = "400m"


@pytest.fixture(scope="module")
def llms(chart: Kube) -> Kube:
    chart.run("create", "namespace", NS, check=False)
    spec = copy.deepcopy(EXAMPLE["spec"])
    spec["engine"]["resources"]["requests"]["cpu"] = ENGINE_CPU
    chart.apply(llmservice(NAME, NS, spec))
    yield chart
    chart.run("delete", "namespace", NS, "--timeout", "180s", check=False)


@pytest.fixture(scope="module")
def gateway(llms: Kube, processes: Processes) -> PortForward:
    pf = forward_to_gateway(llms, processes, NAME, NS, 2)
    yield pf
    pf.close()


def client(gw: PortForward) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key=gw.api_key, max_retries=0, timeout=120)


def ready_engine_ips(kube: Kube) -> set[str]:
    return {p["status"]["podIP"] for p in engine_pods(kube, NAME, NS)
            if p["status"].get("podIP") and not p["metadata"].get("deletionTimestamp")
            and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))}


def chat(gw: PortForward, prompt: str, max_tokens: int = 8, system: str | None = None) -> tuple[str, str]:
    """(text, x-pagedkube-endpoint) of one non-streamed chat completion."""
    messages = [{"role": "system", "content": system}] if system else []
    raw = client(gw).chat.completions.with_raw_response.create(
        model=MODEL, messages=messages + [{"role": "user", "content": prompt}], max_tokens=max_tokens,
        temperature=0)
    return raw.parse().choices[0].message.content, raw.headers["x-pagedkube-endpoint"]


def test_the_operator_pod_reconciles_the_example_and_the_engines_pass_their_probes(llms: Kube) -> None:
    (operator,) = llms.json("get", "pods", "-n", CHART_NS)["items"]
    assert operator["spec"]["nodeName"] == NODE_NAME
    assert operator["spec"]["serviceAccountName"] == "pagedkube-operator"
    obj = ready_llms(llms, NAME, NS, 2)
    assert obj["status"]["replicas"] == 2
    pods = engine_pods(llms, NAME, NS)
    assert len(pods) == 2
    for pod in pods:
        assert pod["spec"]["nodeName"] == NODE_NAME
        (status,) = pod["status"]["containerStatuses"]
        assert status["ready"] and status["started"] and status["containerID"].startswith("containerd://")
        assert status["restartCount"] == 0, pod_report(llms, NS)
    # READY column of `kubectl get llms`
    row = llms.run("get", "llms", NAME, "-n", NS, "--no-headers").stdout.split()
    assert row[:4] == [NAME, EXAMPLE["spec"]["model"]["source"], "2", "2"]


def test_the_engines_serve_the_default_model_with_the_q4_kernels_prebuilt_in_the_image(llms: Kube) -> None:
    """The image has no ninja to build them: the Q4 kernels come built (PAGEDKUBE_CPU_EXT_DIR), so the CPU
    default decodes with one of them (the exact q4fused or the near-exact int16 q4i16, whichever
    the pod's calibration measures faster) on float32 activations, never the bf16 fallback."""
    for pod in engine_pods(llms, NAME, NS):
        log = llms.run("logs", pod["metadata"]["name"], "-n", NS).stdout
        (chosen,) = [line for line in log.splitlines() if "projection kernels chosen by measurement" in line]
        assert "float32 activations" in chosen, chosen
        decode = re.findall(r" decode (\S+)", chosen)
        assert decode and all(kernel.startswith(("q4fused", "q4i16")) for kernel in decode), chosen
        assert "round activations and weights to bf16" not in log and "not built" not in log, log[-4000:]


def test_the_engines_decode_natively_with_nothing_to_compile(llms: Kube) -> None:
    """The default model's decode steps run as one C++ call a step (engine/native_decode.py) from
    the pod's first step: no torch.compile of decode buckets in the background."""
    for pod in engine_pods(llms, NAME, NS):
        log = llms.run("logs", pod["metadata"]["name"], "-n", NS).stdout
        assert "decode steps run natively" in log, log[-4000:]
        assert "decode capture (torch.compile)" not in log, log[-4000:]


def test_a_chat_completion_through_the_gateway_pod_streaming_and_not(llms: Kube, gateway: PortForward) -> None:
    engines = ready_engine_ips(llms)
    text, endpoint = chat(gateway, "Hello there")
    assert text
    assert endpoint.removeprefix("http://").rsplit(":", 1)[0] in engines, (endpoint, engines)
    with client(gateway).chat.completions.with_streaming_response.create(
            model=MODEL, messages=[{"role": "user", "content": "Tell me a story"}], max_tokens=8,
            temperature=0, stream=True) as response:
        endpoint = response.headers["x-pagedkube-endpoint"]
        chunks = list(response.parse())
    assert endpoint.removeprefix("http://").rsplit(":", 1)[0] in engines
    assert "".join(choice.delta.content or "" for c in chunks for choice in c.choices)
    (reason,) = [choice.finish_reason for c in chunks for choice in c.choices if choice.finish_reason]
    assert reason in ("length", "stop")


def test_the_gateway_is_closed_without_a_key(gateway: PortForward) -> None:
    """The example names no apiKeySecretRef: the gateway still wants a key, the generated one."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    anonymous = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=60)
    assert anonymous.status_code == 401 and anonymous.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{gateway.url}/v1/models", timeout=10).status_code == 401
    assert httpx.get(f"{gateway.url}/ready", timeout=10).json() == {"ready": True}   # nothing about the engines
    doc = httpx.get(f"{gateway.url}/openapi.json", timeout=10).json()
    assert MODEL not in json.dumps(doc)
    for line in httpx.get(f"{gateway.url}/metrics", timeout=10).text.splitlines():
        assert "endpoint=\"http" not in line, line   # engines by pod name, not address
    keyed = httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=60,
                       headers={"Authorization": f"Bearer {gateway.api_key}"})
    assert keyed.status_code == 200, keyed.text


def fresh_system() -> str:
    """A system message that makes the prompt's first KV block new. Without one the chat
    template puts its default system prompt first, a block every engine that served
    anything holds, and any-prefix affinity keeps such prompts on those engines while
    they are within the load bound (a new engine, holding nothing, would get none at
    this load). With a new first block, nobody holds a prefix and the ring spreads them."""
    return f"{uuid.uuid4().hex} You are a helpful assistant."


def served_by(gw: PortForward, ip: str, tries: int = 200) -> bool:
    """Sends fresh prompts until one is served by the engine at `ip`."""
    for _ in range(tries):
        if chat(gw, "hello", max_tokens=2, system=fresh_system())[1].startswith(f"http://{ip}:"):
            return True
    return False


def test_kubectl_scale_to_three_starts_a_pod_that_serves(llms: Kube, gateway: PortForward) -> None:
    before = ready_engine_ips(llms)
    llms.run("scale", "llms", NAME, "-n", NS, "--replicas", "3")
    ready_llms(llms, NAME, NS, 3)
    (new,) = ready_engine_ips(llms) - before
    # the gateway learns the new pod from the EndpointSlice once it is Ready
    wait_for(lambda: served_by(gateway, new, tries=20), f"a request served by the new engine {new}",
             timeout=120, interval=1)


def test_an_engine_pod_deleted_under_load_loses_no_request(llms: Kube, gateway: PortForward) -> None:
    pods = engine_pods(llms, NAME, NS)
    by_ip = {p["status"]["podIP"]: p["metadata"]["name"] for p in pods}
    stop_at = [float("inf")]
    results: list[tuple[str, str]] = []

    def worker(n: int) -> int:
        i = 0
        while time.monotonic() < stop_at[0]:
            results.append(chat(gateway, f"worker {n} request {i}", max_tokens=4, system=fresh_system()))
            i += 1
        return i
    # 3 clients: enough to keep every engine busy; the node has 2 shared cores
    with cf.ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(worker, n) for n in range(3)]
        # the victim: the engine that served the latest request, so it is under load
        wait_for(lambda: any(f.done() for f in futures) or len(results) >= 12, "load on the engines", timeout=120)
        victim_ip = results[-1][1].removeprefix("http://").rsplit(":", 1)[0]
        llms.run("delete", "pod", by_ip[victim_ip], "-n", NS, "--wait=false")
        wait_for(lambda: victim_ip not in ready_engine_ips(llms), "the deleted pod to leave the ready set")
        stop_at[0] = time.monotonic() + 15   # keep the load on while the pod drains and goes
        try:
            sent = sum(f.result() for f in futures)   # raises if any request failed
        except openai.APIError as e:
            raise AssertionError(f"{e}\ngateway:\n{component_logs(llms, NAME, NS, 'gateway')}") from e
    assert sent == len(results) and all(text for text, _ in results)
    # The burst did not get the gateway restarted (its liveness is a TCP connect, not /health).
    gateways = llms.json("get", "pods", "-n", NS, "-l", "app.kubernetes.io/component=gateway")["items"]
    assert [c["restartCount"] for p in gateways for c in p["status"]["containerStatuses"]] == [0], \
        pod_report(llms, NS)
    # the Deployment replaces the pod; the gateway routes to the replacement once Ready
    ready_llms(llms, NAME, NS, 3)
    (replacement,) = wait_for(lambda: (ips := ready_engine_ips(llms) - set(by_ip)) and ips,
                              "the replacement engine pod Ready")
    wait_for(lambda: served_by(gateway, replacement, tries=20),
             f"a request served by the replacement {replacement}", timeout=120, interval=1)


def test_health_and_metrics_answer_through_the_gateway_pod(gateway: PortForward) -> None:
    key = {"Authorization": f"Bearer {gateway.api_key}"}
    assert httpx.get(f"{gateway.url}/ready", headers=key, timeout=10).json()["endpoints"]["ready"] == 3
    assert "pagedkube_gateway" in httpx.get(f"{gateway.url}/metrics", timeout=10).text


# Words a process prints when a cache, temp or home directory is not writable.
UNWRITABLE = ("Read-only file system", "Permission denied", "not writable", "could not be written",
              "Errno 13", "Errno 30", "cannot create", "No usable temporary directory")


@pytest.mark.parametrize("namespace, selector", [
    (CHART_NS, "app.kubernetes.io/name=pagedkube"),
    (NS, "app.kubernetes.io/component=engine"),
    (NS, "app.kubernetes.io/component=gateway"),
])
def test_containers_run_as_non_root_on_a_read_only_root_and_log_no_write_failure(
        llms: Kube, gateway: PortForward, namespace: str, selector: str) -> None:
    pods = [p for p in llms.json("get", "pods", "-n", namespace, "-l", selector)["items"]
            if not p["metadata"].get("deletionTimestamp")]
    assert pods
    for pod in pods:
        name = pod["metadata"]["name"]
        (container,) = pod["spec"]["containers"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        probe = ("import os, tempfile\n"
                 "try:\n    open('/written-by-e2e', 'w')\nexcept OSError as e:\n    print('root', e.errno)\n"
                 "with tempfile.NamedTemporaryFile(dir=os.environ['HOME']) as f:\n    print('home ok')\n"
                 "print(os.getuid(), os.getgid())\n")
        out = llms.run("exec", name, "-n", namespace, "--", "python", "-c", probe).stdout.split("\n")
        assert out[:3] == ["root 30", "home ok", "10001 10001"], (name, out)   # 30: EROFS
        log = llms.run("logs", name, "-n", namespace, "--all-containers").stdout
        assert not [w for w in UNWRITABLE if w in log], (name, log[-4000:])
