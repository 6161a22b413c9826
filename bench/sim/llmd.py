"""llm-d's endpoint picker as the simulator's `llm-d` policy, re-implemented from its
scorers (the Gateway API Inference Extension's scheduling plugins, which llm-d's
inference scheduler runs), for the LoRA comparison in docs/benchmarks.md
"Simulator: LoRA adapters".

Each scorer gives every endpoint a score in [0, 1]; the picker takes the endpoint with
the highest weighted sum, ties broken at random (its max-score picker shuffles first):

    prefix      3   the share of the prompt's blocks the endpoint holds (the precise
                    variant: the engines' KV events, here the same PrefixIndex ours reads)
    queue       2   (max - q) / (max - min) of the scraped waiting queues; 1 when all equal
    kv-cache    2   1 - the scraped KV-cache usage
    lora        1   1.0 the adapter has requests running there; 0.8 running + waiting
                    adapters < max_lora (room to load one); 0.6 it waits there; else 0

The weights are those of a published llm-d scheduling profile with all four scorers.
The lora scorer reads vLLM's vllm:lora_requests_info only: an adapter resident in a slot
with no request running counts as absent. Load is only what the scrape says (no count
of the router's own requests in flight); llm-d refreshes it every 50 ms (its default
--refresh-metrics-interval), which fleet.py gives this policy.
"""
from __future__ import annotations

import random
from typing import Mapping, Sequence

from pagedkube.gateway.routing.adapters import AdapterSlots
from pagedkube.gateway.routing.prefix_index import PrefixIndex
from pagedkube.gateway.routing.types import Decision, RoutingInput

LLMD = "llm-d"
WEIGHTS = {"prefix": 3.0, "queue": 2.0, "kv-cache": 2.0, "lora": 1.0}
SCRAPE_INTERVAL_S = 0.05


def lora_score(name: str | None, slots: AdapterSlots | None) -> float:
    if name is None or slots is None:
        return 0.0
    if name in slots.running:
        return 1.0
    if slots.num_busy < slots.max_loras:
        return 0.8
    if name in slots.waiting:
        return 0.6
    return 0.0


def queue_scores(waiting: Mapping[str, int], endpoints: Sequence[str]) -> dict[str, float]:
    queues = [waiting.get(e, 0) for e in endpoints]
    lo, hi = min(queues), max(queues)
    return {e: 1.0 if hi == lo else (hi - waiting.get(e, 0)) / (hi - lo) for e in endpoints}


class LlmdPicker:
    """One llm-d scheduler replica; `scraped` is what its last metrics refresh read, per endpoint:
    (waiting queue, KV-cache usage 0..1, adapter slots or None)."""

    def __init__(self, index: PrefixIndex, seed: str):
        self.index = index
        self.rng = random.Random(seed)
        self.scraped: dict[str, tuple[int, float, AdapterSlots | None]] = {}

    def scores(self, request: RoutingInput, endpoints: Sequence[str]) -> dict[str, float]:
        state = {e: self.scraped.get(e, (0, 0.0, None)) for e in endpoints}
        queue = queue_scores({e: s[0] for e, s in state.items()}, endpoints)
        depths = self.index.match_depths(request.block_hashes, endpoints) if request.block_hashes else {}
        blocks = max(1, len(request.block_hashes))
        return {e: WEIGHTS["prefix"] * depths.get(e, 0) / blocks + WEIGHTS["queue"] * queue[e]
                + WEIGHTS["kv-cache"] * (1.0 - state[e][1]) + WEIGHTS["lora"] * lora_score(request.lora_name, state[e][2])
                for e in endpoints}

    def pick(self, request: RoutingInput, endpoints: Sequence[str], loads: Mapping[str, int]) -> Decision:
        assert endpoints, "pick() needs at least one endpoint"
        scores = self.scores(request, endpoints)
        shuffled = list(endpoints)
        self.rng.shuffle(shuffled)
        chosen = max(shuffled, key=lambda e: scores[e])   # the first of the best after the shuffle
        return Decision(endpoints=(chosen,) + tuple(e for e in shuffled if e != chosen), reason=LLMD,
                        loads=dict(loads))
