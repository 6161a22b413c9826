"""The operator's kopf handlers, in-process, against kmock's Kubernetes emulator.

The operator runs for real (kopf watches, our handlers, the kubernetes client
over HTTP); the test plays the user (creates, edits, deletes) and the
Deployment controller (writes Deployment and pod status).
"""
from __future__ import annotations

import asyncio
import base64
import copy
import json
import sys
import threading
from pathlib import Path
from typing import Any, Callable

import aiohttp
import kmock
import kopf
import kubernetes
import pytest
import pytest_asyncio

from pagedkube.operator import naming
from pagedkube.operator.builders import build_children
from pagedkube.operator.builders.security import SECRET_VERSION_ANNOTATION
from pagedkube.operator.drift import is_subset
from pagedkube.operator.handlers import register_handlers
from pagedkube.operator.install import operator_rules
from pagedkube.operator.kube import Kube, api_path
from pagedkube.operator.reconcile import Reconciler
from pagedkube.operator.spec import LLMServiceSpec

sys.path.insert(0, str(Path(__file__).parent))
from llms_emulator import ClusterEmulator  # noqa: E402

pytestmark = [pytest.mark.asyncio, pytest.mark.kmock(cls=ClusterEmulator), pytest.mark.timeout(120)]

NS = "team-a"
TEST_AGENT = "pagedkube-test-user"
CHILD_RESOURCES = {
    "Deployment": "apps/v1/deployments", "Service": "v1/services", "ServiceAccount": "v1/serviceaccounts",
    "Role": "rbac.authorization.k8s.io/v1/roles", "RoleBinding": "rbac.authorization.k8s.io/v1/rolebindings",
    "PodDisruptionBudget": "policy/v1/poddisruptionbudgets", "ServiceMonitor": "monitoring.coreos.com/v1/servicemonitors",
    "NetworkPolicy": "networking.k8s.io/v1/networkpolicies", "Secret": "v1/secrets",
    "Lease": "coordination.k8s.io/v1/leases", "ConfigMap": "v1/configmaps",
}
ALL_CHILDREN = 13   # build_children's 10 with a ServiceMonitor; the two generated Secrets and the Lease
LLMSERVICE = "pagedkube.io/v1alpha1/llmservices"
RESOURCES: dict[str, Any] = {
    LLMSERVICE: dict(kind="LLMService", namespaced=True, subresources={"status", "scale"}),
    "apiextensions.k8s.io/v1/customresourcedefinitions": dict(kind="CustomResourceDefinition", namespaced=False),
    "v1/namespaces": dict(kind="Namespace", namespaced=False),  # kopf waits to discover it
    "v1/pods": dict(kind="Pod", namespaced=True),
    "v1/events": dict(kind="Event", namespaced=True),
    **{path: dict(kind=kind, namespaced=True) for kind, path in CHILD_RESOURCES.items()},
}
VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}


@pytest.fixture
def with_prometheus() -> bool:
    return True  # whether the Prometheus Operator's ServiceMonitor CRD is installed


@pytest_asyncio.fixture
async def cluster(kmock: ClusterEmulator, with_prometheus: bool) -> ClusterEmulator:
    for path, info in RESOURCES.items():
        kmock.resources[path] = kmock.ResourceInfo(verbs=VERBS, **info)
    if with_prometheus:
        kmock.objects["apiextensions.k8s.io/v1/customresourcedefinitions", None,
                      "servicemonitors.monitoring.coreos.com"] = {
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
            "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
                     "names": {"kind": "ServiceMonitor", "plural": "servicemonitors", "singular": "servicemonitor"},
                     "versions": [{"name": "v1", "served": True, "storage": True}]}}
    return kmock


@pytest.fixture
def resync_interval() -> float:
    return 3600.0  # tests that need the periodic resync parametrize this


@pytest_asyncio.fixture
async def operator(cluster: ClusterEmulator, resync_interval: float):
    url = str(cluster.url).rstrip("/")
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=url)

    @kopf.on.startup(registry=registry)
    def fast(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.watching.reconnect_backoff = 0.1

    register_handlers(registry, resync_interval_s=resync_interval)
    kube = Kube(kubernetes.client.ApiClient(kubernetes.client.Configuration(host=url)))
    reconciler = Reconciler(kube=kube, emit=kube.create_event)
    # kopf runs in its own thread and event loop, as in production: its shutdown
    # cancels every task it did not start, which would include pytest's own.
    stop, ready = threading.Event(), threading.Event()
    thread = threading.Thread(target=kopf.run, kwargs=dict(
        registry=registry, memo=kopf.Memo(reconciler=reconciler), standalone=True, clusterwide=True,
        stop_flag=stop, ready_flag=ready, loop=None), daemon=True)
    thread.start()
    await asyncio.to_thread(ready.wait, 30)
    yield cluster
    stop.set()
    await asyncio.to_thread(thread.join, 30)
    assert not thread.is_alive()


class User:
    """The test's own API calls (marked with a User-Agent, so RBAC checks skip them)."""

    def __init__(self, server: ClusterEmulator):
        self.url = str(server.url).rstrip("/")

    async def call(self, method: str, path: str, body: Any = None,
                   content_type: str = "application/merge-patch+json") -> Any:
        headers = {"User-Agent": TEST_AGENT, "Content-Type": content_type}
        async with aiohttp.ClientSession() as session:
            async with session.request(method, self.url + path, json=body, headers=headers) as resp:
                assert resp.status < 400, (method, path, resp.status, await resp.text())
                return await resp.json()


def llmservice(spec: dict) -> dict:
    return {"apiVersion": "pagedkube.io/v1alpha1", "kind": "LLMService",
            "metadata": {"name": "demo", "namespace": NS}, "spec": spec}


def obj(cluster: ClusterEmulator, resource: str, name: str, namespace: str | None = NS) -> dict | None:
    key = (kmock.resource(resource), namespace, name)
    return None if key not in cluster.objects or cluster.objects[key].deleted else cluster.objects[key].raw


def children_in(cluster: ClusterEmulator) -> dict[str, dict]:
    wanted = {kmock.resource(path): kind for kind, path in CHILD_RESOURCES.items()}
    return {f"{wanted[r]}/{name}": o.raw for (r, ns, name), o in cluster.objects.items()
            if r in wanted and not o.deleted}


async def until(check: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    for _ in range(int(timeout / 0.05)):
        if result := check():
            return result
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for: {what}")


def condition(cluster: ClusterEmulator, type_: str) -> tuple[str, str] | None:
    body = obj(cluster, LLMSERVICE, "demo") or {}
    for c in (body.get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return c["status"], c["reason"]
    return None


def events(cluster: ClusterEmulator) -> list[tuple[str, str]]:
    return [(o.raw["reason"], o.raw["message"]) for (r, ns, name), o in cluster.objects.items()
            if r == kmock.resource("v1/events") and not o.deleted]


SPEC = {"model": {"source": "builtin://tiny"}, "replicas": 2}


async def test_create_makes_every_child_owned_and_reports_status(operator: ClusterEmulator) -> None:
    user = User(operator)
    created = await user.call("POST", f"/apis/pagedkube.io/v1alpha1/namespaces/{NS}/llmservices", llmservice(SPEC),
                              content_type="application/json")
    uid = created["metadata"]["uid"]
    await until(lambda: len(children_in(operator)) == ALL_CHILDREN, "every child")
    live = children_in(operator)
    svc = LLMServiceSpec.from_body({**llmservice(SPEC), "metadata": {**created["metadata"]}})
    for child in build_children(svc, with_service_monitor=True):
        key = f"{child['kind']}/{child['metadata']['name']}"
        assert is_subset(child, live[key]), key
        assert live[key]["metadata"]["ownerReferences"][0]["uid"] == uid
    assert obj(operator, "apps/v1/deployments", "demo-engine")["spec"]["replicas"] == 2

    status = await until(lambda: (obj(operator, LLMSERVICE, "demo") or {}).get("status", {}).get("conditions")
                         and obj(operator, LLMSERVICE, "demo")["status"], "status")
    assert status["selector"] == naming.engine_selector("demo")
    assert status["url"] == "http://demo.team-a.svc.cluster.local"
    assert condition(operator, "Ready") == ("False", "EnginesStarting")
    await until(lambda: ("Created", "Deployment demo-engine") in events(operator), "a Created event")

    # The Deployment controller reports one ready engine: status follows.
    await user.call("PATCH", api_path("apps/v1", "Deployment", NS, "demo-engine") + "/status", {"status": {
        "observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 1}})
    await until(lambda: condition(operator, "Ready") == ("True", "EnginesReady"), "Ready=True")
    assert condition(operator, "Progressing") == ("True", "RollingOut")
    assert obj(operator, LLMSERVICE, "demo")["status"]["readyReplicas"] == 1

    # An engine pod starts crash-looping: Degraded says so, with the pod's name.
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "demo-engine-abc", "namespace": NS, "labels": naming.labels("demo", "engine")},
        "status": {"containerStatuses": [{"name": "engine", "restartCount": 4, "state": {"waiting": {
            "reason": "CrashLoopBackOff"}}, "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}}
    await user.call("POST", f"/api/v1/namespaces/{NS}/pods", pod, content_type="application/json")
    await until(lambda: condition(operator, "Degraded") == ("True", "CrashLooping"), "Degraded=CrashLooping")
    await until(lambda: any(r == "CrashLooping" and "demo-engine-abc" in m for r, m in events(operator)),
                "a CrashLooping event")


@pytest.mark.parametrize("with_prometheus", [False])
async def test_no_service_monitor_without_the_prometheus_operator(operator: ClusterEmulator) -> None:
    await User(operator).call("POST", f"/apis/pagedkube.io/v1alpha1/namespaces/{NS}/llmservices", llmservice(SPEC),
                              content_type="application/json")
    # kopf records the handled spec once the create handler has finished (all children applied).
    await until(lambda: "pagedkube.io/last-handled-configuration" in
                (obj(operator, LLMSERVICE, "demo")["metadata"].get("annotations") or {}), "creation handled")
    assert sorted(children_in(operator)) == [
        "Deployment/demo-engine", "Deployment/demo-gateway", "Lease/demo-autoscaler", "NetworkPolicy/demo-engine",
        "PodDisruptionBudget/demo-engine", "Role/demo-gateway", "RoleBinding/demo-gateway", "Secret/demo-api-key", "Secret/demo-engine-secret", "Service/demo", "Service/demo-engine", "ServiceAccount/demo-gateway"]


async def test_spec_change_updates_and_drift_is_put_back(operator: ClusterEmulator) -> None:
    user = User(operator)
    base = f"/apis/pagedkube.io/v1alpha1/namespaces/{NS}/llmservices"
    await user.call("POST", base, llmservice(SPEC), content_type="application/json")
    await until(lambda: len(children_in(operator)) == ALL_CHILDREN, "every child")

    # `kubectl scale llms demo --replicas 4` (what the autoscaler does, through /scale).
    await user.call("PATCH", f"{base}/demo", {"spec": {"replicas": 4, "engine": {"maxNumSeqs": 64}}})
    await until(lambda: obj(operator, "apps/v1/deployments", "demo-engine")["spec"]["replicas"] == 4, "replicas 4")
    args = obj(operator, "apps/v1/deployments", "demo-engine")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--max-num-seqs") + 1] == "64"

    # Monitoring switched off: the ServiceMonitor goes (the one child the operator deletes itself).
    await user.call("PATCH", f"{base}/demo", {"spec": {"monitoring": {"enabled": False}}})
    await until(lambda: obj(operator, "monitoring.coreos.com/v1/servicemonitors", "demo") is None, "no monitor")
    await until(lambda: ("Deleted", "ServiceMonitor demo") in events(operator), "a Deleted event")
    # So does the NetworkPolicy when it is switched off.
    await user.call("PATCH", f"{base}/demo", {"spec": {"networkPolicy": {"enabled": False}}})
    await until(lambda: obj(operator, "networking.k8s.io/v1/networkpolicies", "demo-engine") is None, "no policy")
    await until(lambda: ("Deleted", "NetworkPolicy demo-engine") in events(operator), "its Deleted event")

    # Someone deletes the gateway Service: it comes back.
    await user.call("DELETE", api_path("v1", "Service", NS, "demo"))
    await until(lambda: obj(operator, "v1/services", "demo") is not None, "the Service back")
    await until(lambda: ("Restored", "Service demo was deleted; re-applied") in events(operator), "Restored event")

    # Someone edits the engine Deployment's image: the operator's value is put back.
    edited = copy.deepcopy(obj(operator, "apps/v1/deployments", "demo-engine")["spec"]["template"])
    edited["spec"]["containers"][0]["image"] = "evil:latest"
    await user.call("PATCH", api_path("apps/v1", "Deployment", NS, "demo-engine"), {"spec": {"template": edited}})
    await until(lambda: obj(operator, "apps/v1/deployments", "demo-engine")["spec"]["template"]["spec"]
                ["containers"][0]["image"] == naming.ENGINE_IMAGE, "the image put back")


async def test_adapter_edits_reach_the_config_map_not_the_engine_pods(operator: ClusterEmulator) -> None:
    """spec.adapters gains one and loses one: the operator rewrites the ConfigMap the engines follow
    (builders/adapters.py) and leaves the engine Deployment, so no pod restarts."""
    user = User(operator)
    base = f"/apis/pagedkube.io/v1alpha1/namespaces/{NS}/llmservices"
    vet, cats, diet = ({"name": n, "source": f"clinic/{n}-lora"} for n in ("vet", "cats", "diet"))
    await user.call("POST", base, llmservice({**SPEC, "adapters": [vet, cats]}), content_type="application/json")

    def listed() -> list[str] | None:
        cm = obj(operator, "v1/configmaps", "demo-adapters")
        return [m["name"] for m in json.loads(cm["data"]["lora-modules.json"])] if cm else None

    await until(lambda: listed() == ["vet", "cats"], "the ConfigMap with vet and cats")
    await until(lambda: obj(operator, "apps/v1/deployments", "demo-engine"), "the engine Deployment")
    engine = copy.deepcopy(obj(operator, "apps/v1/deployments", "demo-engine"))
    assert "--lora-modules-file" in engine["spec"]["template"]["spec"]["containers"][0]["args"]

    await user.call("PATCH", f"{base}/demo", {"spec": {"adapters": [cats, diet]}})
    await until(lambda: listed() == ["cats", "diet"], "the ConfigMap with cats and diet")
    await until(lambda: ("Updated", "ConfigMap demo-adapters") in events(operator), "its Updated event")
    now = obj(operator, "apps/v1/deployments", "demo-engine")
    assert now["metadata"]["generation"] == engine["metadata"]["generation"]
    assert now["spec"]["template"] == engine["spec"]["template"]
    assert ("Updated", "Deployment demo-engine") not in events(operator)

    # Someone edits the list by hand: the spec's is put back.
    await user.call("PATCH", api_path("v1", "ConfigMap", NS, "demo-adapters"), {"data": {"lora-modules.json": "[]"}})
    await until(lambda: listed() == ["cats", "diet"], "the list put back")


@pytest.mark.parametrize("resync_interval", [0.3])
async def test_resync_restores_unwatched_children(operator: ClusterEmulator) -> None:
    """ServiceMonitors are not watched (their CRD may come and go); the periodic resync puts them back."""
    user = User(operator)
    await user.call("POST", f"/apis/pagedkube.io/v1alpha1/namespaces/{NS}/llmservices", llmservice(SPEC),
                    content_type="application/json")
    await until(lambda: len(children_in(operator)) == ALL_CHILDREN, "every child")
    await user.call("DELETE", api_path("monitoring.coreos.com/v1", "ServiceMonitor", NS, "demo"))
    # (No check that it is gone: with a 0.3 s resync it may already be back; the Restored Event
    # below says it was deleted and re-applied.)
    await until(lambda: obj(operator, "monitoring.coreos.com/v1/servicemonitors", "demo") is not None,
                "the ServiceMonitor back")
    await until(lambda: ("Restored", "ServiceMonitor demo was deleted; re-applied") in events(operator),
                "a Restored event")


async def test_invalid_spec_is_reported_not_applied(operator: ClusterEmulator) -> None:
    user = User(operator)
    bad = llmservice({"model": {"source": "builtin://tiny"}, "engine": {"runtime": "vllm"}})
    await user.call("POST", f"/apis/pagedkube.io/v1alpha1/namespaces/{NS}/llmservices", bad,
                    content_type="application/json")
    await until(lambda: condition(operator, "Degraded") == ("True", "InvalidSpec"), "Degraded=InvalidSpec")
    assert condition(operator, "Ready") == ("False", "InvalidSpec")
    assert children_in(operator) == {}
    await until(lambda: any(r == "InvalidSpec" and "vllm" in m for r, m in events(operator)), "InvalidSpec event")
    assert [r for r, _ in events(operator)] == ["InvalidSpec"]  # one Event, not one per condition


async def test_deletion_leaves_nothing_behind_and_rbac_covers_every_call(operator: ClusterEmulator) -> None:
    user = User(operator)
    base = f"/apis/pagedkube.io/v1alpha1/namespaces/{NS}/llmservices"
    await user.call("POST", base, llmservice(SPEC), content_type="application/json")
    await until(lambda: len(children_in(operator)) == ALL_CHILDREN, "every child")
    # No finalizer: deleting an LLMService never waits for the operator to be up.
    assert not obj(operator, LLMSERVICE, "demo")["metadata"].get("finalizers")
    await user.call("DELETE", f"{base}/demo")
    await until(lambda: obj(operator, LLMSERVICE, "demo") is None, "the LLMService gone")
    await until(lambda: children_in(operator) == {}, "no children")
    await asyncio.sleep(1.0)  # give a wrongly re-creating operator the chance to show itself
    assert children_in(operator) == {}

    allowed = {(g, r, v) for rule in operator_rules() for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}
    assert not any("*" in x for rule in operator_rules() for x in rule["verbs"] + rule["resources"])
    used = set()
    for request in operator:
        if request.resource is None or request.resource.plural is None or request.action is None \
                or request.headers.get("User-Agent") == TEST_AGENT:
            continue  # discovery (allowed to every user by system:discovery) and the test's own calls
        resource = request.resource.plural + (f"/{request.subresource}" if request.subresource else "")
        verb = {"LIST": "list", "WATCH": "watch", "FETCH": "get", "CREATE": "create", "UPDATE": "patch",
                "DELETE": "delete"}[request.action.name]
        used.add((request.resource.group, resource, verb))
        if request.headers.get("Content-Type", "").startswith("application/apply-patch"):
            used.add((request.resource.group, resource, "create"))  # apply may create
    assert used - allowed == set()
    assert ("apps", "deployments", "patch") in used and ("", "events", "create") in used


async def test_pagedkube_operator_command_runs_against_a_kubeconfig(cluster: ClusterEmulator, tmp_path: Path) -> None:
    """The real `pagedkube operator` process: kubeconfig login, liveness endpoint, children made."""
    import socket
    import subprocess
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        health_port = s.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: k, cluster: {{server: '{str(cluster.url).rstrip('/')}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n")
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("KUBERNETES_")}
    env["KUBECONFIG"] = str(kubeconfig)
    proc = await asyncio.create_subprocess_exec(
        # --all-namespaces: kmock 0.8 cannot parse GET /api/v1/namespaces, which kopf lists for --namespace.
        sys.executable, "-m", "pagedkube", "operator", "--all-namespaces", "--standalone",
        "--liveness", f"http://127.0.0.1:{health_port}/healthz", env=env,
        stdout=subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        async def healthy() -> bool:
            try:
                async with aiohttp.ClientSession() as session:
                    async with session.get(f"http://127.0.0.1:{health_port}/healthz") as resp:
                        return resp.status == 200
            except aiohttp.ClientError:
                return False
        for _ in range(400):
            if proc.returncode is not None or await healthy():
                break
            await asyncio.sleep(0.1)
        assert proc.returncode is None and await healthy()
        await User(cluster).call("POST", f"/apis/pagedkube.io/v1alpha1/namespaces/{NS}/llmservices",
                                 llmservice(SPEC), content_type="application/json")
        await until(lambda: len(children_in(cluster)) == ALL_CHILDREN, "every child from the CLI operator", timeout=40)
    finally:
        proc.terminate()
        _, stderr = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode in (0, -15), stderr.decode()[-2000:]


async def test_a_stale_event_for_a_deleted_llmservice_applies_nothing(cluster: ClusterEmulator) -> None:
    """kopf may still hold an event from before a deletion; reconciling it must not re-create children."""
    user = User(cluster)
    base = f"/apis/pagedkube.io/v1alpha1/namespaces/{NS}/llmservices"
    stale = await user.call("POST", base, llmservice(SPEC), content_type="application/json")
    await user.call("DELETE", f"{base}/demo")
    kube = Kube(kubernetes.client.ApiClient(kubernetes.client.Configuration(host=str(cluster.url).rstrip("/"))))
    emitted: list = []
    reconciler = Reconciler(kube=kube, emit=lambda *args: emitted.append(args))
    assert await asyncio.to_thread(reconciler.reconcile, stale) == {}
    applies = [r for r in cluster if r.headers.get("Content-Type", "").startswith("application/apply-patch")]
    assert applies == [] and emitted == [] and children_in(cluster) == {}


async def test_the_engine_secret_is_made_once_never_rotated_and_remade_if_deleted(cluster: ClusterEmulator) -> None:
    """The Reconciler (no kopf) against the emulator: a random key and seed the first time,
    the same Secret on every later reconcile (spec changes included), and a deleted one made
    anew with new values, which rolls both Deployments (their pod-template annotation)."""
    user = User(cluster)
    base = f"/apis/pagedkube.io/v1alpha1/namespaces/{NS}/llmservices"
    body = await user.call("POST", base, llmservice(SPEC), content_type="application/json")
    kube = Kube(kubernetes.client.ApiClient(kubernetes.client.Configuration(host=str(cluster.url).rstrip("/"))))
    tokens = iter(f"token-{i}" for i in range(100))
    reconciler = Reconciler(kube=kube, emit=lambda *args: None, token=lambda: next(tokens))

    def secret() -> dict:
        return {k: base64.b64decode(v).decode() for k, v in obj(cluster, "v1/secrets", "demo-engine-secret")
                ["data"].items()}

    def annotation(deployment: str) -> str:
        return obj(cluster, "apps/v1/deployments", deployment)["spec"]["template"]["metadata"]["annotations"][
            SECRET_VERSION_ANNOTATION]

    await asyncio.to_thread(reconciler.reconcile, body)
    assert secret() == {"api-key": "token-0", "hash-seed": "token-1"}
    # Closed by default: the gateway's client key, made the same way, for the user to read.
    client = obj(cluster, "v1/secrets", "demo-api-key")["data"]
    assert base64.b64decode(client["api-key"]).decode() == "token-2"
    owner = obj(cluster, "v1/secrets", "demo-engine-secret")["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"]) == ("LLMService", body["metadata"]["uid"])
    first = annotation("demo-engine")
    assert first == annotation("demo-gateway")
    body = await user.call("PATCH", f"{base}/demo", {"spec": {"replicas": 3, "engine": {
        "apiKeySecretRef": {"name": "mine"}}}})
    await asyncio.to_thread(reconciler.reconcile, body)
    assert secret() == {"api-key": "token-0", "hash-seed": "token-1"}   # not rotated
    assert annotation("demo-engine") == first
    await user.call("DELETE", api_path("v1", "Secret", NS, "demo-engine-secret"))
    await asyncio.to_thread(reconciler.reconcile, body)
    # Every reconcile offers new values in a create (the operator never reads Secrets); only a
    # missing Secret takes them: token-3..5 were refused (409), token-6 and 7 made this one.
    assert secret() == {"api-key": "token-6", "hash-seed": "token-7"}
    assert annotation("demo-engine") == annotation("demo-gateway") != first
