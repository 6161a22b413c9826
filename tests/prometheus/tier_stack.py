"""The processes of the Prometheus tier: `pagedkube up --autoscale` and a real
Prometheus scraping it, both on loopback, both stopped by the fixtures.

Scrape targets come from Prometheus' file-based service discovery: a thread
reads the engines' URLs off `pagedkube up`'s status lines as the autoscaler
starts and stops them and rewrites one file_sd JSON file (Prometheus watches it
with inotify). Each target gets the labels a Prometheus Operator scrape of an
LLMService named `pagedkube` would attach (namespace, service, pod: the engine
Service is NAME-engine, the gateway's is NAME), so the dashboards' variables
resolve exactly as in a cluster. A static scrape config cannot follow engines
the autoscaler starts on free ports; relabeling would need a discovery source
that knows the pods, which locally is this file.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
import up_process
from up_process import free_port

ROOT = Path(__file__).resolve().parents[2]
REPORT_KEY = pytest.StashKey[dict]()   # the dashboards test's report, printed at the end of the run
NAMESPACE = "pagedkube-test"
SERVICE = "pagedkube"                 # the LLMService name: gateway Service NAME, engine Service NAME-engine
SCRAPE_INTERVAL_S = 1.0               # fine enough for a two-minute run; Grafana's data source is told the same
START_TIMEOUT_S = 240                 # engines importing torch on a shared 2-core machine
_ENGINE_STATE = re.compile(r"^status +\| (engine-\d+) +(\w+) +(http://\S+)", re.M)


class Up(up_process.Up):
    """`pagedkube up` as a user runs it, its output in a file (tests/helpers/up_process.py), and
    the engines its status lines name."""

    def engines(self) -> dict[str, tuple[str, str]]:
        """engine name -> (latest state, URL), from the status lines."""
        out: dict[str, tuple[str, str]] = {}
        for name, state, url in _ENGINE_STATE.findall(self.text()):
            out[name] = (state, url)
        return out


class FileDiscovery(threading.Thread):
    """Keeps Prometheus' file_sd targets equal to the gateway plus the live engines."""

    def __init__(self, up: Up, path: Path, period: float = 0.5):
        super().__init__(daemon=True, name="file_sd")
        self.up, self.path, self.period = up, path, period
        self.stopped = threading.Event()
        self.write()

    def groups(self) -> list[dict]:
        groups = [{"targets": [f"127.0.0.1:{self.up.port}"],
                   "labels": {"namespace": NAMESPACE, "service": SERVICE, "pod": "gateway-0"}}]
        for name, (state, url) in sorted(self.up.engines().items()):
            if state in ("loading", "ready", "draining"):
                groups.append({"targets": [url.removeprefix("http://")],
                               "labels": {"namespace": NAMESPACE, "service": f"{SERVICE}-engine", "pod": name}})
        return groups

    def write(self) -> None:
        text = json.dumps(self.groups(), indent=1)
        if not self.path.exists() or self.path.read_text() != text:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.rename(self.path)   # atomic: Prometheus never reads half a file

    def run(self) -> None:
        while not self.stopped.wait(self.period):
            self.write()


class PrometheusServer:
    def __init__(self, binary: str, tmp: Path, sd_file: Path, rules: Path | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {"global": {"scrape_interval": f"{SCRAPE_INTERVAL_S:g}s",
                             "evaluation_interval": f"{SCRAPE_INTERVAL_S:g}s"},
                  "scrape_configs": [{"job_name": "pagedkube", "file_sd_configs": [{"files": [str(sd_file)]}]}]}
        if rules is not None:
            config["rule_files"] = [str(rules)]
        (tmp / "prometheus.yml").write_text(json.dumps(config))   # JSON is YAML
        self.log = open(tmp / "prometheus.log", "w")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (tmp / "prometheus.log").read_text()[-3000:]
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError("prometheus did not become ready:\n" + (tmp / "prometheus.log").read_text()[-3000:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()
