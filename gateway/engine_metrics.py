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
no more than a prefix match; the LoRA lines' labels (adapter names: letters, digits and
._:/@+- only, engine/lora/modules.py) a small pattern.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from pagedkube.gateway.routing.adapters import AdapterSlots

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"   # cached prompt tokens served, cumulative
GENERATION_TOKENS = "vllm:generation_tokens_total"   # output tokens, cumulative (the decode rate)
LORA_INFO = "vllm:lora_requests_info"                # {running_lora_adapters, waiting_lora_adapters, max_lora}
LORA_RESIDENT = "pagedkube_engine_lora_resident"     # {lora_name}: one line per adapter in a slot (ours)
_LABEL = re.compile(r'(\w+)="([^"\\]*)"')


@dataclass(frozen=True, slots=True)
class EngineScrape:
    """One engine's numbers at one scrape; each sample summed over its label sets."""
    running: int = 0                           # 0 when absent
    waiting: int = 0                           # 0 when absent
    prefix_cache_hits: float | None = None     # None when the engine does not export it
    generation_tokens: float | None = None     # None when the engine does not export it
    lora: AdapterSlots | None = None           # None without vllm:lora_requests_info (LoRA off)


def parse_engine_metrics(metrics_text: str) -> EngineScrape:
    """The numbers above from a Prometheus text exposition (a malformed sample is skipped)."""
    totals: dict[str, float] = {}
    info: dict[str, str] | None = None
    resident: set[str] = set()
    for line in metrics_text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in (RUNNING, WAITING, PREFIX_CACHE_HITS, GENERATION_TOKENS):
            try:
                value = float(line.rsplit(None, 1)[-1])
            except ValueError:
                continue
            totals[name] = totals.get(name, 0.0) + value
        elif name == LORA_INFO:
            info = dict(_LABEL.findall(line))
        elif name == LORA_RESIDENT and (adapter := dict(_LABEL.findall(line)).get("lora_name")):
            resident.add(adapter)
    return EngineScrape(int(totals.get(RUNNING, 0.0)), int(totals.get(WAITING, 0.0)), totals.get(PREFIX_CACHE_HITS),
                        totals.get(GENERATION_TOKENS), _lora_slots(info, resident))


def _names(text: str | None) -> frozenset[str]:
    return frozenset(n for n in (text or "").split(",") if n)


def _lora_slots(info: dict[str, str] | None, resident: set[str]) -> AdapterSlots | None:
    """An engine without our resident lines (vLLM) counts its running adapters as resident,
    as llm-d's lora-affinity scorer does."""
    if info is None or not (info.get("max_lora") or "").isdigit():
        return None
    running, waiting = _names(info.get("running_lora_adapters")), _names(info.get("waiting_lora_adapters"))
    return AdapterSlots(int(info["max_lora"]), frozenset(resident) or running, running, waiting)
