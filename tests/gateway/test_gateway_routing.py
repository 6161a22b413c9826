"""Routing decisions against real `pagedkube serve` processes.

Engines A and B serve the routing tests; engine C exists only to be killed in
the last test. Every response names the engine that served it and why
(x-pagedkube-endpoint, x-pagedkube-route).
"""
from __future__ import annotations

import signal
import threading

import httpx
import openai
import pytest

pytestmark = pytest.mark.slow  # real processes (engines start in tens of seconds)

MODEL_NAME = "tiny"  # conftest.MODEL_NAME
DOC = "Guide {d}: dogs need fresh water, daily walks and a calm bed; brush the coat weekly. " * 3


@pytest.fixture(scope="module")
def cluster(module_processes, engine_model_args, wait_until):
    engines = [module_processes.engine(*engine_model_args) for _ in range(3)]
    module_processes.wait_ready(*engines)
    a, b, c = (e.url for e in engines)
    # The paper's bound (c = 1.25, no floor): the bound test below counts on capacity 2 of 2 pods.
    bound = ("--load-bound", "1.25", "--load-floor", "0")
    # Read each engine's cache feed once at start, then not for an hour: what they route on is their own state.
    no_feed = ("--feed-wait", "0", "--feed-interval", "3600")
    gateways = {
        "one": module_processes.gateway([a, b], *bound),
        "two": module_processes.gateway([b, a], *bound),
        "pending": module_processes.gateway([a, b], *no_feed),   # the default: on (one router)
        "no-pending": module_processes.gateway([a, b], "--pending-ttl", "0", *no_feed),
        # Probes rarely, so a killed engine is found by the proxy, not by the probe.
        "kill": module_processes.gateway([a, b, c], "--scrape-interval", "60", "--eject-seconds", "60"),
    }
    module_processes.wait_ready(*gateways.values())
    for gw in gateways.values():
        wait_until(lambda: httpx.get(gw.url + "/ready").json()["tokenizer"]
                   and httpx.get(gw.url + "/ready").json()["endpoints"]["ready"] >= 2, timeout=60)
    return engines, gateways


def post(gw_url: str, prompt: str, **extra) -> httpx.Response:
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 2, "temperature": 0, **extra}
    r = httpx.post(gw_url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r


def route(r: httpx.Response) -> tuple[str, str]:
    return r.headers["x-pagedkube-endpoint"], r.headers["x-pagedkube-route"]


def settle(gw_url: str, wait_until, metric) -> None:
    """Wait until the gateway has applied every engine's cache feed up to the
    engine's latest event (the blocks the last request stored)."""
    feeds = httpx.get(gw_url + "/ready").json()["feeds"]
    latest = {url: httpx.get(url + "/v1/cache/events", params={"after": 0}).json()["latest_seq"] for url in feeds}
    wait_until(lambda: all(httpx.get(gw_url + "/ready").json()["feeds"].get(url, -1) >= seq
                           for url, seq in latest.items()), timeout=30)


def test_same_prefix_goes_to_the_same_pod(cluster, wait_until, metric):
    _, gateways = cluster
    gw = gateways["one"].url
    for d in range(4):
        first = post(gw, DOC.format(d=d) + "Question: how much water?")
        pod, reason = route(first)
        assert reason in ("ring", "overflow")
        settle(gw, wait_until, metric)
        for q in ("How often to brush?", "What bed is best?"):
            r = post(gw, DOC.format(d=d) + "Question: " + q)
            assert route(r) == (pod, "affinity")
            assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 48


def test_a_routed_prompt_draws_the_next_one_before_any_feed_event(cluster):
    """The pending record (on by default): the gateway counts the blocks it just
    routed to an engine as held there until the engine's feed reports them.
    Neither gateway here reads a feed event after start, so only that record can
    send the second prompt (same long document, another question: another ring
    key) to the first's engine. A shared run under 16 blocks draws nothing."""
    _, gateways = cluster
    doc = DOC.format(d="pending") * 5
    first = post(gateways["pending"].url, doc + "Question: how much water?")
    pod, reason = route(first)
    assert reason == "ring" and first.json()["usage"]["prompt_tokens"] > 17 * 16   # above the 16-block gate
    second = post(gateways["pending"].url, doc + "Question: how often to brush?")
    assert route(second) == (pod, "affinity")
    assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16 * 16
    # A short shared document (under 16 blocks) is not worth a draw: ring keys alone.
    short = DOC.format(d="short pending")
    first = post(gateways["pending"].url, short + "Question: how much water?")
    assert route(first)[1] == "ring" and first.json()["usage"]["prompt_tokens"] < 16 * 16
    assert route(post(gateways["pending"].url, short + "Question: how often to brush?"))[1] == "ring"   # nothing matched
    # With --pending-ttl 0 (several gateway replicas) the long pair is routed on ring keys alone.
    doc = DOC.format(d="no pending") * 5
    assert route(post(gateways["no-pending"].url, doc + "Question: how much water?"))[1] == "ring"
    assert route(post(gateways["no-pending"].url, doc + "Question: how often to brush?"))[1] == "ring"


def test_a_multi_turn_session_stays_on_its_pod(cluster, wait_until, metric):
    _, gateways = cluster
    gw = gateways["one"].url
    client = openai.OpenAI(base_url=gw + "/v1", api_key="none", max_retries=0)
    for s, dog in enumerate(("Rex, a beagle", "Bella, a poodle", "Max, a boxer")):
        messages = [{"role": "system", "content": f"You are a pet-care assistant. Dog profile: {dog}."},
                    {"role": "user", "content": f"How often should I feed {dog.split(',')[0]}?"}]
        pods = []
        for turn in range(4):
            raw = client.chat.completions.with_raw_response.create(model=MODEL_NAME, messages=messages,
                                                                   max_tokens=4, temperature=0)
            reply = raw.parse()
            pods.append(raw.headers["x-pagedkube-endpoint"])
            if turn:
                assert reply.usage.prompt_tokens_details.cached_tokens >= 16, (s, turn)
            messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                         {"role": "user", "content": f"Thanks! And follow-up number {turn}?"}]
        assert len(set(pods)) == 1, pods


def test_a_pod_over_the_bound_is_skipped(cluster, wait_until, metric):
    """Two requests hang on a stopped engine (SIGSTOP): its load is 2 while the
    other's is 0, so with c = 1.25 a third request for the same prefix goes elsewhere."""
    engines, gateways = cluster
    gw = gateways["one"].url
    prompt = DOC.format(d="bound") + "Tell me everything."
    pod = route(post(gw, prompt))[0]
    settle(gw, wait_until, metric)
    stuck = next(e for e in engines if e.url == pod)
    results: list[httpx.Response] = []
    stuck.popen.send_signal(signal.SIGSTOP)
    try:
        threads = [threading.Thread(target=lambda: results.append(post(gw, prompt))) for _ in range(2)]
        for t in threads:
            t.start()
            # 1 in flight over 2 pods: capacity ceil(1.25 * 2 / 2) = 2 still fits the second.
            wait_until(lambda: metric(gw, "pagedkube_gateway_endpoint_in_flight", endpoint=pod)
                       == threads.index(t) + 1, timeout=30)
        # 2 in flight on `pod`: capacity ceil(1.25 * 3 / 2) = 2 < 2 + 1, so the other pod takes it.
        endpoint, reason = route(post(gw, prompt))
        assert reason == "overflow" and endpoint != pod
    finally:
        stuck.popen.send_signal(signal.SIGCONT)
    for t in threads:
        t.join(timeout=120)
    assert [route(r)[0] for r in results] == [pod, pod]
    assert metric(gw, "pagedkube_gateway_routing_decisions_total", reason="overflow") >= 1


def test_two_gateways_agree(cluster, wait_until, metric):
    _, gateways = cluster
    one, two = gateways["one"].url, gateways["two"].url
    # Same inputs: both must see both engines ready and idle. The previous test
    # stopped one engine with two of gateway one's requests on it; gateway two
    # counts them as other replicas' load until its next scrape after they end,
    # and a load of 2 against 0 moves a request.
    for gw in (one, two):
        wait_until(lambda: httpx.get(gw + "/ready").json()["endpoints"]["ready"] == 2, timeout=60)
        for name in ("pagedkube_gateway_endpoint_in_flight", "pagedkube_gateway_endpoint_other_requests"):
            wait_until(lambda: metric(gw, name) == 0, timeout=30)
    for i in range(8):
        prompt = f"Agreement check {i}: " + DOC.format(d=100 + i)
        first, second = (one, two) if i % 2 else (two, one)
        pod = route(post(first, prompt))[0]
        assert route(post(second, prompt))[0] == pod


def test_retry_on_a_killed_engine_before_the_first_byte(cluster, wait_until, metric):
    engines, gateways = cluster
    victim = engines[2]
    gw = gateways["kill"].url
    owned = []
    for i in range(24):
        prompt = f"Kill test {i}: " + DOC.format(d=200 + i)
        if route(post(gw, prompt))[0] == victim.url:
            owned.append(prompt)
    assert len(owned) >= 2, "the ring gave engine C no keys out of 24"
    victim.kill()
    for prompt in owned[:2]:
        endpoint, _ = route(post(gw, prompt))
        assert endpoint in (engines[0].url, engines[1].url)
    assert metric(gw, "pagedkube_gateway_upstream_retries_total", cause="connect") == 2
    # Two consecutive connect errors eject the engine: no more attempts on it.
    assert httpx.get(gw + "/ready").json()["endpoints"]["ejected"] == 1
    for prompt in owned[2:]:
        post(gw, prompt)
    assert metric(gw, "pagedkube_gateway_upstream_retries_total", cause="connect") == 2


def test_the_cache_feed_is_followed_by_long_poll(processes, engine_model_args, wait_until):
    """The gateway holds a long-poll on each engine's cache feed, so it learns of
    new blocks as the engine stores them, not at its next poll: here the polls are
    60 s apart, yet the blocks of a request show up in the index at once."""
    engine = processes.engine(*engine_model_args)
    processes.wait_ready(engine)
    gw = processes.gateway([engine.url], "--feed-interval", "60", "--feed-wait", "30")
    processes.wait_ready(gw)
    wait_until(lambda: httpx.get(gw.url + "/ready").json()["tokenizer"], timeout=60)
    wait_until(lambda: httpx.get(gw.url + "/ready").json()["feeds"] == {engine.url: 0}, timeout=30)  # a fresh engine

    prompt = DOC.format(d="long-poll") + "Summarise."
    endpoint, reason = route(post(gw.url, prompt))
    assert (endpoint, reason) == (engine.url, "ring")
    wait_until(lambda: httpx.get(gw.url + "/ready").json()["feeds"][engine.url] >= 1, timeout=20)
    assert route(post(gw.url, prompt)) == (engine.url, "affinity")
