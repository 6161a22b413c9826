"""EndpointSet (states, loads, ejection), EndpointSlice parsing, feed/metrics parsing."""
import asyncio

import pytest

from pagedkube.gateway.discovery import SliceSet, normalize_url, slice_endpoints
from pagedkube.gateway.endpoints import EndpointSet
from pagedkube.gateway.engine_metrics import EngineScrape, parse_engine_metrics
from pagedkube.gateway.metrics import SSEUsageScanner

A, B, C = "http://a:8000", "http://b:8000", "http://c:8000"


def test_states_loads_and_passive_ejection():
    now = [0.0]
    changes = []
    eps = EndpointSet(eject_after_failures=2, eject_seconds=10, clock=lambda: now[0])
    eps.subscribe(lambda added, removed: changes.append((sorted(added), sorted(removed))))
    eps.update({A: "ready", B: "ready", C: "not_ready"})
    assert eps.routable() == [A, B] and changes == [([A, B, C], [])]
    eps.acquire(A), eps.acquire(A), eps.acquire(B), eps.release(B), eps.release(B)
    eps.set_scraped(A, running=4, waiting=1, own=2)  # 3 of the engine's 5 are another replica's
    assert eps.loads() == {A: 5, B: 0, C: 0}
    assert eps.report_failure(B) is False and eps.routable() == [A, B]
    eps.report_success(B)
    assert eps.report_failure(B) is False and eps.report_failure(B) is True
    assert eps.routable() == [A] and eps.counts_by_state() == {"ready": 1, "not_ready": 1, "terminating": 0,
                                                                "ejected": 1}
    now[0] = 10.5
    assert eps.routable() == [A, B]
    eps.set_discovered(A, "not_ready")
    eps.update({B: "ready", C: "terminating"})
    assert eps.routable() == [B] and changes[-1] == ([], [A]) and eps.loads() == {B: 0, C: 0}
    eps.release(A)  # a request finishing on a removed endpoint is fine
    with pytest.raises(ValueError):
        eps.update({A: "sleepy"})


def test_wait_routable_holds_until_an_endpoint_is_ready():
    async def main():
        eps = EndpointSet()
        eps.update({A: "not_ready"})
        assert await eps.wait_routable(0) == []
        asyncio.get_running_loop().call_later(0.05, eps.set_discovered, A, "ready")
        return await eps.wait_routable(5)

    assert asyncio.run(main()) == [A]


SLICE = {
    "metadata": {"name": "engine-abc"},
    "ports": [{"name": "metrics", "port": 9090}, {"name": "http", "port": 8000}],
    "endpoints": [
        {"addresses": ["10.0.0.1"], "conditions": {"ready": True, "serving": True, "terminating": False}},
        {"addresses": ["10.0.0.2"], "conditions": {"ready": False}},
        {"addresses": ["10.0.0.3"], "conditions": {"ready": False, "serving": True, "terminating": True}},
        {"addresses": ["10.0.0.4"], "conditions": {}},
        {"addresses": ["fd00::5"], "conditions": {"ready": True}},
        {"addresses": [], "conditions": {"ready": True}},
    ],
}


def test_endpointslice_states():
    assert slice_endpoints(SLICE) == {
        "http://10.0.0.1:8000": "ready", "http://10.0.0.2:8000": "not_ready",
        "http://10.0.0.3:8000": "terminating", "http://10.0.0.4:8000": "ready", "http://[fd00::5]:8000": "ready"}
    assert slice_endpoints({"ports": [{"name": "grpc", "port": 1}, {"name": "x", "port": 2}]}) == {}


def test_slices_merge_and_delete():
    slices = SliceSet()
    other = {"metadata": {"name": "engine-def"}, "ports": [{"name": "http", "port": 8000}],
             "endpoints": [{"addresses": ["10.0.0.2"], "conditions": {"ready": True}},
                           {"addresses": ["10.0.0.9"], "conditions": {"ready": True}}]}
    slices.apply("ADDED", SLICE)
    merged = slices.apply("ADDED", other)
    assert merged["http://10.0.0.2:8000"] == "ready" and merged["http://10.0.0.9:8000"] == "ready"
    merged = slices.apply("DELETED", SLICE)
    assert merged == {"http://10.0.0.2:8000": "ready", "http://10.0.0.9:8000": "ready"}


def test_normalize_url():
    assert normalize_url(" 127.0.0.1:8000/ ") == "http://127.0.0.1:8000"
    assert normalize_url("https://x:1") == "https://x:1"
    for bad in ("", "ftp://x"):
        with pytest.raises(ValueError):
            normalize_url(bad)


def test_load_counts_own_requests_once_and_others_as_scraped():
    eps = EndpointSet()
    eps.update({A: "ready", B: "ready"})
    eps.acquire(A), eps.acquire(A)
    # Both of ours are on A, one of them still queued: nobody else is there.
    eps.set_scraped(A, running=1, waiting=1, own=2)
    assert eps.loads() == {A: 2, B: 0}
    eps.release(A), eps.release(A)
    assert eps.loads() == {A: 0, B: 0}, "finished requests do not linger until the next scrape"
    # Another replica's 3 requests: counted as of the scrape, on top of ours now.
    eps.set_scraped(B, running=2, waiting=1, own=0)
    eps.acquire(B)
    assert eps.loads() == {A: 0, B: 4}
    # Ours ended between the engine's count and the scrape (own > engine total): never negative.
    eps.set_scraped(A, running=0, waiting=0, own=3)
    assert eps.loads()[A] == 0
    assert eps.get(B).waiting == 1  # the raw queue stays for the autoscaler


def test_metrics_show_both_halves_of_each_load():
    from prometheus_client.parser import text_string_to_metric_families

    from pagedkube.gateway.metrics import GatewayMetrics

    eps = EndpointSet()
    eps.update({A: "ready", B: "ready"})
    eps.acquire(A), eps.set_scraped(B, running=3, waiting=1, own=0), eps.set_scraped(A, running=2, waiting=1, own=1)
    metrics = GatewayMetrics(eps.counts_by_state, eps.load_parts)
    samples = {(s.name, s.labels.get("endpoint")): s.value
               for f in text_string_to_metric_families(metrics.render().decode()) for s in f.samples}
    assert eps.loads() == {A: 3, B: 4}
    assert samples[("pagedkube_gateway_endpoint_in_flight", A)] == 1
    assert samples[("pagedkube_gateway_endpoint_in_flight", B)] == 0
    assert samples[("pagedkube_gateway_endpoint_other_requests", A)] == 2
    assert samples[("pagedkube_gateway_endpoint_other_requests", B)] == 4
    eps.update({B: "ready"})  # A left: its series go too
    samples = {(s.name, s.labels.get("endpoint")) for f in text_string_to_metric_families(metrics.render().decode())
               for s in f.samples}
    assert ("pagedkube_gateway_endpoint_other_requests", A) not in samples
    assert ("pagedkube_gateway_endpoint_other_requests", B) in samples


def test_parse_engine_metrics_sums_label_sets():
    text = ('# HELP vllm:num_requests_waiting Requests waiting\n# TYPE vllm:num_requests_waiting gauge\n'
            'vllm:num_requests_waiting{model_name="a"} 3.0\nvllm:num_requests_waiting{model_name="b"} 2.0\n'
            'vllm:num_requests_running{model_name="a"} 7.0\nvllm:num_requests_waiting_by_reason 9\n'
            'vllm:num_requests_running 1\n'
            'vllm:prefix_cache_hits_total{model_name="a"} 40.0\nvllm:prefix_cache_hits_total{model_name="b"} 2\n'
            'vllm:prefix_cache_hits_created 1.7e9\nvllm:prefix_cache_hits_total{model_name="c"} NaN-ish\n')
    assert parse_engine_metrics(text) == EngineScrape(running=8, waiting=5, prefix_cache_hits=42.0)
    # absent: no load, and no hits at all (an engine that does not export them is not "worth 0")
    assert parse_engine_metrics("") == EngineScrape(0, 0, None)


def test_the_scrape_lands_in_the_endpoint_set_for_router_and_autoscaler():
    eps = EndpointSet()
    eps.update({A: "ready"})
    scrape = parse_engine_metrics("vllm:num_requests_running 2\nvllm:num_requests_waiting 3\n"
                                  "vllm:prefix_cache_hits_total 64\n")
    eps.set_scraped(A, scrape.running, scrape.waiting, 1, scrape.prefix_cache_hits)
    e = eps.get(A)
    assert (e.waiting, e.others, e.prefix_cache_hits, eps.loads()) == (3, 4, 64.0, {A: 4})


def test_sse_usage_scanner_reads_usage_split_across_chunks():
    stream = (b'data: {"choices": [{"text": "hi"}], "usage": null}\n\n'
              b'data: {"choices": [], "usage": {"prompt_tokens": 40, "prompt_tokens_details": {"cached_tokens": 32}}}'
              b'\n\ndata: [DONE]\n\n')
    scanner = SSEUsageScanner()
    for i in range(0, len(stream), 7):
        scanner.feed(stream[i:i + 7])
    assert scanner.cached_tokens == 32
    none = SSEUsageScanner()
    none.feed(stream[:60])
    assert none.cached_tokens is None


def test_parse_engine_metrics_reads_an_engine_page_as_prometheus_client_does():
    """The hand parser (kept for speed: its docstring) against the library's parser, on the
    page a real EngineMetrics renders, with two label sets summed."""
    import time

    from prometheus_client.parser import text_string_to_metric_families

    from pagedkube.engine.llm_engine import EngineStats
    from pagedkube.engine.server.metrics import EngineMetrics
    from pagedkube.gateway.engine_metrics import GENERATION_TOKENS, PREFIX_CACHE_HITS, RUNNING, WAITING

    pages = []
    for model, (running, waiting, hits) in (("a", (3, 5, 400)), ("b", (1, 0, 23))):
        stats = EngineStats(num_running=running, num_waiting=waiting, kv_cache_usage=0.5, prefix_cache_queries=1000,
                            prefix_cache_hits=hits, num_preemptions=2, num_kv_blocks=320, num_free_blocks=100)
        metrics = EngineMetrics(model, lambda stats=stats: (stats, 0))
        metrics.on_first_token(0.05, 100)
        metrics.on_request_end("stop", time.monotonic() - 1, time.monotonic() - 0.5)
        pages.append(metrics.render().decode())
    text = "".join(pages)
    library: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (RUNNING, WAITING, PREFIX_CACHE_HITS, GENERATION_TOKENS):
                library[sample.name] = library.get(sample.name, 0.0) + sample.value
    assert library == {RUNNING: 4.0, WAITING: 5.0, PREFIX_CACHE_HITS: 423.0, GENERATION_TOKENS: 0.0}
    assert parse_engine_metrics(text) == EngineScrape(running=4, waiting=5, prefix_cache_hits=423.0,
                                                      generation_tokens=library[GENERATION_TOKENS])
