"""The gateway pod's autoscaler against real engine pods: a burst of requests on
one engine with a small maxNumSeqs raises the LLMService scale subresource, the
new engine pod starts and serves; when the burst ends and the scale-down window
has passed, the autoscaler marks the pod to remove with the lowest
controller.kubernetes.io/pod-deletion-cost and that is the pod the ReplicaSet removes."""
from __future__ import annotations

import concurrent.futures as cf
import threading

import openai
import pytest

from kubeutil import Kube, Processes, wait_for
from nodeutil import engine_pods, forward_to_gateway, llmservice, ready_llms

NS = "e2e-autoscale"
NAME = "burst"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
SCALE_DOWN_WINDOW_S = 30   # short, so the test sees the scale-in; HPA's default is 300


@pytest.fixture(scope="module")
def burst(chart: Kube, processes: Processes):
    chart.run("create", "namespace", NS, check=False)
    chart.apply(llmservice(NAME, NS, {
        "model": {"name": NAME, "source": "builtin://tiny"},
        "replicas": 1,
        # one running sequence per engine: a handful of clients is a queue
        "engine": {"maxNumSeqs": 1, "resources": {"requests": {"cpu": "100m", "memory": "512Mi"}}},
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


def test_a_burst_scales_up_new_pods_serve_and_the_lull_scales_in_the_cheapest(burst) -> None:
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

    # The lull: after the scale-down window the autoscaler marks costs and scales to 1.
    def terminating() -> tuple[dict, list[dict]] | None:
        pods = engine_pods(kube, NAME, NS)
        going = [p for p in pods if p["metadata"].get("deletionTimestamp")]
        return (going[0], pods) if going else None
    victim, pods = wait_for(terminating, "the scale-in to delete an engine pod",
                            timeout=SCALE_DOWN_WINDOW_S + 120, interval=0.5)
    costs = {p["metadata"]["name"]: int(p["metadata"].get("annotations", {})[DELETION_COST]) for p in pods}
    assert costs[victim["metadata"]["name"]] == min(costs.values()) == -1, costs
    assert kube.json("get", "llms", NAME, "-n", NS)["spec"]["replicas"] == 1
    ready_llms(kube, NAME, NS, 1)
