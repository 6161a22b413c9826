"""The real node itself: Ready on containerd, both images already in its store,
a pod that really runs (its own PID namespace, a pod IP on the bridge), and the
API server reaching the kubelet for logs and exec."""
from __future__ import annotations

import uuid

import pytest

from nodeutil import NODE_NAME, pod_report
from kubeutil import VERSIONS, Kube, wait_for

NS = "e2e-node"
CONTAINERD_VERSION = VERSIONS["CONTAINERD_VERSION"]


@pytest.fixture(scope="module")
def ns(kube: Kube) -> Kube:
    kube.run("create", "namespace", NS, check=False)
    yield kube
    kube.run("delete", "namespace", NS, "--wait=false", check=False)


def test_the_real_node_is_ready_on_containerd_next_to_the_kwok_nodes(kube: Kube) -> None:
    nodes = {n["metadata"]["name"]: n for n in kube.json("get", "nodes")["items"]}
    node = nodes[NODE_NAME]
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True", ready
    # containerd v2, the one build.sh builds (not a distribution's 1.x)
    runtime = node["status"]["nodeInfo"]["containerRuntimeVersion"]
    assert runtime == f"containerd://{CONTAINERD_VERSION.removeprefix('v')}", runtime
    assert "kwok.x-k8s.io/node" not in node["metadata"].get("annotations", {})
    kwok = [n for name, n in nodes.items() if name != NODE_NAME]
    assert len(kwok) == 2
    for n in kwok:
        assert n["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
        assert {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"} in n["spec"]["taints"]


def test_both_images_are_in_the_node_image_store(kube: Kube, images: dict[str, str]) -> None:
    node = kube.json("get", "node", NODE_NAME)
    # an image a rebuild untagged (the previous engine, until the kubelet's image GC) has no names
    names = {name for image in node["status"].get("images", []) for name in image.get("names") or []}
    for ref in (images["engine"], images["gateway"], images["pause"]):
        assert ref in names, f"{ref} not in {sorted(names)}"


def test_a_pod_runs_for_real_and_the_api_server_reaches_its_kubelet(ns: Kube, images: dict[str, str]) -> None:
    name = f"probe-{uuid.uuid4().hex[:6]}"
    token = uuid.uuid4().hex
    ns.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
              "spec": {"restartPolicy": "Never", "containers": [{
                  "name": "main", "image": images["gateway"], "imagePullPolicy": "Never",
                  "command": ["python", "-c",
                              f"import os, time; print('{token}', os.getpid(), os.getuid(), flush=True); "
                              "time.sleep(3600)"]}]}})

    def running() -> dict | None:
        pod = ns.get("pod", name, NS) or {}
        return pod if pod.get("status", {}).get("phase") == "Running" else None
    try:
        pod = wait_for(running, f"pod {name} Running", timeout=180)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{pod_report(ns, NS)}") from None
    assert pod["spec"]["nodeName"] == NODE_NAME
    assert pod["status"]["containerStatuses"][0]["containerID"].startswith("containerd://")
    assert pod["status"]["podIP"].startswith("10.244.0.")
    # logs and exec go API server -> kubelet -> containerd
    out = wait_for(lambda: token in (log := ns.run("logs", name, "-n", NS, check=False).stdout) and log,
                   "the pod's log through the kubelet", timeout=60)
    # the Dockerfile's USER 10001, and PID 1 in the pod's own PID namespace
    assert out.split() == [token, "1", "10001"]
    p = ns.run("exec", name, "-n", NS, "--", "python", "-c", "import os; print(os.getpid() > 1)")
    assert p.stdout.strip() == "True"
    ns.run("delete", "pod", name, "-n", NS, "--grace-period", "1")
