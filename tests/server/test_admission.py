"""Admission under hostile load (issue 14, items 1, 4 and 5): counted in sequences,
capped per request, fair between requests, and never at the cost of the event loop."""
from __future__ import annotations

import concurrent.futures

import httpx
from .conftest import ServerProcess, metric_value, wait_until


def test_one_maximal_request_does_not_kill_the_engine(http):
    """4 prompts x n=64 with 20 logprobs each: the request that used to wedge the engine."""
    body = {"prompt": ["My cat 0", "My cat 1", "My cat 2", "My cat 3"], "n": 64, "max_tokens": 20,
            "logprobs": 20, "ignore_eos": True}
    r = http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text[:500]
    choices = r.json()["choices"]
    assert sorted(c["index"] for c in choices) == list(range(256))
    assert all(len(c["logprobs"]["tokens"]) == 20 and len(c["logprobs"]["top_logprobs"][0]) >= 20
               for c in choices)
    assert http.get("/health").status_code == 200
    assert http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200


def test_a_request_larger_than_max_num_seqs_is_a_400_and_locks_nobody_out(server):
    """64 prompts x n=20 queued 1,280 sequences and locked 20 others out with 503 for 20 s."""
    huge = {"prompt": [f"My dog {i}" for i in range(64)], "n": 20, "max_tokens": 4}
    small = {"prompt": "Is chocolate bad for dogs?", "max_tokens": 4}
    with httpx.Client(base_url=server.url, timeout=120) as c, concurrent.futures.ThreadPoolExecutor(21) as pool:
        big = pool.submit(c.post, "/v1/completions", json=huge)
        others = [pool.submit(c.post, "/v1/completions", json=small) for _ in range(20)]
        r = big.result()
        assert r.status_code == 400 and r.json()["error"]["param"] == "n"
        assert "1280 sequences" in r.json()["error"]["message"]
        assert [f.result().status_code for f in others] == [200] * 20


def test_a_10_mb_prompt_does_not_stall_health(tmp_path):
    """Tokenizing ~10 MB takes seconds: /health must keep answering meanwhile (checked by
    order: three answers after the server started on the prompt and before its reply)."""
    server = ServerProcess(tmp_path, "--max-model-len", "256", name="big-prompt").start()
    try:
        prompt = "My dog barks at night and eats socks. " * 270_000     # ~10 MB
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            big = pool.submit(httpx.post, f"{server.url}/v1/completions",
                              json={"prompt": prompt, "max_tokens": 2}, timeout=600)
            wait_until(lambda: "tokenizing it in a worker thread" in server.log() or big.done(), timeout=120)
            answered_meanwhile = 0
            with httpx.Client(base_url=server.url, timeout=600) as c:
                while not big.done() and answered_meanwhile < 3:
                    assert c.get("/health").status_code == 200
                    answered_meanwhile += 0 if big.done() else 1
            r = big.result()
        assert answered_meanwhile == 3
        assert r.status_code == 400 and "max_model_len" in r.json()["error"]["message"]
    finally:
        server.stop()
