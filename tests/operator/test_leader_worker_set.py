"""spec.engine.nodesPerReplica > 1: the engine as a LeaderWorkerSet (builders, status, and the
operator against an emulated API server with and without the LWS API installed)."""
from __future__ import annotations

import sys
from pathlib import Path

import kubernetes_validate
import pytest

from pagedkube.operator import naming
from pagedkube.operator.builders import build_children
from pagedkube.operator.crd import build_crd
from pagedkube.operator.drift import is_subset
from pagedkube.operator.kube import api_path
from pagedkube.operator.spec import LLMServiceSpec
from pagedkube.operator.status import Problem, compute_status

sys.path.insert(0, str(Path(__file__).parent))
from llms_emulator import ClusterEmulator  # noqa: E402
from test_handlers import (  # noqa: E402,F401  (fixtures: cluster, operator, with_prometheus, resync_interval)
    LLMSERVICE, NS, User, children_in, cluster, condition, events, llmservice, obj, operator,
    resync_interval, until, with_prometheus)

K8S_VERSION = "1.37"
UID = "0b9e3a4c-1111-2222-3333-444455556666"
LWS = "leaderworkerset.x-k8s.io/v1/leaderworkersets"
TWO_BY_EIGHT = {"model": {"source": "hf://meta-llama/Llama-3.1-70B-Instruct"}, "replicas": 3,
                "engine": {"tensorParallelSize": 8, "nodesPerReplica": 2, "maxModelLen": 8192,
                           "resources": {"limits": {"nvidia.com/gpu": 8, "memory": "320Gi"}}}}
CPU_PAIR = {"model": {"source": "builtin://tiny"}, "replicas": 2, "engine": {"nodesPerReplica": 2}}


def spec_of(spec: dict) -> LLMServiceSpec:
    return LLMServiceSpec.from_body({"apiVersion": "pagedkube.io/v1alpha1", "kind": "LLMService", "spec": spec,
                                     "metadata": {"name": "demo", "namespace": NS, "uid": UID, "generation": 1}})


def kids(spec: dict) -> dict[str, dict]:
    return {f"{c['kind']}/{c['metadata']['name']}": c
            for c in build_children(spec_of(spec), with_service_monitor=False)}


def as_pod(template: dict) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", **template["metadata"]},
            "spec": template["spec"]}


def test_a_multi_node_engine_is_a_leader_worker_set_instead_of_a_deployment() -> None:
    objs = kids(TWO_BY_EIGHT)
    assert "Deployment/demo-engine" not in objs
    lws = objs["LeaderWorkerSet/demo-engine"]
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert lws["metadata"]["ownerReferences"][0]["uid"] == UID
    spec = lws["spec"]
    assert spec["replicas"] == 3                                      # groups: the scale subresource's count
    assert spec["startupPolicy"] == "LeaderCreated"
    assert spec["rolloutStrategy"] == {"type": "RollingUpdate",
                                       "rollingUpdateConfiguration": {"maxSurge": 0, "maxUnavailable": 1}}
    # a Service per group (NAME-engine-i): LWS's shared one would be NAME-engine, our engine Service's name
    assert spec["networkConfig"] == {"subdomainPolicy": "UniquePerReplica"}
    template = spec["leaderWorkerTemplate"]
    assert template["size"] == 2 and template["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader, worker = template["leaderTemplate"], template["workerTemplate"]
    for t in (leader, worker):
        assert kubernetes_validate.validate(as_pod(t), K8S_VERSION, strict=True) == K8S_VERSION
        (c,) = t["spec"]["containers"]
        assert c["resources"] == {"limits": {"nvidia.com/gpu": 8, "memory": "320Gi"}}
        assert {"name": "shm", "mountPath": "/dev/shm"} in c["volumeMounts"]
        assert [i["name"] for i in t["spec"]["initContainers"]] == ["model-download"]   # each pod has the files
    (lc,) = leader["spec"]["containers"]
    args = lc["args"]
    assert args[args.index("--tensor-parallel-size") + 1] == "8"
    assert args[args.index("--nnodes") + 1] == "2" and args[args.index("--master-port") + 1] == "29500"
    assert {"name": "dist", "containerPort": 29500, "protocol": "TCP"} in lc["ports"]
    assert lc["readinessProbe"]["httpGet"]["path"] == "/ready"
    (wc,) = worker["spec"]["containers"]
    assert wc["command"] == ["pagedkube"]
    assert wc["args"] == ["serve-worker", "--master-addr", "$(LWS_LEADER_ADDRESS)", "--master-port", "29500",
                          "--node-rank", "$(LWS_WORKER_INDEX)"]
    assert "readinessProbe" not in wc and "ports" not in wc       # no HTTP on a worker
    # The worker loads the model the leader names (a Hub id here), so it has the same cache and env.
    assert args[args.index("--model") + 1] == "meta-llama/Llama-3.1-70B-Instruct"
    assert wc["volumeMounts"] == lc["volumeMounts"] and wc["env"] == lc["env"]
    assert {"name": "HF_HOME", "value": "/models/cache/huggingface"} in wc["env"]


def test_what_selects_engines_selects_the_leaders_only() -> None:
    objs = kids(CPU_PAIR)
    template = objs["LeaderWorkerSet/demo-engine"]["spec"]["leaderWorkerTemplate"]
    selector = dict(part.split("=") for part in naming.engine_selector("demo").split(","))
    assert selector.items() <= template["leaderTemplate"]["metadata"]["labels"].items()
    assert not selector.items() <= template["workerTemplate"]["metadata"]["labels"].items()
    assert template["workerTemplate"]["metadata"]["labels"]["app.kubernetes.io/component"] == "engine-worker"
    assert objs["Service/demo-engine"]["spec"]["selector"] == selector          # the gateway's EndpointSlices
    assert objs["PodDisruptionBudget/demo-engine"]["spec"]["selector"]["matchLabels"] == selector
    # A CPU group's leader runs --nnodes 2 without GPUs; the tiny model is split over 2 ranks.
    (c,) = template["leaderTemplate"]["spec"]["containers"]
    assert c["args"][c["args"].index("--nnodes") + 1] == "2" and "--device" not in c["args"]
    assert objs["LeaderWorkerSet/demo-engine"]["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"] == {
        "maxSurge": 1, "maxUnavailable": 0}


def test_the_network_policy_lets_a_groups_pods_reach_each_other_on_any_port() -> None:
    policy = kids(CPU_PAIR)["NetworkPolicy/demo-engine"]
    assert kubernetes_validate.validate(policy, K8S_VERSION, strict=True) == K8S_VERSION
    group = {"matchLabels": {"app.kubernetes.io/name": "pagedkube", "app.kubernetes.io/instance": "demo"},
             "matchExpressions": [{"key": "app.kubernetes.io/component", "operator": "In",
                                   "values": ["engine", "engine-worker"]}]}
    assert policy["spec"]["podSelector"] == group
    assert {"from": [{"podSelector": group}]} in policy["spec"]["ingress"]      # no ports: store, gloo, NCCL
    single = kids({"model": {"source": "builtin://tiny"}})["NetworkPolicy/demo-engine"]
    assert single["spec"]["podSelector"] == {"matchLabels": naming.selector_labels("demo", "engine")}
    assert all(r.get("ports") for r in single["spec"]["ingress"])


def test_node_counts_the_operator_cannot_run_are_refused() -> None:
    with pytest.raises(ValueError, match="nodesPerReplica 2 needs runtime pagedkube"):
        spec_of({"model": {"source": "pvc://w/llama"}, "engine": {"runtime": "vllm", "nodesPerReplica": 2}})
    with pytest.raises(ValueError, match=r"spec.engine.nodesPerReplica must be <= 16, got 17"):
        spec_of({"model": {"source": "builtin://tiny"}, "engine": {"nodesPerReplica": 17}})
    with pytest.raises(ValueError, match=r"spec.engine.nodesPerReplica must be an integer >= 1, got 0"):
        spec_of({"model": {"source": "builtin://tiny"}, "engine": {"nodesPerReplica": 0}})
    field = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "engine"]["properties"]["nodesPerReplica"]
    assert (field["default"], field["minimum"], field["maximum"]) == (1, 1, 16)


def test_a_missing_lws_api_is_a_condition_that_blocks_the_rollout() -> None:
    blocked = Problem("LeaderWorkerSetMissing", "install LeaderWorkerSet")
    s = compute_status(name="demo", namespace=NS, generation=4, desired_replicas=2, deployment=None, pods=[],
                       now="2026-01-01T00:00:00Z", blocked=blocked)
    got = {c["type"]: (c["status"], c["reason"], c["message"]) for c in s["conditions"]}
    assert got == {"Ready": ("False", "LeaderWorkerSetMissing", "install LeaderWorkerSet"),
                   "Progressing": ("False", "LeaderWorkerSetMissing", "nothing is rolled out until this is resolved"),
                   "Degraded": ("True", "LeaderWorkerSetMissing", "install LeaderWorkerSet")}



@pytest.mark.asyncio
@pytest.mark.kmock(cls=ClusterEmulator)
@pytest.mark.timeout(120)
async def test_without_the_lws_api_the_llmservice_says_so_and_nothing_crashes(operator: ClusterEmulator) -> None:
    user = User(operator)
    await user.call("POST", f"/apis/pagedkube.io/v1alpha1/namespaces/{NS}/llmservices", llmservice(CPU_PAIR),
                    content_type="application/json")
    await until(lambda: condition(operator, "Ready") == ("False", "LeaderWorkerSetMissing"), "LeaderWorkerSetMissing")
    assert condition(operator, "Degraded") == ("True", "LeaderWorkerSetMissing")
    await until(lambda: any(r == "LeaderWorkerSetMissing" and "leaderworkersets.leaderworkerset.x-k8s.io" in m
                            for r, m in events(operator)), "a LeaderWorkerSetMissing event")
    live = children_in(operator)
    assert "Deployment/demo-engine" not in live                    # no single-node engine in its place
    assert {"Service/demo-engine", "Deployment/demo-gateway", "NetworkPolicy/demo-engine"} <= set(live)
    # Back to one node: the Deployment is made and the condition clears.
    await user.call("PATCH", api_path("pagedkube.io/v1alpha1", "LLMService", NS, "demo"),
                    {"spec": {"engine": {"nodesPerReplica": 1}}})
    await until(lambda: obj(operator, "apps/v1/deployments", "demo-engine"), "the engine Deployment")
    await until(lambda: condition(operator, "Ready") == ("False", "EnginesStarting"), "EnginesStarting")


@pytest.fixture
def with_lws(cluster: ClusterEmulator) -> ClusterEmulator:
    """The LeaderWorkerSet API installed: its CRD and its resource."""
    cluster.resources[LWS] = cluster.ResourceInfo(verbs={"get", "list", "watch", "create", "update", "patch",
                                                         "delete"}, kind="LeaderWorkerSet", namespaced=True)
    cluster.objects["apiextensions.k8s.io/v1/customresourcedefinitions", None, naming.LWS_CRD] = {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": naming.LWS_CRD},
        "spec": {"group": "leaderworkerset.x-k8s.io", "scope": "Namespaced",
                 "names": {"kind": "LeaderWorkerSet", "plural": "leaderworkersets", "singular": "leaderworkerset"},
                 "versions": [{"name": "v1", "served": True, "storage": True}]}}
    return cluster


@pytest.mark.asyncio
@pytest.mark.kmock(cls=ClusterEmulator)
@pytest.mark.timeout(120)
async def test_with_the_lws_api_the_engine_is_a_leader_worker_set_and_status_counts_groups(
        with_lws: ClusterEmulator, operator: ClusterEmulator) -> None:
    user = User(operator)
    created = await user.call("POST", f"/apis/pagedkube.io/v1alpha1/namespaces/{NS}/llmservices",
                              llmservice(CPU_PAIR), content_type="application/json")
    lws = await until(lambda: obj(operator, LWS, "demo-engine"), "the LeaderWorkerSet")
    svc = LLMServiceSpec.from_body({**llmservice(CPU_PAIR), "metadata": created["metadata"]})
    (want,) = [c for c in build_children(svc, with_service_monitor=True) if c["kind"] == "LeaderWorkerSet"]
    assert is_subset(want, lws)         # the live one has, in addition, the generated Secret's digest
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["leaderTemplate"]["metadata"]["annotations"] == template["workerTemplate"]["metadata"]["annotations"]
    assert "Deployment/demo-engine" not in children_in(operator)
    await until(lambda: ("Created", "LeaderWorkerSet demo-engine") in events(operator), "a Created event")
    await until(lambda: condition(operator, "Ready") == ("False", "EnginesStarting"), "EnginesStarting")

    # LWS reports one of two groups ready; a leader pod's event refreshes the status.
    await user.call("PATCH", api_path(naming.LWS_API_VERSION, "LeaderWorkerSet", NS, "demo-engine") + "/status",
                    {"status": {"replicas": 2, "readyReplicas": 1, "updatedReplicas": 2}})
    leader = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "demo-engine-0", "namespace": NS, "labels": naming.labels("demo", "engine")}, "status": {}}
    await user.call("POST", f"/api/v1/namespaces/{NS}/pods", leader, content_type="application/json")
    await until(lambda: condition(operator, "Ready") == ("True", "EnginesReady"), "Ready=True")
    status = obj(operator, LLMSERVICE, "demo")["status"]
    assert (status["replicas"], status["readyReplicas"]) == (2, 1)
    assert status["selector"] == naming.engine_selector("demo")       # the HPA counts leaders: groups
    assert condition(operator, "Progressing") == ("True", "RollingOut")

    # A worker pod that crash-loops is the group's problem: Degraded names it.
    worker = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "demo-engine-0-1", "namespace": NS, "labels": naming.labels("demo", "engine-worker")},
        "status": {"containerStatuses": [{"name": "engine", "restartCount": 3, "state": {"waiting": {
            "reason": "CrashLoopBackOff"}}, "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}}
    await user.call("POST", f"/api/v1/namespaces/{NS}/pods", worker, content_type="application/json")
    await until(lambda: condition(operator, "Degraded") == ("True", "CrashLooping"), "Degraded=CrashLooping")
    assert "demo-engine-0-1" in next(c["message"] for c in obj(operator, LLMSERVICE, "demo")["status"]["conditions"]
                                     if c["type"] == "Degraded")

    # Scaling the LLMService scales the groups.
    await user.call("PATCH", api_path("pagedkube.io/v1alpha1", "LLMService", NS, "demo"), {"spec": {"replicas": 4}})
    await until(lambda: obj(operator, LWS, "demo-engine")["spec"]["replicas"] == 4, "4 groups")

    # One node again: a Deployment replaces the LeaderWorkerSet.
    await user.call("PATCH", api_path("pagedkube.io/v1alpha1", "LLMService", NS, "demo"),
                    {"spec": {"engine": {"nodesPerReplica": 1}}})
    await until(lambda: obj(operator, "apps/v1/deployments", "demo-engine"), "the engine Deployment")
    await until(lambda: obj(operator, LWS, "demo-engine") is None, "the LeaderWorkerSet deleted")
    await until(lambda: any(r == "Deleted" and m.startswith("LeaderWorkerSet demo-engine") for r, m in events(operator)),
                "a Deleted event")
