"""bench/routing.py's processes and probes: engines and gateways as subprocesses, their
readiness, and what their /metrics say (parsed with prometheus_client's parser)."""
from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
MODEL = "tiny"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Procs:
    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, args: list[str]) -> str:
        port = free_port()
        log = open(self.log_dir / f"{name}-{port}.log", "wb")
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
        self.procs.append(subprocess.Popen([sys.executable, *args, "--host", "127.0.0.1", "--port", str(port)],
                                           stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO))
        return f"http://127.0.0.1:{port}"

    def stop_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def wait_ready(urls: list[str], timeout: float = 600, tokenizer: bool = False) -> None:
    deadline = time.monotonic() + timeout
    for url in urls:
        while True:
            try:
                r = httpx.get(url + "/ready", timeout=5)
                if r.status_code == 200 and (not tokenizer or r.json().get("tokenizer")):
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"{url} not ready after {timeout} s")
            time.sleep(0.5)


def _samples(url: str):
    text = httpx.get(url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        yield from family.samples


def scrape(url: str, *names: str) -> dict[str, float]:
    """The sum over labels of each named sample (a counter's name with its `_total`)."""
    out = dict.fromkeys(names, 0.0)
    for sample in _samples(url):
        if sample.name in out:
            out[sample.name] += sample.value
    return out


def in_flight(gateway: str) -> dict[str, float]:
    """The gateway's in-flight count per engine; key "others": the sum of the
    other-replica load it believes in (0 with one gateway, up to scrape lag)."""
    loads, others = {}, 0.0
    for sample in _samples(gateway):
        if sample.name == "pagedkube_gateway_endpoint_in_flight":
            loads[sample.labels["endpoint"]] = sample.value
        elif sample.name == "pagedkube_gateway_endpoint_other_requests":
            others += sample.value
    return {"loads": loads, "others": others}


def decisions(gateway: str) -> dict[str, float]:
    """The gateway's routing decisions so far, by reason."""
    return {sample.labels["reason"]: sample.value for sample in _samples(gateway)
            if sample.name == "pagedkube_gateway_routing_decisions_total"}


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, max(0, math.ceil(q / 100 * len(values)) - 1))]
