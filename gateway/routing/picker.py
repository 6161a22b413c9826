"""The prefix-aware picker (DESIGN.md §6): affinity first, then the bounded-load ring.

1. The endpoint holding the most of the prompt's leading blocks, if it is
   within the load bound; when several hold that many, the earliest of them in
   the ring walk for this request's key that is within the bound.
2. Otherwise walk the ring from the key to the first endpoint within the bound
   (its blocks, if it holds a shorter prefix, still count as matched).

A holder of a shorter prefix gets no preference in step 2: in a chat, that is
an engine holding only the shared system prompt, and preferring those would
send every moved session of that prompt to them while an engine that never got
the prompt sat idle (measured: one of four engines unused for a whole run at
c = 1.5, docs/benchmarks.md).

The reason is `affinity` or `ring` when the choice is what an unbounded router
would have made (the deepest holder, or the ring owner), `overflow` when the
bound moved the request elsewhere, and `fallback` when the request carried no
block hashes (no tokenizer or feed yet: the key is a hash of the raw text).
"""
from __future__ import annotations

from typing import Mapping, Sequence

from pagedkube.gateway.routing.bounded_load import BoundedLoad
from pagedkube.gateway.routing.ring import RingCache
from pagedkube.gateway.routing.types import (
    AFFINITY, FALLBACK, OVERFLOW, RING, Decision, PrefixSource, RoutingInput, predicted_cached_tokens,
)


class PrefixPicker:
    def __init__(self, prefix: PrefixSource, bound: BoundedLoad, rings: RingCache):
        self.prefix = prefix
        self.bound = bound
        self.rings = rings

    def pick(self, request: RoutingInput, endpoints: Sequence[str], loads: Mapping[str, int]) -> Decision:
        assert endpoints, "pick() needs at least one endpoint"
        walk = self.rings.get(endpoints).walk(request.ring_key)
        capacity = self.bound.capacity(loads, walk)
        fits = [e for e in walk if self.bound.within(e, loads, capacity)]

        depths = self.prefix.match_depths(request.block_hashes, walk) if request.block_hashes else {}
        deepest = max(depths.values(), default=0)
        chosen = None
        if deepest > 0:
            holders = [e for e in walk if depths.get(e, 0) == deepest]
            preferred = holders[0]
            chosen = next((e for e in holders if e in fits), None)
        else:
            preferred = walk[0]
        if chosen is None:
            chosen = fits[0] if fits else self.bound.first_within(walk, loads, walk)
        matched = depths.get(chosen, 0)

        if not request.tokenized:
            reason = FALLBACK
        elif chosen != preferred:
            reason = OVERFLOW
        else:
            reason = AFFINITY if matched else RING
        order = (chosen,) + tuple(e for e in walk if e != chosen)
        return Decision(
            endpoints=order,
            reason=reason,
            matched_blocks=matched,
            predicted_cached_tokens=predicted_cached_tokens(matched, request.num_prompt_tokens, request.block_size),
            loads=dict(loads),
        )
