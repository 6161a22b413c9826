"""Helpers for the real-node tests: LLMServices whose images are never pulled,
waits that print the pods and events when they fail, and kubectl port-forward."""
from __future__ import annotations

import base64
import json
import os
import sys
from pathlib import Path

import httpx
import yaml

from kubeutil import ROOT, Kube, Processes, free_port, wait_for

CLUSTER = ROOT / "e2e" / "cluster"
NODE_NAME = "pagedkube-node"
CHART_NS = "pagedkube-system"


def hub_on_node(kube: Kube, repos):
    """A local Hugging Face mirror (tests/helpers/hfhub.py) serving `repos` on the real node's
    address, where its pods reach it (set HF_ENDPOINT to its url); started."""
    from hfhub import HubServer
    node = kube.json("get", "node", NODE_NAME)
    ip = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
    return HubServer(repos, ip).start()


def state_dir() -> Path:
    """Where cluster.sh keeps the real-node cluster's state (its default, or $PAGEDKUBE_E2E_DIR)."""
    return Path(os.environ.get("PAGEDKUBE_E2E_DIR", f"/tmp/pagedkube-node-{os.getuid()}"))


def control_plane_log(component: str, lines: int = 60) -> str:
    """The end of a control-plane process's log (kube-controller-manager, kube-scheduler, ...)
    of the cluster cluster.sh started; empty for a cluster given by $PAGEDKUBE_E2E_KUBECONFIG."""
    state = state_dir()
    name = os.environ.get("PAGEDKUBE_E2E_CLUSTER", NODE_NAME)
    log = state / "kwok" / "clusters" / name / "logs" / f"{component}.log"
    if not log.is_file():
        return ""
    return f"--- {component} log, last {lines} lines\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def node_env() -> dict[str, str]:
    """cluster.sh's environment for the cluster with the real node."""
    return {**os.environ, "PYTHON": sys.executable, "PAGEDKUBE_E2E_NODE": "real"}


def pod_report(kube: Kube, namespace: str) -> str:
    """Pods, their statuses and the last events, and for every restarted container why
    its last run ended and the end of its log: what a failing wait prints."""
    pods = kube.run("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout
    events = kube.run("get", "events", "-n", namespace, "--sort-by", ".lastTimestamp", check=False).stdout
    return f"{pods}\n{restarts(kube, namespace)}{events[-4000:]}"


def restarts(kube: Kube, namespace: str) -> str:
    listed = kube.run("get", "pods", "-n", namespace, "-o", "json", check=False)
    if listed.returncode != 0:
        return ""
    out = []
    for pod in json.loads(listed.stdout)["items"]:
        for status in pod["status"].get("containerStatuses", []):
            if not status.get("restartCount"):
                continue
            name, container = pod["metadata"]["name"], status["name"]
            ended = status.get("lastState", {}).get("terminated", {})
            previous = kube.run("logs", "-n", namespace, name, "-c", container, "--previous", "--tail", "60",
                                check=False).stdout
            out.append(f"--- {name}/{container} restarted {status['restartCount']}x; last run ended: "
                       f"{ {k: ended.get(k) for k in ('reason', 'exitCode', 'signal', 'finishedAt')} }\n{previous}")
    return "".join(f"{o}\n" for o in out)


def component_logs(kube: Kube, name: str, namespace: str, component: str, tail: int = 200) -> str:
    """The last lines of every container of an LLMService's engine or gateway pods."""
    return kube.run("logs", "-n", namespace, "-l", f"app.kubernetes.io/instance={name},"
                    f"app.kubernetes.io/component={component}", "--all-containers", "--prefix",
                    "--tail", str(tail), check=False).stdout


def llmservice(name: str, namespace: str, spec: dict) -> dict:
    """An LLMService whose engine and gateway images are never pulled, and whose gateway
    names the engine that answered (x-pagedkube-endpoint: routeHeaders, off by default)."""
    spec = {**spec,
            "engine": {**spec.get("engine", {}), "imagePullPolicy": "Never"},
            "gateway": {**spec.get("gateway", {}), "imagePullPolicy": "Never", "routeHeaders": True}}
    return {"apiVersion": "pagedkube.io/v1alpha1", "kind": "LLMService",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def example() -> dict:
    return yaml.safe_load((ROOT / "manifests" / "examples" / "llmservice.yaml").read_text())


def ready_llms(kube: Kube, name: str, namespace: str, replicas: int, timeout: float = 600) -> dict:
    def ready() -> dict | None:
        obj = kube.get("llms", name, namespace) or {}
        status = obj.get("status", {})
        cond = next((c for c in status.get("conditions", []) if c["type"] == "Ready"), {})
        ok = cond.get("status") == "True" and status.get("readyReplicas") == replicas == status.get("replicas")
        return obj if ok else None
    try:
        return wait_for(ready, f"LLMService {namespace}/{name} Ready with {replicas} replicas", timeout=timeout,
                        interval=2)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{pod_report(kube, namespace)}") from None


def engine_pods(kube: Kube, name: str, namespace: str) -> list[dict]:
    return kube.json("get", "pods", "-n", namespace, "-l",
                     f"app.kubernetes.io/instance={name},app.kubernetes.io/component=engine")["items"]


def gateway_api_key(kube: Kube, name: str, namespace: str) -> str:
    """The client key the operator generated for the LLMService's gateway (closed by default)."""
    secret = wait_for(lambda: kube.get("secret", f"{name}-api-key", namespace), f"Secret {name}-api-key")
    return base64.b64decode(secret["data"]["api-key"]).decode()


def forward_to_gateway(kube: Kube, processes: Processes, name: str, namespace: str, replicas: int) -> "PortForward":
    """Waits for the LLMService to be Ready with `replicas` engines and its gateway rolled out;
    returns a port-forward to its Service (port 80), with the gateway's generated key."""
    ready_llms(kube, name, namespace, replicas)
    kube.run("rollout", "status", f"deployment/{name}-gateway", "-n", namespace, "--timeout", "300s", timeout=320)
    pf = PortForward(kube, processes, namespace, f"svc/{name}", 80)
    pf.api_key = gateway_api_key(kube, name, namespace)
    return pf


class PortForward:
    """`kubectl port-forward TARGET LOCAL:PORT` (API server -> kubelet -> the pod) as a
    process; `url` is http://127.0.0.1:LOCAL once it answers GET /health. kubectl
    exits when the pod refuses a connection (not listening yet): it is restarted."""

    def __init__(self, kube: Kube, processes: Processes, namespace: str, target: str, port: int):
        self.api_key = ""   # the gateway's client key, when forwarding to a gateway (forward_to_gateway)
        self.local = free_port()
        self.processes = processes
        self.url = f"http://127.0.0.1:{self.local}"
        cmd = [str(kube.kubectl), "--kubeconfig", str(kube.kubeconfig), "port-forward", "-n", namespace, target,
               f"{self.local}:{port}"]
        self.proc = processes.start(f"port-forward-{self.local}", cmd, env={})
        restarts = [0]

        def up() -> bool:
            if self.proc.poll() is not None:
                restarts[0] += 1
                assert restarts[0] <= 20, f"port-forward keeps exiting:\n{processes.log(self.proc)}"
                self.proc = processes.start(f"port-forward-{self.local}-{restarts[0]}", cmd, env={})
                return False
            try:
                return httpx.get(f"{self.url}/health", timeout=3).status_code == 200
            except httpx.HTTPError:
                return False
        wait_for(up, f"port-forward to {namespace}/{target}", timeout=180, interval=1)

    def close(self) -> None:
        self.processes.stop(self.proc)
