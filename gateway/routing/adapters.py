"""Adapter affinity: a LoRA request goes where its adapter needs no load, then by prefix as usual.

An engine holds `max_loras` adapters in its step's slots (engine/lora/manager.py); a request
for any other adapter it serves costs a load into a slot, evicting the least recently used
one, and must wait while every slot runs requests of other adapters. The engines report
their slots in every scrape (gateway/engine_metrics.py: `pagedkube_engine_lora_resident`,
and vLLM's `vllm:lora_requests_info` for the adapters with requests running / waiting and
`max_lora`). Among the engines that serve the adapter (their /v1/models; the caller
narrows to those), within the load bound over them, the picker takes the best tier:

    0  the adapter is resident: no load
    1  a free slot: a load that evicts nothing
    2+k  every slot full, k adapters with requests running or waiting: the load evicts the
       least recently used slot, which is idle more often the fewer adapters are busy (and
       with k = max_loras the request waits for a slot to drain)

and hands that tier to the prefix picker (deepest held prefix, then the ring walk for the
request's key), so ties spread by the adapter-salted key, replicas agree, and the tier's
own bound still applies. An engine not scraped yet ranks as tier 2 with no busy adapter.
Why this order and not a weighted score: docs/gateway.md "LoRA adapters"; its adapter
loads against round-robin and llm-d's lora-affinity scoring: docs/benchmarks.md
"Simulator: LoRA adapters".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from pagedkube.gateway.routing.picker import PrefixPicker
from pagedkube.gateway.routing.types import Decision, RoutingInput


@dataclass(frozen=True, slots=True)
class AdapterSlots:
    """One engine's adapter slots at its last scrape."""
    max_loras: int
    resident: frozenset[str] = frozenset()   # in a slot: runs without a load
    running: frozenset[str] = frozenset()    # adapters of running requests
    waiting: frozenset[str] = frozenset()    # adapters of waiting requests

    @property
    def num_busy(self) -> int:
        return len(self.running | self.waiting)


UNKNOWN_TIER = 2   # an engine with no slot report yet: as one whose slots are full but idle


def adapter_tier(lora_name: str, slots: AdapterSlots | None) -> int:
    """The module docstring's tiers: lower needs less of a load."""
    if slots is None:
        return UNKNOWN_TIER
    if lora_name in slots.resident:
        return 0
    if len(slots.resident) < slots.max_loras:
        return 1
    return 2 + slots.num_busy


class AdapterAffinity:
    """A Picker: adapter tiers first (LoRA requests only), then `inner` among the best tier.
    `slots(urls)` answers the last scraped AdapterSlots of those engines that reported any."""

    def __init__(self, inner: PrefixPicker, slots: Callable[[Sequence[str]], Mapping[str, AdapterSlots]]):
        self.inner = inner
        self.slots = slots

    def pick(self, request: RoutingInput, endpoints: Sequence[str], loads: Mapping[str, int]) -> Decision:
        assert endpoints, "pick() needs at least one endpoint"
        name = request.lora_name
        slots = self.slots(endpoints) if name is not None else {}
        if name is None or not slots:
            return self.inner.pick(request, endpoints, loads)
        bound = self.inner.bound
        capacity = bound.capacity(loads, endpoints)
        fits = [e for e in endpoints if bound.within(e, loads, capacity)]
        if not fits:   # unreachable for c >= 1 (bounded_load.py); route as without adapters
            return self.inner.pick(request, endpoints, loads)
        tiers = {e: adapter_tier(name, slots.get(e)) for e in fits}
        best = min(tiers.values())
        return self.inner.pick(request, endpoints, loads, among={e for e, t in tiers.items() if t == best})
