"""Metrics, probes, client disconnects and the SIGTERM drain, against real processes."""
from __future__ import annotations

import json
import signal
import socket
import threading

import httpx
from prometheus_client.parser import text_string_to_metric_families

from pagedkube.engine.server.metrics import (INTER_TOKEN_BUCKETS, METRIC_NAMES, REQUEST_LATENCY_BUCKETS,
                                             TTFT_BUCKETS)

from .conftest import API_KEY, MODEL_NAME, ServerProcess, metric_value, wait_until

PROMISED_METRICS = (  # docs/design.md "Engine server", as exposed (counters carry _total)
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
    "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
)


def test_models(client, http):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL_NAME]
    assert client.models.retrieve(MODEL_NAME).id == MODEL_NAME
    assert http.get("/v1/models").json()["data"][0]["max_model_len"] == 512


def test_health_and_ready(http):
    assert http.get("/health").json() == {"status": "ok"}
    assert http.get("/ready").json() == {"status": "ready"}


def test_tokenize_and_detokenize_shapes(http):
    body = http.post("/tokenize", json={"prompt": "Can cats eat fish?"}).json()
    assert body["count"] == len(body["tokens"]) > 0 and body["max_model_len"] == 512
    assert body["token_strs"] is None
    with_strs = http.post("/tokenize", json={"prompt": "Can cats eat fish?", "return_token_strs": True}).json()
    assert len(with_strs["token_strs"]) == body["count"]
    assert http.post("/detokenize", json={"tokens": body["tokens"]}).json() == {"prompt": "Can cats eat fish?"}
    chat = http.post("/tokenize", json={"messages": [{"role": "user", "content": "Can cats eat fish?"}]}).json()
    assert chat["count"] > body["count"]   # the template adds role markers


def test_metrics_names_labels_and_buckets(client, http):
    client.completions.create(model=MODEL_NAME, prompt="Do rabbits need vaccines?", max_tokens=4)
    text = http.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {s.name: s for f in families.values() for s in f.samples}
    for name in PROMISED_METRICS:
        assert name in samples or f"{name}_count" in samples, name
    assert set(PROMISED_METRICS) == set(METRIC_NAMES)
    for family in families.values():
        if family.name.startswith("vllm:"):
            assert all(s.labels["model_name"] == MODEL_NAME for s in family.samples), family.name

    def buckets(name: str) -> list[float]:
        return [float(s.labels["le"]) for s in families[name].samples
                if s.name == f"{name}_bucket" and s.labels["le"] != "+Inf"]
    assert buckets("vllm:time_to_first_token_seconds") == TTFT_BUCKETS
    assert buckets("vllm:inter_token_latency_seconds") == INTER_TOKEN_BUCKETS
    assert buckets("vllm:e2e_request_latency_seconds") == REQUEST_LATENCY_BUCKETS
    assert buckets("vllm:request_queue_time_seconds") == REQUEST_LATENCY_BUCKETS
    assert TTFT_BUCKETS[:3] == [0.001, 0.005, 0.01] and REQUEST_LATENCY_BUCKETS[-1] == 7680.0
    assert metric_value(text, "vllm:time_to_first_token_seconds_count") >= 1
    assert metric_value(text, "vllm:generation_tokens_total") >= 4
    assert metric_value(text, "vllm:request_success_total", finished_reason="length") >= 1


def test_token_counters_count_a_request(client, http):
    before = http.get("/metrics").text
    r = client.completions.create(model=MODEL_NAME, prompt="Do rabbits need vaccines?", max_tokens=9,
                                  extra_body={"ignore_eos": True})
    after = http.get("/metrics").text
    delta = {name: metric_value(after, name) - metric_value(before, name)
             for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                          "vllm:e2e_request_latency_seconds_count", "vllm:inter_token_latency_seconds_count")}
    assert delta == {"vllm:prompt_tokens_total": r.usage.prompt_tokens, "vllm:generation_tokens_total": 9,
                     "vllm:e2e_request_latency_seconds_count": 1, "vllm:inter_token_latency_seconds_count": 8}


def test_client_disconnect_frees_kv_blocks(server, http):
    def usage() -> float:
        return metric_value(http.get("/metrics").text, "vllm:kv_cache_usage_perc")

    def running() -> float:
        return metric_value(http.get("/metrics").text, "vllm:num_requests_running")
    wait_until(lambda: running() == 0)
    idle = usage()
    body = {"model": MODEL_NAME, "prompt": "Tell me about parrots. " * 3, "max_tokens": 400,
            "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=server.url, timeout=60) as c, c.stream("POST", "/v1/completions", json=body) as r:
        lines = (line for line in r.iter_lines() if line)
        for _ in range(5):
            assert next(lines).startswith("data: ")
        assert running() == 1 and usage() > idle
    # The connection is gone: the request is aborted and its blocks return to the pool.
    wait_until(lambda: running() == 0 and usage() == idle)


def test_non_streaming_disconnect_aborts(server, http):
    """The client hangs up while its non-streaming request runs: every sequence is aborted.
    16 sequences of 480 tokens keep the request running for seconds, and the connection is closed
    only once the server reports its 16 sequences running (a fixed client timeout raced the toy model, which
    finishes one 480-token answer in under 0.5 s)."""
    def running() -> float:
        return metric_value(http.get("/metrics").text, "vllm:num_requests_running")
    aborted = lambda: metric_value(http.get("/metrics").text, "vllm:request_success_total",  # noqa: E731
                                   finished_reason="abort")
    before = aborted()
    body = json.dumps({"model": MODEL_NAME, "prompt": "Tell me about parrots.", "max_tokens": 480,
                       "ignore_eos": True, "n": 16}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        wait_until(lambda: running() == 16, interval=0.01)
    wait_until(lambda: aborted() == before + 1 and running() == 0)   # one request, n=16


def test_sigterm_lets_a_running_request_finish(tmp_path):
    proc = ServerProcess(tmp_path, "--drain-timeout", "60", name="drain").start()
    try:
        body = {"prompt": "Tell me about parrots.", "max_tokens": 300, "ignore_eos": True, "stream": True}
        texts: list[str] = []
        with httpx.Client(base_url=proc.url, timeout=60) as c, c.stream("POST", "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            first = next(lines)
            texts.append(json.loads(first[len("data: "):])["choices"][0]["text"])
            proc.proc.send_signal(signal.SIGTERM)
            wait_until(lambda: c.get("/ready").status_code == 503)
            refused = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
            assert c.get("/health").status_code == 200
            chunks = [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: {")]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert proc.proc.wait(60) == 0
        log = proc.log()
        assert "draining 1 in-flight request" in log and "Traceback" not in log
    finally:
        proc.kill()


def test_post_drain_refuses_new_requests_finishes_running_ones_and_delete_undoes_it(small_server):
    """A scale-in's drain (gateway/autoscaler/drain.py): the engine stays up, says how many
    requests it still has, refuses new ones with the 503 gateways retry elsewhere."""
    key = {"Authorization": f"Bearer {API_KEY}"}
    body = {"model": MODEL_NAME, "prompt": "Tell me about parrots.", "max_tokens": 60, "ignore_eos": True,
            "stream": True}
    with httpx.Client(base_url=small_server.url, timeout=60, headers=key) as c:
        assert c.post("/drain", headers={"Authorization": "Bearer wrong"}).status_code == 401   # the engine key only
        with c.stream("POST", "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            next(lines)
            assert c.post("/drain").json() == {"draining": True, "in_flight": 1}
            assert c.get("/ready").status_code == 503
            refused = c.post("/v1/completions", json={**body, "stream": False})
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
            chunks = [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: {")]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"   # the running one finished
        wait_until(lambda: c.post("/drain").json()["in_flight"] == 0)
        assert c.delete("/drain").json() == {"draining": False, "in_flight": 0}
        assert c.get("/ready").status_code == 200
        assert c.post("/v1/completions", json={**body, "stream": False, "max_tokens": 2}).status_code == 200


def test_sigterm_answers_cache_feed_long_polls(tmp_path):
    """A gateway's long-poll of the cache feed must not hold up a drain: it is
    answered (with nothing new) when the drain starts, and the process exits."""
    proc = ServerProcess(tmp_path, "--drain-timeout", "60", name="drain-feed").start()
    try:
        with httpx.Client(base_url=proc.url, timeout=60) as c:
            seq = c.get("/v1/cache/events", params={"after": 2 ** 62}).json()["latest_seq"]
            answers: list[httpx.Response] = []
            poll = threading.Thread(target=lambda: answers.append(
                c.get("/v1/cache/events", params={"after": seq, "wait": 30})))
            poll.start()
            wait_until(lambda: poll.is_alive() and metric_value(c.get("/metrics").text, "vllm:num_requests_running")
                       == 0, timeout=5)
            proc.proc.send_signal(signal.SIGTERM)
            poll.join(timeout=20)
            assert not poll.is_alive(), "the drain did not answer the long-poll"
        body = answers[0].json()
        assert answers[0].status_code == 200 and (body["reset"], body["events"]) == (False, [])
        assert proc.proc.wait(20) == 0
    finally:
        proc.kill()


def test_sigterm_aborts_after_drain_timeout(tmp_path):
    proc = ServerProcess(tmp_path, "--drain-timeout", "0", name="drain-timeout").start()
    try:
        body = {"prompt": "Tell me about parrots.", "max_tokens": 400, "ignore_eos": True, "stream": True}
        with httpx.Client(base_url=proc.url, timeout=60) as c, c.stream("POST", "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            next(lines)
            proc.proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line]
        assert '"error"' in rest[-1] and "data: [DONE]" not in rest
        assert proc.proc.wait(60) == 0
    finally:
        proc.kill()


def test_concurrent_streams_all_complete(client):
    results: dict[int, str] = {}

    def run(i: int) -> None:
        stream = client.completions.create(model=MODEL_NAME, prompt=f"Question {i}: can hamsters swim?",
                                           max_tokens=12, temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        results[i] = "".join(c.choices[0].text for c in stream if c.choices)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i in range(6):
        alone = client.completions.create(model=MODEL_NAME, prompt=f"Question {i}: can hamsters swim?",
                                          max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
        assert results[i] == alone.choices[0].text
