"""spec.engine.nodesPerReplica: 2 on the real node, with the LeaderWorkerSet controller that
cluster.sh runs (e2e/cluster/lws.sh): one group of two pods runs one builtin://tiny engine, the
leader (`pagedkube serve --nnodes 2`, HTTP, rank 0) and a worker (`pagedkube serve-worker`, rank 1)
joined over gloo on the pod network, the worker finding the leader by the LWS_LEADER_ADDRESS
LWS's pod webhook gives it (a name the cluster DNS, CoreDNS on the node, answers). A chat through
the gateway pod gives TP=1's greedy answer; deleting the worker pod makes LWS recreate the whole
group (RecreateGroupOnPodRestart) and the new group serves the same answer."""
from __future__ import annotations

import openai
import pytest

from kubeutil import Kube, Processes, wait_for
from nodeutil import NODE_NAME, PortForward, forward_to_gateway, llmservice, pod_report, ready_llms
from pagedkube.engine import LLM, SamplingParams
from pagedkube.model_source import resolve_model_source

NS = "e2e-multi-node"
NAME = "tp"
MODEL = "tiny"
SOURCE = "builtin://tiny"
QUESTION = "How often should I walk my puppy?"
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def served(chart: Kube, processes: Processes):
    chart.run("create", "namespace", NS, check=False)
    chart.apply(llmservice(NAME, NS, {
        "model": {"name": MODEL, "source": SOURCE},
        "replicas": 1,
        # float32: the all-reduce's order differs from TP=1's, which bf16 rounding could show
        "engine": {"nodesPerReplica": 2, "extraArgs": ["--dtype", "float32"]}}))
    pf = forward_to_gateway(chart, processes, NAME, NS, 1)
    yield chart, pf
    pf.close()
    chart.run("delete", "namespace", NS, "--timeout", "180s", check=False)


@pytest.fixture(scope="module")
def tp1_answer() -> str:
    """The answer of the same model in one process of the test (TP=1, float32, greedy)."""
    llm = LLM(resolve_model_source(SOURCE).path, device="cpu", dtype="float32")
    try:
        (out,) = llm.chat([[{"role": "user", "content": QUESTION}]],
                          SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS), use_tqdm=False)
    finally:
        llm.engine.shutdown()
    return out.outputs[0].text


def group_pods(kube: Kube) -> dict[str, dict]:
    """The group's live pods by component: {"engine": leader, "engine-worker": worker}."""
    pods = kube.json("get", "pods", "-n", NS, "-l", f"app.kubernetes.io/instance={NAME},"
                     "app.kubernetes.io/component in (engine, engine-worker)")["items"]
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    by = {p["metadata"]["labels"]["app.kubernetes.io/component"]: p for p in live}
    assert len(by) == len(live), [p["metadata"]["name"] for p in live]
    return by


def ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


def chat(pf: PortForward) -> tuple[str, str]:
    """(text, x-pagedkube-endpoint) of one greedy chat through the gateway."""
    client = openai.OpenAI(base_url=f"{pf.url}/v1", api_key=pf.api_key, max_retries=2, timeout=120)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=MAX_TOKENS, temperature=0)
    return raw.parse().choices[0].message.content, raw.headers["x-pagedkube-endpoint"]


def answered(pf: PortForward) -> tuple[str, str] | None:
    """chat(), or None while the gateway has no ready engine for it yet (its 503)."""
    try:
        return chat(pf)
    except openai.APIStatusError as e:
        if e.status_code != 503:
            raise
        return None


def ip_of(endpoint: str) -> str:
    return endpoint.removeprefix("http://").rsplit(":", 1)[0]


def test_a_two_pod_group_serves_tp1s_answer_and_a_deleted_worker_restarts_the_group(
        served, tp1_answer: str) -> None:
    kube, pf = served
    pods = group_pods(kube)
    assert sorted(pods) == ["engine", "engine-worker"], pod_report(kube, NS)
    leader, worker = pods["engine"], pods["engine-worker"]
    for pod in (leader, worker):
        assert pod["spec"]["nodeName"] == NODE_NAME and ready(pod), pod_report(kube, NS)
        assert pod["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-index"] == "0"
    assert leader["metadata"]["name"] == f"{NAME}-engine-0"
    assert worker["metadata"]["name"] == f"{NAME}-engine-0-1"
    assert worker["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/worker-index"] == "1"
    # LWS's pod webhook put the leader's address in the worker; the args name it
    env = {e["name"]: e.get("value") for e in worker["spec"]["containers"][0]["env"]}
    assert env["LWS_LEADER_ADDRESS"] == f"{NAME}-engine-0.{NAME}-engine-0.{NS}"   # the group's own Service
    assert env["LWS_WORKER_INDEX"] == "1"
    log = kube.run("logs", worker["metadata"]["name"], "-n", NS).stdout
    assert "node 1 of 2: ranks 1-1 of " in log, log

    # one group of two ready pods is one ready replica
    lws = kube.json("get", "leaderworkersets", f"{NAME}-engine", "-n", NS)
    assert (lws["status"]["replicas"], lws["status"]["readyReplicas"]) == (1, 1), lws["status"]
    status = kube.get("llms", NAME, NS)["status"]
    assert (status["replicas"], status["readyReplicas"]) == (1, 1), status

    text, endpoint = chat(pf)
    assert text == tp1_answer
    assert ip_of(endpoint) == leader["status"]["podIP"]   # the gateway routes to leaders only

    kube.run("delete", "pod", worker["metadata"]["name"], "-n", NS, "--wait=false")

    def new_group() -> dict[str, dict] | None:
        pods = group_pods(kube)
        fresh = sorted(pods) == ["engine", "engine-worker"] and all(ready(p) for p in pods.values()) and \
            pods["engine"]["metadata"]["uid"] != leader["metadata"]["uid"] and \
            pods["engine-worker"]["metadata"]["uid"] != worker["metadata"]["uid"]
        return pods if fresh else None
    try:
        pods = wait_for(new_group, "a new leader and worker, both ready", timeout=600, interval=2)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{pod_report(kube, NS)}") from None
    ready_llms(kube, NAME, NS, 1)
    text, endpoint = wait_for(lambda: answered(pf), "a chat through the gateway to the new group", timeout=120)
    assert text == tp1_answer
    assert ip_of(endpoint) == pods["engine"]["status"]["podIP"]
