"""The prefix-aware picker (DESIGN.md §6): affinity first, then the bounded-load ring.

1. Among the endpoints holding at least `required_depth` of the prompt's
   leading blocks, the one holding the most, if it is within the load bound;
   when several hold that many, the earliest of them in the ring walk for this
   request's key that is within the bound.
2. Otherwise walk the ring from the key to the first endpoint within the bound
   (its blocks, if it holds a shorter prefix, still count as matched).

The depth a holder needs (`affinity_depth`):
  0 (the default)  any held prefix: a chat's first turn goes to an engine that
                   holds its system prompt, ties broken by the session's own
                   ring walk (its key covers its whole head, keys.py);
  None ("head")    the request's whole ring-key head (RoutingInput.head_blocks):
                   a first turn, all head, is drawn by no one and goes to its
                   ring owner;
  N                at least min(N, head) blocks.
DESIGN.md §6 set "head" as the default after four-engine runs where, with a
16-block ring key, the earlier rule left one engine idle at c = 1.5. The fleet
simulator overturned it once the key covers the whole head and the bound has a
floor: "any" kept first turns on engines that already hold their product
prompt and reached 0.962 of hit rate against 0.942 at 16 engines and low load,
the same at high load, and 0.829 against 0.807 on the four-engine benchmark's
workload (docs/benchmarks.md "Simulator: routing at fleet scale").

A holder of a shorter prefix than the deepest gets no preference in step 2: in
a chat, that is an engine holding only the shared system prompt, and
preferring those would send every moved session of that prompt to them while
an engine that never got the prompt sat idle (measured: one of four engines
unused for a whole run at c = 1.5, docs/benchmarks.md "Routing").

The reason is `affinity` or `ring` when the choice is what an unbounded router
would have made (the deepest qualifying holder, or the ring owner), `overflow`
when the bound moved the request elsewhere, and `fallback` when the request
carried no block hashes (no tokenizer or feed yet: the key is a hash of the raw
text).
"""
from __future__ import annotations

from typing import Mapping, Sequence

from pagedkube.gateway.routing.bounded_load import BoundedLoad
from pagedkube.gateway.routing.ring import RingCache
from pagedkube.gateway.routing.types import (
    AFFINITY, FALLBACK, OVERFLOW, RING, Decision, PrefixSource, RoutingInput, predicted_cached_tokens,
)


# 0: any held prefix draws a request (the simulator's choice, docstring above);
# None: the whole ring-key head; N: at least min(N, head) blocks.
DEFAULT_AFFINITY_DEPTH: int | None = 0


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

    def pick(self, request: RoutingInput, endpoints: Sequence[str], loads: Mapping[str, int]) -> Decision:
        assert endpoints, "pick() needs at least one endpoint"
        walk = self.rings.get(endpoints).walk(request.ring_key)
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
        order = (chosen,) + tuple(e for e in walk if e != chosen)
        return Decision(
            endpoints=order,
            reason=reason,
            matched_blocks=matched,
            predicted_cached_tokens=predicted_cached_tokens(matched, request.num_prompt_tokens, request.block_size),
            loads=dict(loads),
        )
