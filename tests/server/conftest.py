"""Real `pagedkube serve` processes on free ports, for the server tests.

Each server is a subprocess started with the built-in model; a fixture waits
for GET /ready and, at teardown, stops it (SIGTERM, then SIGKILL of its process
group) so that no process outlives the tests.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

MODEL_NAME = "tiny-test"
TEST_MODEL = "builtin://tiny"   # the fast toy; PAGEDKUBE_TEST_MODEL runs the suite on another model
API_KEY = "sk-test-123"
START_TIMEOUT_S = 240   # model load on a busy 2-core CI box


def wait_until(predicate, timeout: float = 60.0, interval: float = 0.05) -> None:
    """Polls until predicate() is true; fails the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {timeout}s")
        time.sleep(interval)


def metric_value(exposition: str, name: str, **labels: str) -> float:
    """The value of one sample in a Prometheus text exposition (parsed by prometheus_client)."""
    from prometheus_client.parser import text_string_to_metric_families
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise KeyError(name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, log_dir: Path, *args: str, name: str = "server", env: dict[str, str] | None = None):
        """env: the whole environment of the server (default: this process's)."""
        self.port = free_port()
        self.env = dict(os.environ if env is None else env)
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = ["--host", "127.0.0.1", "--port", str(self.port), *args]
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> "ServerProcess":
        return self.launch().wait_ready()

    def launch(self) -> "ServerProcess":
        """Starts the process (its own process group) without waiting for it."""
        model = os.environ.get("PAGEDKUBE_TEST_MODEL") or TEST_MODEL
        if "--model" not in self.args:
            self.args += ["--model", model]
        env = {**self.env, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "pagedkube", "serve", *self.args],
                                     stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        return self

    def wait_ready(self) -> "ServerProcess":
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/ready", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"server not ready after {START_TIMEOUT_S}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM (the drain path) and wait; SIGKILL the group if it hangs."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """The main server: default flags, a named model, max_model_len 512."""
    proc = ServerProcess(tmp_path_factory.mktemp("server"), "--served-model-name", MODEL_NAME,
                         "--max-model-len", "512", name="main").start()
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def small_server(tmp_path_factory):
    """A cramped server: 12 KV blocks (eviction), one running and one waiting
    request at most (queue full), and an API key."""
    proc = ServerProcess(tmp_path_factory.mktemp("small"), "--served-model-name", MODEL_NAME,
                         "--num-kv-blocks", "12", "--max-num-seqs", "1", "--max-waiting", "1",
                         "--max-model-len", "160", "--api-key", API_KEY, name="small").start()
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="session")
def offline():
    """The same engine in-process, for token-exact comparisons with the server."""
    from pagedkube.engine import LLM
    return LLM(model=os.environ.get("PAGEDKUBE_TEST_MODEL") or TEST_MODEL, device="cpu", max_model_len=512)
