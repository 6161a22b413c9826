"""The gateway's scrape parser (gateway/engine_metrics.py) against prometheus_client.parser.

    .venv/bin/python bench/metrics_parse.py [--engines 256] [--scrape-interval 1.0]

Renders a real engine /metrics page (EngineMetrics, histograms filled), checks that both
parsers read the same three numbers from it, and times each per page. The gateway parses
one page per engine per --scrape-interval on its event loop, so the per-page time times the
fleet size is event-loop time per scrape interval. Results: docs/benchmarks.md "Scrape parsing".
"""
from __future__ import annotations

import argparse
import statistics
import time

from prometheus_client.parser import text_string_to_metric_families

from pagedkube.engine.llm_engine import EngineStats
from pagedkube.engine.server.metrics import EngineMetrics
from pagedkube.gateway.engine_metrics import PREFIX_CACHE_HITS, RUNNING, WAITING, EngineScrape, parse_engine_metrics


def engine_page() -> str:
    stats = EngineStats(num_running=3, num_waiting=5, kv_cache_usage=0.5, prefix_cache_queries=1000,
                        prefix_cache_hits=400, num_preemptions=2, num_kv_blocks=320, num_free_blocks=100)
    metrics = EngineMetrics("tiny", lambda: (stats, 0))
    for i in range(50):
        metrics.on_first_token(0.01 * i, 100)
        metrics.on_inter_token(0.001 * i)
        metrics.on_generated(3)
        metrics.on_request_end("stop", time.monotonic() - 1, time.monotonic() - 0.5)
    return metrics.render().decode()


def with_library(text: str) -> EngineScrape:
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (RUNNING, WAITING, PREFIX_CACHE_HITS):
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return EngineScrape(int(totals.get(RUNNING, 0.0)), int(totals.get(WAITING, 0.0)), totals.get(PREFIX_CACHE_HITS))


def per_page_us(parse, text: str, pages: int = 200, rounds: int = 7) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(pages):
            parse(text)
        times.append((time.perf_counter() - start) / pages * 1e6)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", type=int, default=256)
    parser.add_argument("--scrape-interval", type=float, default=1.0)
    args = parser.parse_args()
    text = engine_page()
    assert parse_engine_metrics(text) == with_library(text)
    ours, library = per_page_us(parse_engine_metrics, text), per_page_us(with_library, text)
    print(f"page: {len(text.splitlines())} lines, {len(text)} bytes")
    for name, us in (("engine_metrics.parse_engine_metrics", ours), ("prometheus_client.parser", library)):
        share = us * args.engines / (args.scrape_interval * 1e6)
        print(f"{name:36s} {us:8.1f} us/page  {share:6.1%} of the event loop at {args.engines} engines")
    print(f"ratio: {library / ours:.1f}x")


if __name__ == "__main__":
    main()
