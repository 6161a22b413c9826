"""An engine in its SIGTERM drain answers new requests 503 `draining` before any work starts:
the gateway must send them to another engine, not to the client (issue 18: one such 503
reached a client through the gateway pod while an engine pod was deleted under load).

Real processes: two engines and a gateway that, like a gateway whose EndpointSlice watch
lags the pod's deletion, still believes both engines ready (it probes /ready only at
start here). The draining engine stays in its drain because its engine core is stopped
(SIGSTOP) under a request in flight, so the test does not race the drain's end."""
from __future__ import annotations

import signal
import threading

import httpx
import openai
import psutil
import pytest

pytestmark = pytest.mark.slow  # real processes

MODEL_NAME = "tiny"  # conftest.MODEL_NAME


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)


def test_a_draining_engine_never_answers_a_client_through_the_gateway(processes, engine_model_args, metric,
                                                                     wait_until):
    draining = processes.engine(*engine_model_args, "--drain-timeout", "300")
    other = processes.engine(*engine_model_args)
    processes.wait_ready(draining, other)
    # Round-robin: every other decision puts the draining engine first. One attempt per request:
    # a drain answer must not use it up. /ready is probed once, at start, so the gateway does not
    # learn of the drain from a probe; it can learn it only from the answers.
    gw = processes.gateway([draining.url, other.url], "--routing", "round-robin", "--max-attempts", "1",
                           "--scrape-interval", "600")
    processes.wait_ready(gw)
    wait_until(lambda: httpx.get(gw.url + "/ready").json()["endpoints"]["ready"] == 2)

    # Stop the draining engine's core, then give it a request: the server hands it to the core
    # (counted in vllm:num_requests_waiting) and it can never finish, so the drain lasts.
    core = psutil.Process(draining.popen.pid).children(recursive=True)
    for p in core:
        p.send_signal(signal.SIGSTOP)
    stuck = threading.Thread(target=lambda: httpx.post(
        draining.url + "/v1/completions", json={"model": MODEL_NAME, "prompt": "stuck", "max_tokens": 2},
        timeout=600), daemon=True)
    try:
        stuck.start()
        wait_until(lambda: metric(draining.url, "vllm:num_requests_waiting") == 1)
        draining.popen.send_signal(signal.SIGTERM)
        wait_until(lambda: httpx.get(draining.url + "/ready").status_code == 503)
        refused = httpx.post(draining.url + "/v1/completions", json={"model": MODEL_NAME, "prompt": "hi",
                                                                     "max_tokens": 2})
        assert (refused.status_code, refused.json()["error"]["code"]) == (503, "draining")

        served = []
        for i in range(6):
            if i == 3:   # a stream too: the drain answer comes before any header goes out
                with client(gw.url).completions.with_streaming_response.create(
                        model=MODEL_NAME, prompt=f"stream {i}", max_tokens=2, stream=True) as response:
                    assert [c.choices[0].text for c in response.parse()]
                    served.append(response.headers["x-pagedkube-endpoint"])
                continue
            raw = client(gw.url).completions.with_raw_response.create(model=MODEL_NAME, prompt=f"request {i}",
                                                                      max_tokens=2)
            assert raw.parse().choices[0].text is not None
            served.append(raw.headers["x-pagedkube-endpoint"])
        assert draining.popen.poll() is None, "the drain ended before the requests were sent"
    finally:
        for p in core:
            if p.is_running():
                p.send_signal(signal.SIGCONT)
    assert served == [other.url] * 6
    # The first drain answer took the engine out of routing at once: no request met it again.
    assert metric(gw.url, "pagedkube_gateway_upstream_retries_total", cause="503") == 1
    assert httpx.get(gw.url + "/ready").json()["endpoints"] == {"ready": 1, "not_ready": 0, "terminating": 1,
                                                                "ejected": 0}
    assert metric(gw.url, "pagedkube_gateway_requests_total", code="200") == 6
    assert metric(gw.url, "pagedkube_gateway_requests_total", code="503") == 0
    draining.kill()
    assert "Traceback" not in gw.log_tail(200), gw.log_tail(200)
