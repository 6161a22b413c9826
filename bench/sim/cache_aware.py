"""SGLang's / vLLM's router `cache_aware` policy, re-implemented for the simulator.

Sources (read, not copied): vllm-project/router src/policies/cache_aware.rs and
src/tree.rs (the Rust router that `vllm-router` on PyPI ships), whose policy
comment and SGLang's sgl-router README state it:

* Each router replica keeps an approximate radix tree of the prompts *it* sent,
  each node tagged with the workers (tenants) it sent them to and when; nothing
  comes from the engines.
* A system is imbalanced when (max_load - min_load) > balance_abs_threshold AND
  max_load > min_load x balance_rel_threshold; load is the router's own count of
  requests in flight per worker. Imbalanced: the least-loaded worker (the
  prompt is still inserted under it).
* Balanced: the longest prefix match in the tree; match rate = matched / prompt
  length. Above cache_threshold: the worker holding the match (the tree returns
  one tenant of the deepest matched node); otherwise the worker whose tree is
  smallest. Either way the prompt is inserted under the chosen worker.
* Every eviction_interval_secs, each tenant's part of the tree is cut to
  max_tree_size, least recently used leaves first.

vllm-router 0.1.17's defaults (vllm_router/router_args.py in its wheel):
cache_threshold 0.3, balance_abs_threshold 64, balance_rel_threshold 1.5,
eviction_interval_secs 120, max_tree_size 2^25 characters per worker.

Our differences, all of granularity: the tree is over the prompt's token
blocks (their chained hashes: a node per block, so a hash identifies the whole
prefix up to it) instead of characters, sizes and match rates count tokens, and
among the tenants of the deepest node the most recently used one is returned
(the Rust tree returns the first in its map's order, which is arbitrary).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from pagedkube.gateway.routing.types import Decision, RoutingInput

CACHE_AWARE = "cache_aware"


@dataclass(frozen=True, slots=True)
class CacheAwareConfig:
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    eviction_interval_s: float = 120.0
    max_tree_tokens: int = 2 ** 25   # the Rust default counts characters; we count tokens


class CacheAwarePicker:
    """One router replica's tree and policy. `pick` decides and records (the
    router inserts every routed prompt); `choose` only decides, for measuring
    how often replicas would disagree."""

    def __init__(self, config: CacheAwareConfig = CacheAwareConfig()):
        self.config = config
        # block hash -> {tenant: last access}; hashes are chained, so each is a tree node.
        self._nodes: dict[bytes, dict[str, float]] = {}
        self._children: dict[bytes, int] = {}          # node -> number of child nodes (leaf: 0)
        self._parent: dict[bytes, bytes | None] = {}
        self._size: dict[str, int] = {}                 # tokens per tenant
        self._block_size = 16

    def _match(self, hashes: Sequence[bytes]) -> tuple[int, str | None]:
        depth, tenant = 0, None
        for i, h in enumerate(hashes):
            tenants = self._nodes.get(h)
            if not tenants:
                break
            depth = i + 1
            tenant = max(tenants, key=lambda t: (tenants[t], t))
        return depth, tenant

    def choose(self, request: RoutingInput, endpoints: Sequence[str], loads: Mapping[str, int]) -> tuple[str, str]:
        c = self.config
        values = [loads.get(e, 0) for e in endpoints]
        hi, lo = max(values), min(values)
        if hi - lo > c.balance_abs_threshold and hi > lo * c.balance_rel_threshold:
            return min(endpoints, key=lambda e: (loads.get(e, 0), e)), "imbalanced"
        depth, tenant = self._match(request.block_hashes)
        rate = depth * request.block_size / request.num_prompt_tokens if request.num_prompt_tokens else 0.0
        if rate > c.cache_threshold and tenant in endpoints:
            return tenant, "cache_hit"
        return min(endpoints, key=lambda e: (self._size.get(e, 0), e)), "cache_miss"

    def pick(self, request: RoutingInput, endpoints: Sequence[str], loads: Mapping[str, int],
             now: float = 0.0) -> Decision:
        chosen, reason = self.choose(request, endpoints, loads)
        self.insert(request.block_hashes, chosen, now)
        self._block_size = request.block_size
        depth, _ = self._match(request.block_hashes)
        order = (chosen,) + tuple(sorted(e for e in endpoints if e != chosen))
        return Decision(endpoints=order, reason=f"{CACHE_AWARE}:{reason}", matched_blocks=depth, loads=dict(loads))

    def insert(self, hashes: Sequence[bytes], tenant: str, now: float) -> None:
        parent = None
        for h in hashes:
            tenants = self._nodes.get(h)
            if tenants is None:
                tenants = self._nodes[h] = {}
                self._parent[h] = parent
                self._children[h] = 0
                if parent is not None:
                    self._children[parent] += 1
            if tenant not in tenants:
                self._size[tenant] = self._size.get(tenant, 0) + self._block_size
            tenants[tenant] = now
            parent = h

    def evict(self, max_tokens: int | None = None) -> None:
        """Cut each tenant to max_tokens, its least recently used leaves first."""
        limit = self.config.max_tree_tokens if max_tokens is None else max_tokens
        for tenant, size in list(self._size.items()):
            if size <= limit:
                continue
            # A tenant's leaves: its nodes none of whose children it also holds.
            held = {h for h, ts in self._nodes.items() if tenant in ts}
            has_child = {self._parent[h] for h in held if self._parent[h] is not None}
            leaves = sorted((self._nodes[h][tenant], h) for h in held if h not in has_child)
            while size > limit and leaves:
                _, h = leaves.pop(0)
                del self._nodes[h][tenant]
                size -= self._block_size
                parent = self._parent[h]
                if not self._nodes[h]:
                    self._drop(h)
                if parent is not None and tenant in self._nodes.get(parent, {}):
                    siblings_held = False   # parent becomes a leaf of this tenant unless another child is held
                    for child in held:
                        if child != h and self._parent.get(child) == parent and tenant in self._nodes.get(child, {}):
                            siblings_held = True
                            break
                    if not siblings_held:
                        leaves.append((self._nodes[parent][tenant], parent))
                        leaves.sort()
            self._size[tenant] = size

    def _drop(self, h: bytes) -> None:
        parent = self._parent.pop(h)
        del self._nodes[h]
        del self._children[h]
        if parent is not None and parent in self._children:
            self._children[parent] -= 1

    def tree_tokens(self, tenant: str) -> int:
        return self._size.get(tenant, 0)
