"""Helpers for the e2e tests: kubectl against the real cluster, polling, processes.

A plain module (e2e/ is no package; pytest puts this directory on sys.path).
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import yaml

ROOT = Path(__file__).resolve().parents[1]
# The cluster's pinned versions (K8S_VERSION, CONTAINERD_VERSION, ...): e2e/cluster/versions.env.
VERSIONS = dict(line.split("=", 1) for line in (ROOT / "e2e" / "cluster" / "versions.env").read_text().splitlines()
                if line and not line.startswith("#"))


def load_module(path: Path, name: str) -> ModuleType:
    """Loads a plain helper module by path, once (neither tests/ nor e2e/ is a package)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class Kube:
    """kubectl with one kubeconfig. `run` returns the CompletedProcess; `json` parses -o json."""

    def __init__(self, kubectl: Path, kubeconfig: Path):
        self.kubectl = kubectl
        self.kubeconfig = kubeconfig

    def run(self, *args: str, input: str | None = None, check: bool = True,
            timeout: float = 120) -> subprocess.CompletedProcess:
        cmd = [str(self.kubectl), "--kubeconfig", str(self.kubeconfig), *args]
        p = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
        return p

    def json(self, *args: str) -> dict:
        return json.loads(self.run(*args, "-o", "json").stdout)

    def get(self, kind: str, name: str, namespace: str) -> dict | None:
        p = self.run("get", kind, name, "-n", namespace, "-o", "json", check=False)
        if p.returncode != 0:
            if "NotFound" in p.stderr or "not found" in p.stderr:
                return None
            raise AssertionError(f"get {kind} {name}: {p.stderr}")
        return json.loads(p.stdout)

    def apply(self, obj: dict | str | Path, namespace: str | None = None,
              check: bool = True) -> subprocess.CompletedProcess:
        ns = ["-n", namespace] if namespace else []
        if isinstance(obj, Path):
            return self.run("apply", *ns, "-f", str(obj), check=check)
        text = obj if isinstance(obj, str) else yaml.safe_dump(obj)
        return self.run("apply", *ns, "-f", "-", input=text, check=check)

    def server_and_ca(self) -> tuple[str, str]:
        cfg = self.json("config", "view", "--raw", "--minify", "--flatten")
        cluster = cfg["clusters"][0]["cluster"]
        return cluster["server"], cluster["certificate-authority-data"]

    def token_kubeconfig(self, namespace: str, service_account: str, path: Path) -> Path:
        """A kubeconfig holding only a TokenRequest token for the ServiceAccount
        (so the holder has exactly that account's RBAC, not the admin's)."""
        token = self.run("create", "token", service_account, "-n", namespace, "--duration", "2h").stdout.strip()
        server, ca = self.server_and_ca()
        cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "sa",
               "clusters": [{"name": "e2e", "cluster": {"server": server, "certificate-authority-data": ca}}],
               "users": [{"name": service_account, "user": {"token": token}}],
               "contexts": [{"name": "sa", "context": {"cluster": "e2e", "user": service_account,
                                                        "namespace": namespace}}]}
        path.write_text(yaml.safe_dump(cfg))
        path.chmod(0o600)
        return path


def wait_for(check: Callable[[], Any], what: str, timeout: float = 120, interval: float = 0.5) -> Any:
    """Polls `check` until it returns something truthy; fails with the last value
    (a deadline for a hang, not a speed assertion)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Processes:
    """Starts processes in their own sessions and stops each (its group) on close."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.started: list[tuple[subprocess.Popen, Path]] = []

    def start(self, name: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = self.log_dir / f"{name}.log"
        with log.open("wb") as out:
            p = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        self.started.append((p, log))
        return p

    def log(self, p: subprocess.Popen) -> str:
        return next(log.read_text(errors="replace") for q, log in self.started if q is p)

    def stop(self, p: subprocess.Popen) -> None:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)

    def close(self) -> None:
        for p, _ in reversed(self.started):
            self.stop(p)
