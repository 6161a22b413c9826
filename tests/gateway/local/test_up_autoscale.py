"""`pagedkube up --autoscale` as a user runs it: real engine processes with the
built-in model, the gateway in the supervisor, short windows set by flags.

* a burst scales 1 -> 2 engines, every request is answered, the new engine
  serves, and after the burst the fleet returns to the minimum;
* scale from zero: held requests are served once the first engine is ready,
  requests beyond the hold bound get 503 + Retry-After;
* SIGTERM stops everything: no engine process outlives `pagedkube up`.
"""
from __future__ import annotations

import asyncio
import re
import signal

import httpx
import pytest
from up_process import START_TIMEOUT_S, Up, assert_stopped_cleanly

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


async def completion(client: httpx.AsyncClient, url: str, i: int, max_tokens: int = 8) -> httpx.Response:
    return await client.post(f"{url}/v1/completions", json={
        "model": "tiny", "prompt": f"My dog number {i} likes to", "max_tokens": max_tokens, "ignore_eos": True})


def test_burst_scales_up_serves_everything_and_returns_to_min(tmp_path):
    up = Up(tmp_path, "--route-headers", "--replicas", "1", "--autoscale", "--min-replicas", "1", "--max-replicas", "2",
            "--target-queue-depth", "1", "--scale-up-window", "0", "--scale-down-window", "4",
            "--autoscale-interval", "0.5", "--max-num-seqs", "1", "--num-kv-blocks", "64", "--max-model-len", "256")
    try:
        up.wait_for(lambda: httpx.get(f"{up.url}/ready", timeout=5).status_code == 200, START_TIMEOUT_S,
                    "the first engine")
        assert up.metrics()["pagedkube_autoscaler_desired_replicas"] == 1

        async def burst() -> list[httpx.Response]:
            answers: list[httpx.Response] = []
            served_by_new = asyncio.Event()
            first = up.engine_pids()  # engine-0 only
            assert list(first) == ["engine-0"]

            async def client(c: int) -> None:
                async with httpx.AsyncClient(timeout=300) as http:
                    i = 0
                    while not served_by_new.is_set():
                        r = await completion(http, up.url, c * 1000 + i)
                        answers.append(r)
                        if r.headers.get("x-pagedkube-endpoint") not in (None, engine0):
                            served_by_new.set()
                        i += 1

            engine0 = re.search(r"engine-0 +ready +(\S+)", up.text())[1]
            await asyncio.wait_for(asyncio.gather(*(client(c) for c in range(6))), START_TIMEOUT_S + 60)
            return answers

        answers = asyncio.run(burst())
        assert answers and all(r.status_code == 200 for r in answers), [(r.status_code, r.text) for r in answers
                                                                         if r.status_code != 200]
        assert all(len(r.json()["choices"][0]["text"]) > 0 for r in answers)
        served_by = {r.headers["x-pagedkube-endpoint"] for r in answers}
        assert len(served_by) == 2
        m = up.metrics()
        assert m['pagedkube_autoscaler_scale_events_total{direction="up"}'] >= 1
        assert "scale up: 1 -> 2 engines" in up.text()
        # the lull: after the 4 s scale-down window, back to one engine (the other drained and stopped)
        up.wait_for(lambda: up.metrics()["pagedkube_autoscaler_ready_replicas"] == 1
                    and re.search(r"engine-\d +stopped", up.text()), 120, "the scale-in")
        m = up.metrics()
        assert m["pagedkube_autoscaler_desired_replicas"] == 1
        assert m['pagedkube_autoscaler_scale_events_total{direction="down"}'] == 1
        assert "scale down: 2 -> 1 engines" in up.text()
        r = httpx.post(f"{up.url}/v1/completions", json={"model": "tiny", "prompt": "Cats", "max_tokens": 4},
                       timeout=120)
        assert r.status_code == 200
    finally:
        assert_stopped_cleanly(up, 2)


def test_scale_from_zero_holds_then_serves_and_bounds_the_queue(tmp_path):
    up = Up(tmp_path, "--replicas", "0", "--autoscale", "--min-replicas", "0", "--max-replicas", "1",
            "--max-held", "2", "--hold-timeout", "200", "--scale-down-window", "600",
            "--autoscale-interval", "0.5", "--num-kv-blocks", "64", "--max-model-len", "256")
    try:
        up.wait_for(lambda: httpx.get(f"{up.url}/health", timeout=5).status_code == 200, 60, "the gateway")
        assert httpx.get(f"{up.url}/ready", timeout=5).status_code == 503
        assert up.metrics()["pagedkube_autoscaler_desired_replicas"] == 0
        assert up.engine_pids() == {}

        async def scenario():
            async with httpx.AsyncClient(timeout=300) as http:
                held = [asyncio.create_task(completion(http, up.url, i)) for i in range(2)]
                while up.metrics().get("pagedkube_autoscaler_held_requests") != 2:
                    await asyncio.sleep(0.2)
                over = await asyncio.gather(*(completion(http, up.url, 10 + i) for i in range(2)))
                return await asyncio.gather(*held), over

        served, over = asyncio.run(asyncio.wait_for(scenario(), START_TIMEOUT_S))
        for r in over:
            assert r.status_code == 503
            assert r.headers["retry-after"] == "5"
            assert r.json()["error"]["type"] == "service_unavailable"
        assert [r.status_code for r in served] == [200, 200]
        assert all(r.json()["usage"]["completion_tokens"] == 8 for r in served)
        # Held requests are served the moment the engine is ready; the gauges follow
        # on the autoscaler's next tick.
        up.wait_for(lambda: up.metrics().get("pagedkube_autoscaler_ready_replicas") == 1, 30,
                    "the autoscaler to count the ready engine")
        m = up.metrics()
        assert m["pagedkube_autoscaler_ready_replicas"] == 1 and m["pagedkube_autoscaler_desired_replicas"] == 1
        assert m['pagedkube_autoscaler_scale_events_total{direction="up"}'] == 1
    finally:
        assert_stopped_cleanly(up, 1)


def test_up_without_autoscale_shows_status_and_stops_on_ctrl_c(tmp_path):
    up = Up(tmp_path, "--replicas", "1", "--num-kv-blocks", "64", "--max-model-len", "256")
    try:
        up.wait_for(lambda: httpx.get(f"{up.url}/ready", timeout=5).status_code == 200, START_TIMEOUT_S, "the engine")
        r = httpx.post(f"{up.url}/v1/chat/completions", timeout=120, json={
            "model": "tiny", "messages": [{"role": "user", "content": "How often should I feed my puppy?"}],
            "max_tokens": 4})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        text = up.wait_for(lambda: "curl http://127.0.0.1" in up.text() and up.text(), 30, "the curl line")
        assert f"curl http://127.0.0.1:{up.port}/v1/chat/completions -H 'Content-Type: application/json'" in text
        assert re.search(r"^status +\| gateway +listening +http://127\.0\.0\.1:\d+$", text, re.M)
        assert re.search(r"^status +\| engine-0 +loading +http://127\.0\.0\.1:\d+ +\(\d+ s\)$", text, re.M)
        assert re.search(r"^status +\| engine-0 +ready +http://127\.0\.0\.1:\d+ +\(loaded in [\d.]+ s\)$", text, re.M)
        assert re.search(r"^engine-0 \| .*Uvicorn running on", text, re.M)
        assert re.search(r"^gateway +\| INFO ", text, re.M)
        assert "pagedkube_autoscaler_desired_replicas" not in httpx.get(f"{up.url}/metrics").text
        up.proc.send_signal(signal.SIGINT)   # Ctrl-C
        assert up.proc.wait(90) == 0
        assert re.search(r"^status +\| engine-0 +stopped", up.text(), re.M)
    finally:
        assert_stopped_cleanly(up, 1)
