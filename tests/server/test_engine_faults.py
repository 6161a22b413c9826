"""A failing engine step fails the requests in flight, and only them: the loop goes on.

The engine is the real LLMEngine (built-in model) with one fault injected: step()
raises while a request whose stop strings include FAIL_MARK is running. The app
runs in this process under a real uvicorn server on a free port.
"""
from __future__ import annotations

import threading

import httpx
import pytest
import uvicorn

from pagedkube.engine.server.app import create_app
from pagedkube.engine.server.config import ServerConfig

from fault_engine import FAIL_MARK, faulty_engine  # tests/ is on sys.path: the spawned engine core imports it too

from .conftest import free_port, wait_until


@pytest.fixture(scope="module")
def app_url():
    port = free_port()
    app = create_app(ServerConfig(port=port), engine_factory=faulty_engine)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: server.started, timeout=240)
    yield url, app
    server.should_exit = True
    thread.join(30)


def test_step_failure_fails_only_requests_in_flight(app_url):
    url, app = app_url
    ok = {"prompt": "Can dogs eat apples?", "max_tokens": 5, "temperature": 0}
    with httpx.Client(base_url=url, timeout=60) as c:
        before = c.post("/v1/completions", json=ok).json()["choices"][0]["text"]
        r = c.post("/v1/completions", json={**ok, "stop": [FAIL_MARK]})
        assert r.status_code == 500
        assert "injected fault" in r.json()["error"]["message"]
        with c.stream("POST", "/v1/completions", json={**ok, "stop": [FAIL_MARK], "stream": True}) as s:
            lines = [line for line in s.iter_lines() if line]
        assert lines == [lines[0]] and "injected fault" in lines[0]   # the error event, and no [DONE] after it
        # The engine loop survived, the failed requests' blocks are back, answers are unchanged.
        assert c.post("/v1/completions", json=ok).json()["choices"][0]["text"] == before
        assert c.get("/health").status_code == 200 and c.get("/ready").status_code == 200
        stats, _ = app.state.server.engine.stats()
        assert stats.num_free_blocks == stats.num_kv_blocks and stats.num_running == 0


def test_repeated_step_failures_mark_the_engine_unhealthy(app_url):
    url, app = app_url
    with httpx.Client(base_url=url, timeout=60) as c:
        for _ in range(3):
            c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "stop": [FAIL_MARK]})
        # Three failed steps in a row (each request fails on its first step): liveness
        # fails so that an orchestrator restarts the process, and no new work is taken.
        assert c.get("/health").status_code == 500
        assert c.get("/ready").status_code == 503
        assert c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 503
