"""What the gateway reads from an engine's /metrics, parsed in one place.

The engine watcher (gateway/engine_watch.py) scrapes each engine once per
`scrape_interval` and parses the page here; the result goes to the EndpointSet,
where the router (load), the autoscaler (waiting queue, cache worth) and the
gateway's own metrics read it. Nothing else in the gateway fetches or parses
an engine's /metrics. The names are the engine's (vLLM's) exposition names
(docs/interfaces.md "Metric names").

Why not prometheus_client.parser: it is what the test compares against
(tests/gateway/test_endpoints.py reads a real engine page with both), but it costs 35x
as much per page: 1.3 ms against 38 us for an engine's 158-line page
(bench/metrics_parse.py, docs/benchmarks.md "Scrape parsing"). The gateway parses one
page per engine per --scrape-interval on its event loop, so at 256 engines and 1 s the
library would take a third of the loop, this 1%. It also fails a whole page on one
malformed line, where this skips the line. Three names, summed over label sets, need
no more than a prefix match.
"""
from __future__ import annotations

from dataclasses import dataclass

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"   # cached prompt tokens served, cumulative
GENERATION_TOKENS = "vllm:generation_tokens_total"   # output tokens, cumulative (the decode rate)


@dataclass(frozen=True, slots=True)
class EngineScrape:
    """One engine's numbers at one scrape; each sample summed over its label sets."""
    running: int = 0                           # 0 when absent
    waiting: int = 0                           # 0 when absent
    prefix_cache_hits: float | None = None     # None when the engine does not export it
    generation_tokens: float | None = None     # None when the engine does not export it


def parse_engine_metrics(metrics_text: str) -> EngineScrape:
    """The numbers above from a Prometheus text exposition (a malformed sample is skipped)."""
    totals: dict[str, float] = {}
    for line in metrics_text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in (RUNNING, WAITING, PREFIX_CACHE_HITS, GENERATION_TOKENS):
            try:
                value = float(line.rsplit(None, 1)[-1])
            except ValueError:
                continue
            totals[name] = totals.get(name, 0.0) + value
    return EngineScrape(int(totals.get(RUNNING, 0.0)), int(totals.get(WAITING, 0.0)), totals.get(PREFIX_CACHE_HITS),
                        totals.get(GENERATION_TOKENS))
