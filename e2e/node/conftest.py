"""The real-node tier (`make test-node`): the same control plane as the e2e tier
plus a real node (e2e/cluster/node.sh: kubelet, kube-proxy, containerd, runc, CNI
bridge) whose image store holds the engine and gateway images built from our
Dockerfiles (e2e/cluster/images.sh). Every pod here really runs: the chart's
operator pod, the engines, the gateway.

The kwok nodes stay, tainted NoSchedule, so everything lands on the real node.
Needs root and Debian's runc, containernetworking-plugins, iptables,
buildah and debootstrap (the Makefile's node-deps installs them).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib: make nodeutil importable
from kubeutil import ROOT, Kube  # noqa: E402
from nodeutil import CHART_NS, CLUSTER, control_plane_log, node_env, pod_report  # noqa: E402

# A cold engine image build installs torch (~4 GB of wheels) on a shared 2-core machine.
IMAGES_TIMEOUT_S = 75 * 60
NEEDS = ("runc", "buildah", "debootstrap", "iptables")


@pytest.fixture(scope="session")
def images(k8s_bin: Path) -> dict[str, str]:
    """Builds (or finds cached) the pause, gateway and engine images: {name: ref}."""
    if os.geteuid() != 0:
        pytest.skip("the real-node tier needs root (containerd, kubelet, network namespaces)")
    missing = [c for c in NEEDS if shutil.which(c) is None]
    if missing:
        pytest.skip(f"the real-node tier needs {', '.join(missing)} (make node-deps installs them)")
    p = subprocess.run([str(CLUSTER / "images.sh"), "build"], capture_output=True, text=True,
                       timeout=IMAGES_TIMEOUT_S)
    assert p.returncode == 0, f"e2e/cluster/images.sh build failed:\n{p.stderr[-8000:]}"
    return {line.split()[0]: line.split()[2] for line in p.stdout.splitlines() if line.strip()}


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest, images: dict[str, str]) -> Path:
    """Overrides the e2e tier's: the control plane with the real node (cluster.sh up
    with PAGEDKUBE_E2E_NODE=real), stopped at the end of the session."""
    if os.environ.get("PAGEDKUBE_E2E_KUBECONFIG"):
        return Path(os.environ["PAGEDKUBE_E2E_KUBECONFIG"])

    def down() -> None:
        subprocess.run([str(CLUSTER / "cluster.sh"), "down"], timeout=300, check=False, env=node_env())
    request.addfinalizer(down)
    p = subprocess.run([str(CLUSTER / "cluster.sh"), "up"], capture_output=True, text=True, timeout=1800,
                       env=node_env())
    assert p.returncode == 0, f"cluster.sh up failed:\n{p.stderr[-8000:]}"
    return Path(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def chart(kube: Kube, binaries, images: dict[str, str]) -> Kube:
    """`helm install` of charts/pagedkube as the README says, the image never pulled:
    the operator pod runs from the gateway image in the node's store."""
    repo, _, tag = images["gateway"].rpartition(":")
    helm = str(binaries.helm_path())
    p = subprocess.run([helm, "--kubeconfig", str(kube.kubeconfig), "upgrade", "--install", "pagedkube",
                        str(ROOT / "charts" / "pagedkube"), "-n", CHART_NS, "--create-namespace",
                        "--set", f"operator.image.repository={repo}", "--set", f"operator.image.tag={tag}",
                        "--set", "operator.image.pullPolicy=Never", "--wait", "--timeout", "5m"],
                       capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, (f"helm install failed:\n{p.stdout}\n{p.stderr}\n{pod_report(kube, CHART_NS)}\n"
                               f"{control_plane_log('kube-controller-manager')}")
    return kube
