"""`pagedkube up` as a child process, for the tests that run it as a user does
(tests/gateway/local/test_up_autoscale.py, test_up_restart.py)."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

START_TIMEOUT_S = 240     # engines importing torch on a shared 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Up:
    def __init__(self, tmp_path: Path, *flags: str, model: str | None = "builtin://tiny",
                 env: dict[str, str] | None = None):
        """`model`: the fast toy unless a test names another; None runs `up`'s default model
        (or the one `flags` name). `env`: added to this process's environment."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp_path / "up.log"
        self.log = open(self.log_path, "w")
        model_flags = ("--model", model) if model and "--model" not in flags else ()
        self.proc = subprocess.Popen([sys.executable, "-P", "-m", "pagedkube", "up", "--port", str(self.port),
                                      *model_flags, *flags],
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ, **(env or {})})

    def text(self) -> str:
        return self.log_path.read_text()

    def engine_pids(self) -> dict[str, int]:
        return {m[1]: int(m[2]) for m in re.finditer(r"^(engine-\d+) \| INFO: +Started server process \[(\d+)\]",
                                                      self.text(), re.M)}

    def engine_url(self, name: str = "engine-0") -> str | None:
        """The URL of the engine's latest `ready` status line."""
        found = re.findall(rf"^status +\| {name} +ready +(http://\S+)", self.text(), re.M)
        return found[-1] if found else None

    def metrics(self) -> dict[str, float]:
        """The autoscaler's samples, keyed as the exposition writes them (`name{label="v"}`)."""
        from prometheus_client.parser import text_string_to_metric_families

        out = {}
        for family in text_string_to_metric_families(httpx.get(f"{self.url}/metrics", timeout=10).text):
            for s in family.samples:
                if s.name.startswith("pagedkube_autoscaler_"):
                    labels = ",".join(f'{k}="{v}"' for k, v in s.labels.items())
                    out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return out

    def wait_for(self, predicate, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"pagedkube up exited:\n{self.text()[-3000:]}"
            try:
                value = predicate()
                if value:
                    return value
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"timed out waiting for {what}:\n{self.text()[-4000:]}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(90)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.log.close()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def assert_stopped_cleanly(up: Up, expected_engines: int) -> None:
    pids = up.engine_pids()
    assert up.stop() == 0, up.text()[-3000:]
    assert len(pids) == expected_engines, pids
    assert not [pid for pid in pids.values() if alive(pid)], f"orphan engines: {pids}"
    assert "all stopped" in up.text()


def children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of pid's child processes."""
    out = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append((int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()))
        except (OSError, ValueError):
            pass   # gone meanwhile
    return out
