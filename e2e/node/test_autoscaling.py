"""The gateway pod's autoscaler against real engine pods: a burst of requests on
one engine with a small maxNumSeqs raises the LLMService scale subresource, the
new engine pod starts and serves; when the burst ends two clients go on with long
answers, and after the scale-down window the autoscaler drains one engine (its
/ready fails: the pod turns not ready) and scales in once it is idle: the
ReplicaSet removes exactly the drained pod, with no pod annotation, and no
request is lost."""
from __future__ import annotations

import concurrent.futures as cf
import threading

import openai
import pytest

from kubeutil import Kube, Processes, wait_for
from nodeutil import component_logs, engine_pods, forward_to_gateway, llmservice, ready_llms

NS = "e2e-autoscale"
NAME = "burst"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"   # the old mechanism: must not appear
LONG_TOKENS = 600   # a long answer: still running when the scale-in begins
SCALE_DOWN_WINDOW_S = 30   # short, so the test sees the scale-in; HPA's default is 300


@pytest.fixture(scope="module")
def burst(chart: Kube, processes: Processes):
    chart.run("create", "namespace", NS, check=False)
    chart.apply(llmservice(NAME, NS, {
        "model": {"name": NAME, "source": "builtin://tiny"},
        "replicas": 1,
        # four running sequences per engine: ten clients are a queue; two long answers fit one engine
        "engine": {"maxNumSeqs": 4, "resources": {"requests": {"cpu": "100m", "memory": "512Mi"}}},
        "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 2, "targetQueueDepth": 1,
                        "scaleUpWindowSeconds": 0, "scaleDownWindowSeconds": SCALE_DOWN_WINDOW_S},
        "gateway": {"routing": {"policy": "least-load"}}}))
    pf = forward_to_gateway(chart, processes, NAME, NS, 1)
    yield chart, pf
    pf.close()
    chart.run("delete", "namespace", NS, "--timeout", "180s", check=False)


def ready_ips(kube: Kube) -> set[str]:
    return {p["status"]["podIP"] for p in engine_pods(kube, NAME, NS)
            if not p["metadata"].get("deletionTimestamp")
            and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))}


def test_a_burst_scales_up_new_pods_serve_and_a_scale_in_under_load_loses_nothing(burst) -> None:
    kube, pf = burst
    (first,) = ready_ips(kube)
    client = openai.OpenAI(base_url=f"{pf.url}/v1", api_key=pf.api_key, max_retries=0, timeout=300)
    done = threading.Event()
    served: set[str] = set()

    def worker(n: int) -> int:
        count = 0
        while not done.is_set():
            raw = client.chat.completions.with_raw_response.create(
                model=NAME, messages=[{"role": "user", "content": f"client {n} says {count}"}],
                max_tokens=64, temperature=0)
            assert raw.parse().choices[0].message.content
            served.add(raw.headers["x-pagedkube-endpoint"])
            count += 1
        return count
    with cf.ThreadPoolExecutor(10) as pool:
        futures = [pool.submit(worker, n) for n in range(10)]
        try:
            wait_for(lambda: kube.json("get", "llms", NAME, "-n", NS)["spec"]["replicas"] == 2,
                     "the autoscaler to raise the scale subresource to 2", timeout=180, interval=1)
            ready_llms(kube, NAME, NS, 2)
            (second,) = ready_ips(kube) - {first}
            wait_for(lambda: f"http://{second}:8000" in served, f"a request served by the new engine {second}",
                     timeout=120, interval=1)
        finally:
            done.set()
        assert sum(f.result() for f in futures) > 0   # re-raises any failed request

    # The lull under load: two clients go on with long answers. Two requests in flight fit one
    # engine of 4 slots, so after the scale-down window one engine is drained; it leaves once
    # its answer is done, and every answer arrives whole.
    long_done = threading.Event()
    long_answers: list[tuple[int, str]] = []

    def long_worker(n: int) -> None:
        count = 0
        while not long_done.is_set():
            r = client.completions.create(model=NAME, prompt=f"long {n}-{count}: dogs", max_tokens=LONG_TOKENS,
                                          temperature=0, extra_body={"ignore_eos": True})
            long_answers.append((r.usage.completion_tokens, r.choices[0].finish_reason))
            count += 1

    def terminating() -> dict | None:
        going = [p for p in engine_pods(kube, NAME, NS) if p["metadata"].get("deletionTimestamp")]
        return going[0] if going else None
    with cf.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(long_worker, n) for n in range(2)]
        try:
            victim = wait_for(terminating, "the scale-in to delete an engine pod",
                              timeout=SCALE_DOWN_WINDOW_S + 600, interval=0.5)
            wait_for(lambda: kube.json("get", "llms", NAME, "-n", NS)["spec"]["replicas"] == 1, "replicas 1")
            ready_llms(kube, NAME, NS, 1)
            started = len(long_answers)
            wait_for(lambda: len(long_answers) >= started + 2, "two long answers on the one engine left",
                     timeout=600, interval=1)
        finally:
            long_done.set()
        for f in futures:
            f.result()   # re-raises any failed request
    assert long_answers and all(a == (LONG_TOKENS, "length") for a in long_answers), long_answers
    # The drained engine is the pod that went, chosen by its readiness, not by an annotation.
    gateway_log = component_logs(kube, NAME, NS, "gateway", tail=2000)
    assert f"draining http://{victim['status']['podIP']}:8000" in gateway_log, gateway_log[-3000:]
    assert "aborting" not in component_logs(kube, NAME, NS, "engine", tail=2000)
    assert not [p for p in engine_pods(kube, NAME, NS) if DELETION_COST in p["metadata"].get("annotations", {})]
    assert kube.json("get", "llms", NAME, "-n", NS)["spec"]["replicas"] == 1
    ready_llms(kube, NAME, NS, 1)
