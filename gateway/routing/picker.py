"""The prefix-aware picker (DESIGN.md §6): affinity first, then the bounded-load ring.

1. Among endpoints within the load bound that hold a prefix of the prompt's
   blocks, the one holding the most; ties go to the earlier one in the ring
   walk for this request's key.
2. Otherwise walk the ring from the key to the first endpoint within the bound.

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
        chosen, matched = None, 0
        if deepest > 0:
            best_fit = max((depths[e] for e in fits), default=0)
            if best_fit > 0:
                chosen = next(e for e in fits if depths[e] == best_fit)
                matched = best_fit
            preferred = next(e for e in walk if depths[e] == deepest)
        else:
            preferred = walk[0]
        if chosen is None:
            chosen = fits[0] if fits else self.bound.first_within(walk, loads, walk)

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
