"""The prefix-aware picker (docs/design.md "Gateway"): affinity first, then the bounded-load ring.

1. Among the endpoints holding at least `required_depth` of the prompt's
   leading blocks, the one holding the most, if it is within the load bound;
   when several hold that many, the earliest of them in the ring walk for this
   request's key that is within the bound.
2. Otherwise walk the ring from the key to the first endpoint within the bound
   (its blocks, if it holds a shorter prefix, still count as matched).

The depth a holder needs (`affinity_depth`): 0 (the default) any held prefix,
so a chat's first turn goes to an engine holding its system prompt; None
("head") the request's whole ring-key head (RoutingInput.head_blocks); N at
least min(N, head) blocks. Why 0: docs/design.md "Defaults" (docs/benchmarks.md
"The ring key, the floor and the affinity rule").

A holder of a shorter prefix than the deepest gets no preference in step 2:
engines holding only a shared system prompt would draw every moved session of
that prompt while another engine sat idle (docs/benchmarks.md "Routing (CPU)").

The reason is `affinity` or `ring` when the choice is what an unbounded router
would have made (the deepest qualifying holder, or the ring owner), `overflow`
when the bound moved the request elsewhere, and `fallback` when the request
carried no block hashes (no tokenizer or feed yet: the key is a hash of the raw
text).
"""
from __future__ import annotations

from typing import Collection, Mapping, Sequence

from pagedkube.gateway.routing.bounded_load import BoundedLoad
from pagedkube.gateway.routing.ring import RingCache
from pagedkube.gateway.routing.types import (
    AFFINITY, FALLBACK, OVERFLOW, RING, Decision, PrefixSource, RoutingInput, predicted_cached_tokens,
)


DEFAULT_AFFINITY_DEPTH: int | None = 0   # any held prefix (docstring above)


class PrefixPicker:
    def __init__(self, prefix: PrefixSource, bound: BoundedLoad, rings: RingCache,
                 affinity_depth: int | None = DEFAULT_AFFINITY_DEPTH):
        if affinity_depth is not None and affinity_depth < 0:
            raise ValueError(f"affinity depth must be >= 0 or None (the whole head), got {affinity_depth}")
        self.prefix = prefix
        self.bound = bound
        self.rings = rings
        self.affinity_depth = affinity_depth

    def required_depth(self, request: RoutingInput) -> int:
        """Leading blocks a holder needs to draw `request` by affinity (at least 1)."""
        head = request.head_blocks if self.affinity_depth is None else min(request.head_blocks, self.affinity_depth)
        return max(1, min(head, len(request.block_hashes)))

    def pick(self, request: RoutingInput, endpoints: Sequence[str], loads: Mapping[str, int],
             among: Collection[str] | None = None) -> Decision:
        """`among`: choose only among these of `endpoints` (the bound over them too), as
        a picker given just those would, without building their own ring (adapters.py);
        the others follow in the retry order."""
        assert endpoints, "pick() needs at least one endpoint"
        ring_walk = self.rings.get(endpoints).walk(request.ring_key)
        # A subset's ring walk is the whole ring's walk without the others: points depend
        # only on endpoint names (ring.py).
        walk = ring_walk if among is None else [e for e in ring_walk if e in among]
        assert walk, "among must name at least one of endpoints"
        capacity = self.bound.capacity(loads, walk)
        fits = [e for e in walk if self.bound.within(e, loads, capacity)]

        depths = self.prefix.match_depths(request.block_hashes, walk, loads) if request.block_hashes else {}
        deepest = max(depths.values(), default=0)
        chosen = None
        if deepest >= self.required_depth(request):
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
        order = (chosen,) + tuple(e for e in ring_walk if e != chosen)
        return Decision(
            endpoints=order,
            reason=reason,
            matched_blocks=matched,
            predicted_cached_tokens=predicted_cached_tokens(matched, request.num_prompt_tokens, request.block_size),
            loads=dict(loads),
        )
