"""The gateway as a process holding its own ServiceAccount's token (the operator's
NAME-gateway Role): it discovers the engines from the real EndpointSlices, takes
the autoscaler Lease, and the API server accepts its scale-subresource write."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest

from kubeutil import Kube, Processes, free_port, wait_for

NS = "e2e-gateway"
NAME = "gw"


@pytest.fixture(scope="module")
def service(installed: Kube, operator) -> Kube:
    installed.run("create", "namespace", NS, check=False)
    installed.apply({"apiVersion": "pagedkube.io/v1alpha1", "kind": "LLMService",
                     "metadata": {"name": NAME, "namespace": NS},
                     "spec": {"model": {"source": "builtin://tiny"}, "replicas": 2,
                              "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 4}}})
    wait_for(lambda: (installed.get("llms", NAME, NS) or {}).get("status", {}).get("readyReplicas") == 2,
             "LLMService gw with 2 ready engines", timeout=180)
    yield installed
    installed.run("delete", "namespace", NS, "--wait=false", check=False)


@pytest.fixture(scope="module")
def gateway(service: Kube, processes: Processes, tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("gateway-home")
    kubeconfig = service.token_kubeconfig(NS, f"{NAME}-gateway", home / "kubeconfig")
    port = free_port()
    # --min-replicas 3 (above the 2 running): the autoscaler's first decision must scale up.
    p = processes.start("gateway", [str(Path(sys.executable).parent / "pagedkube"), "gateway",
                                    "--kube-service", f"{NAME}-engine", "--namespace", NS,
                                    "--host", "127.0.0.1", "--port", str(port),
                                    "--autoscale", "--llmservice", NAME, "--min-replicas", "3",
                                    "--max-replicas", "4", "--autoscale-interval", "1"],
                        env={"KUBECONFIG": str(kubeconfig), "HOME": str(home), "POD_NAME": "e2e-gateway-0"})
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert p.poll() is None, f"gateway exited {p.returncode}:\n{processes.log(p)[-6000:]}"
        try:
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False
    wait_for(up, "the gateway's /health", timeout=120)
    return url, p, processes


def engine_pod_urls(kube: Kube) -> set[str]:
    """Addresses of the engine endpoints that are ready and not terminating."""
    slices = kube.json("get", "endpointslices", "-n", NS, "-l", f"kubernetes.io/service-name={NAME}-engine")
    return {f"http://{e['addresses'][0]}:8000" for s in slices["items"] for e in s.get("endpoints") or []
            if (e.get("conditions") or {}).get("ready", True) and not (e.get("conditions") or {}).get("terminating")}


def test_the_gateway_discovers_the_engines_from_endpointslices(service: Kube, gateway) -> None:
    url, p, processes = gateway
    wait_for(lambda: len(engine_pod_urls(service)) >= 2, "two engine addresses in the EndpointSlices")

    # The autoscaler (--min-replicas 3) grows the fleet meanwhile: compare the
    # gateway's ready engines with the EndpointSlices' ready ones sampled together.
    def discovered() -> dict | None:
        body = json.loads(httpx.get(f"{url}/ready", timeout=5).text)
        expected = len(engine_pod_urls(service))
        return body if expected >= 2 and body["endpoints"]["ready"] == expected else None
    body = wait_for(discovered, "the gateway to list the same ready engines as the EndpointSlices", timeout=90)
    assert body["endpoints"]["ready"] >= 2, body
    assert "Forbidden" not in processes.log(p)


def test_the_autoscaler_takes_its_lease_and_writes_the_scale_subresource(service: Kube, gateway) -> None:
    url, p, processes = gateway
    lease = wait_for(lambda: service.get("lease", f"{NAME}-autoscaler", NS), "the autoscaler Lease", timeout=60)
    assert lease["spec"]["holderIdentity"] == "e2e-gateway-0"

    def scaled() -> bool:
        assert p.poll() is None, f"gateway exited:\n{processes.log(p)[-6000:]}"
        return service.json("get", "llms", NAME, "-n", NS)["spec"]["replicas"] >= 3
    wait_for(scaled, f"the autoscaler to scale LLMService {NAME} to its minimum of 3", timeout=60)
    wait_for(lambda: service.json("get", "deployment", f"{NAME}-engine", "-n", NS)["spec"]["replicas"] >= 3,
             "the engine Deployment to follow")
    metrics = httpx.get(f"{url}/metrics", timeout=5).text.splitlines()
    assert 'pagedkube_autoscaler_scale_events_total{direction="up"} 1.0' in metrics
    assert "pagedkube_autoscaler_leader 1.0" in metrics
    assert "pagedkube_autoscaler_desired_replicas 3.0" in metrics
    log = processes.log(p)
    assert "Forbidden" not in log and "autoscaler tick failed" not in log, log[-4000:]
