"""The Prometheus tier: one `pagedkube up --autoscale` stack for the session, a
real Prometheus scraping it, an in-process OTLP collector taking its spans, one
scripted load; every dashboard query, the alert rules, the request id and the
traces are checked against them.

Runs with `make test-prometheus` (part of `make test`), which installs Debian's
prometheus package (Prometheus and promtool 2.42) when missing. Without the
binaries the tests that need them skip and say so; the request-id and tracing
tests run anyway.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))   # tier_stack.py, tier_load.py, otlp_collector.py

from tier_load import LoadResult, run_load  # noqa: E402
from otlp_collector import Collector  # noqa: E402
from tier_stack import REPORT_KEY, START_TIMEOUT_S, FileDiscovery, PrometheusServer, Up  # noqa: E402

NO_PROMETHEUS = ("needs prometheus and promtool on PATH: `make test-prometheus` installs them "
                 "(apt-get install prometheus)")
UP_FLAGS = ("--model", "builtin://tiny", "--replicas", "1", "--autoscale", "--min-replicas", "1", "--max-replicas", "2",
            "--target-queue-depth", "1", "--scale-up-window", "0", "--scale-down-window", "4",
            "--autoscale-interval", "0.5", "--max-num-seqs", "2", "--num-kv-blocks", "256", "--max-model-len", "1024",
            "--access-log", "json",
            "--route-headers")   # x-pagedkube-endpoint tells the load when the second engine serves


@dataclass
class Stack:
    up: Up
    collector: Collector
    sd_file: Path
    tmp: Path


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stack")
    collector = Collector()
    # Spans leave each process within 0.2 s of ending (the SDK's default batch delay is 5 s).
    up = Up(tmp, *UP_FLAGS, "--otlp-traces-endpoint", collector.url, env={"OTEL_BSP_SCHEDULE_DELAY": "200"})
    discovery = None
    try:
        up.wait_for(lambda: httpx.get(f"{up.url}/ready", timeout=5).status_code == 200, START_TIMEOUT_S,
                    "the first engine")
        discovery = FileDiscovery(up, tmp / "targets.json")
        discovery.start()
        yield Stack(up, collector, tmp / "targets.json", tmp)
    finally:
        if discovery is not None:
            discovery.stopped.set()
        code = up.stop()
        collector.stop()
        assert code == 0, up.text()[-3000:]


@pytest.fixture(scope="session")
def prometheus_or_none(stack):
    binary = shutil.which("prometheus")
    if binary is None:
        yield None
        return
    server = PrometheusServer(binary, stack.tmp, stack.sd_file)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def loaded(stack, prometheus_or_none) -> LoadResult:
    """The scripted load, once, with Prometheus (when installed) scraping throughout:
    it starts once Prometheus has scraped the gateway and the first engine twice, so
    the first scale-up is seen as a counter increase."""
    if prometheus_or_none is not None:
        def scraped_twice() -> bool:
            r = httpx.get(f"{prometheus_or_none.url}/api/v1/query", timeout=5,
                          params={"query": "count_over_time(up[1m]) >= 2 and up == 1"})
            return {s["metric"].get("pod") for s in r.json()["data"]["result"]} >= {"gateway-0", "engine-0"}

        stack.up.wait_for(scraped_twice, 60, "two scrapes of the gateway and the first engine")
    return run_load(stack.up)


@pytest.fixture(scope="session")
def prometheus(prometheus_or_none):
    if prometheus_or_none is None:
        pytest.skip(NO_PROMETHEUS)
    return prometheus_or_none


@pytest.fixture(scope="session")
def promtool() -> str:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.skip(NO_PROMETHEUS)
    return binary


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    report = config.stash.get(REPORT_KEY, None)
    if not report:
        return
    write = terminalreporter.write_line
    terminalreporter.section("dashboards evaluated through Prometheus")
    write(f"queries evaluated: {report['evaluated']} (panels: {report['panels']}), with data: {report['with_data']}")
    for item in report["allowed_empty"]:
        write(f"allowed empty: {item['dashboard']} / {item['panel']} [{item['ref']}]: {item['reason']}")
    for item in report["missing"]:
        write(f"EMPTY (should have data): {item['dashboard']} / {item['panel']} [{item['ref']}]: {item['expr']}")
    for item in report["errors"]:
        write(f"ERROR: {item['dashboard']} / {item['panel']} [{item['ref']}]: {item['error']}")
    if os.environ.get("PAGEDKUBE_PROMETHEUS_REPORT"):
        Path(os.environ["PAGEDKUBE_PROMETHEUS_REPORT"]).write_text(json.dumps(report, indent=1))
