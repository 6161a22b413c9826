"""The e2e tier: a real control plane (e2e/cluster/cluster.sh) for the whole session.

Built binaries are cached per version (e2e/cluster/build.sh); without a Go
toolchain they cannot be built and every e2e test is skipped with that reason.
The cluster and every process a test starts are stopped at the end, also when
a test fails.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib: make kubeutil importable
from kubeutil import ROOT, Kube, Processes, free_port, load_module, wait_for  # noqa: E402

CLUSTER = ROOT / "e2e" / "cluster"
BUILD_TIMEOUT_S = 90 * 60


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """pytest-timeout limits each test function, not the fixtures: a first `pytest e2e`
    on a fresh machine builds the binaries inside the session fixture (up to
    BUILD_TIMEOUT_S, enforced by subprocess)."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(600, func_only=True))


@pytest.fixture(scope="session")
def binaries() -> ModuleType:
    return load_module(ROOT / "tests" / "tools" / "binaries.py", "_pagedkube_e2e_binaries")


@pytest.fixture(scope="session")
def k8s_bin() -> Path:
    if shutil.which("go") is None:
        pytest.skip("e2e: no Go toolchain on this machine, so kube-apiserver, etcd and kwok cannot be "
                    "built (install Go >= 1.25; see README, End-to-end tests)")
    p = subprocess.run([str(CLUSTER / "build.sh")], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert p.returncode == 0, f"e2e/cluster/build.sh failed:\n{p.stderr[-8000:]}"
    return Path(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest, k8s_bin: Path) -> Path:
    """Starts the cluster (idempotent) and registers its stop before anything can fail.
    PAGEDKUBE_E2E_KUBECONFIG=PATH uses a running cluster instead (left running)."""
    if os.environ.get("PAGEDKUBE_E2E_KUBECONFIG"):
        return Path(os.environ["PAGEDKUBE_E2E_KUBECONFIG"])
    env = {**os.environ, "PYTHON": sys.executable}

    def down() -> None:
        subprocess.run([str(CLUSTER / "cluster.sh"), "down"], timeout=300, check=False, env=env)
    request.addfinalizer(down)
    p = subprocess.run([str(CLUSTER / "cluster.sh"), "up"], capture_output=True, text=True, timeout=900, env=env)
    assert p.returncode == 0, f"cluster.sh up failed:\n{p.stderr[-8000:]}"
    return Path(p.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def kube(cluster: Path, binaries: ModuleType) -> Kube:
    return Kube(binaries.kubectl_path(), cluster)


@pytest.fixture(scope="session")
def processes(tmp_path_factory: pytest.TempPathFactory) -> Processes:
    procs = Processes(tmp_path_factory.mktemp("logs"))
    yield procs
    procs.close()


@pytest.fixture(scope="session")
def installed(kube: Kube) -> Kube:
    """manifests/install.yaml applied: namespace, CRD (Established), RBAC, operator Deployment."""
    kube.apply(ROOT / "manifests" / "install.yaml")
    kube.run("wait", "--for", "condition=Established", "crd/llmservices.pagedkube.io", "--timeout", "60s")
    return kube


@pytest.fixture(scope="session")
def operator(installed: Kube, processes: Processes, tmp_path_factory: pytest.TempPathFactory):
    """`pagedkube operator` as a process holding only its own ServiceAccount's token
    (install.yaml's pagedkube-operator), so a verb missing from its ClusterRole fails."""
    home = tmp_path_factory.mktemp("operator-home")
    kubeconfig = installed.token_kubeconfig("pagedkube-system", "pagedkube-operator", home / "kubeconfig")
    port = free_port()
    p = processes.start("operator", [str(Path(sys.executable).parent / "pagedkube"), "operator",
                                     "--all-namespaces", "--standalone", "--resync-interval", "20",
                                     "--liveness", f"http://127.0.0.1:{port}/healthz"],
                        env={"KUBECONFIG": str(kubeconfig), "HOME": str(home)})

    def alive() -> bool:
        assert p.poll() is None, f"operator exited {p.returncode}:\n{processes.log(p)[-6000:]}"
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False
    wait_for(alive, "the operator's liveness endpoint", timeout=120)
    return OperatorProcess(p, kubeconfig, processes)


class OperatorProcess:
    def __init__(self, proc, kubeconfig: Path, processes: Processes):
        self.proc = proc
        self.kubeconfig = kubeconfig
        self.processes = processes

    def log(self) -> str:
        return self.processes.log(self.proc)
