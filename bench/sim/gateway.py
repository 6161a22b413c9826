"""One gateway (router) replica in the simulation, built from the gateway's own
objects: EndpointSet (clocked by the simulation) for load, PrefixIndex fed by
the engines' stored/removed events, and the picker app.build_picker would make.

Load, as in the gateway (gateway/endpoints.py): this replica's own requests in
flight (exact) + other replicas' requests as of its last scrape of the engine
(running + waiting less its own then). The cache_aware policy counts only its
own requests in flight, as vllm-router does; `llm-d` only the scrape (llmd.py).
A LoRA request under `prefix` goes through the gateway's adapter affinity
(gateway/routing/adapters.py) over the scraped adapter slots.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from pagedkube.gateway.endpoints import READY, EndpointSet
from pagedkube.gateway.routing.adapters import AdapterAffinity, AdapterSlots
from pagedkube.gateway.routing.bounded_load import DEFAULT_LOAD_BOUND, DEFAULT_LOAD_FLOOR, BoundedLoad
from pagedkube.gateway.routing.keys import DEFAULT_RING_KEY_BLOCKS
from pagedkube.gateway.routing.picker import DEFAULT_AFFINITY_DEPTH, PrefixPicker
from pagedkube.gateway.routing.policies import LeastLoadPicker, RoundRobinPicker
from pagedkube.gateway.routing.pending import (
    DEFAULT_PENDING_MAX_LOAD, DEFAULT_PENDING_MIN_BLOCKS, pending_ttl_for)
from pagedkube.gateway.routing.prefix_index import DEFAULT_CAPACITY, PrefixIndex
from pagedkube.gateway.routing.ring import DEFAULT_VNODES, HashRing, RingCache
from pagedkube.gateway.routing.types import Decision, RoutingInput

from sim.cache_aware import CacheAwareConfig, CacheAwarePicker
from sim.llmd import LLMD, LlmdPicker

POLICIES = ("prefix", "round-robin", "least-load", "cache-aware", "llm-d", "ideal")


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """A routing policy and its knobs; `label` names it in tables and charts."""
    name: str
    load_bound: float = DEFAULT_LOAD_BOUND
    load_floor: int = DEFAULT_LOAD_FLOOR
    affinity_depth: int | None = DEFAULT_AFFINITY_DEPTH
    ring_key_blocks: int = DEFAULT_RING_KEY_BLOCKS
    # The pending record (gateway --pending-ttl): None = as deployed (on with one
    # router, off with several: pending_ttl_for); 0 = off; S = on for S seconds.
    pending_ttl: float | None = None
    pending_min_blocks: int = DEFAULT_PENDING_MIN_BLOCKS
    pending_max_load: int = DEFAULT_PENDING_MAX_LOAD
    cache_aware: CacheAwareConfig = CacheAwareConfig()
    adapter_affinity: bool = True      # prefix: LoRA requests by adapter tiers first (routing/adapters.py)

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {self.name!r}")

    @property
    def label(self) -> str:
        if self.name != "prefix":
            return self.name
        rule = "head" if self.affinity_depth is None else "any" if self.affinity_depth == 0 \
            else f"depth{self.affinity_depth}"
        pending = "" if self.pending_ttl is None else f" pending={self.pending_ttl:g}s"
        if (self.pending_min_blocks, self.pending_max_load) != (DEFAULT_PENDING_MIN_BLOCKS, DEFAULT_PENDING_MAX_LOAD):
            pending += f" pending-gate={self.pending_min_blocks}b,load<={self.pending_max_load}"
        tiers = "" if self.adapter_affinity else " no-adapter-tiers"
        return f"prefix c={self.load_bound:g} floor={self.load_floor} {rule} key={self.ring_key_blocks}{pending}{tiers}"


class _MemoRing:
    """A HashRing's walks, remembered: a walk is a pure function of the endpoint
    set and the key, and a session walks from the same key on every turn."""
    __slots__ = ("ring", "walks", "size")

    def __init__(self, ring: HashRing, size: int):
        self.ring, self.walks, self.size = ring, {}, size

    def walk(self, key: bytes) -> list[str]:
        walk = self.walks.get(key)
        if walk is None:
            walk = self.walks[key] = self.ring.walk(key)
            if len(self.walks) > self.size:
                del self.walks[next(iter(self.walks))]   # the oldest: only speed depends on it
        return list(walk)

    def __len__(self) -> int:
        return len(self.ring)


class WalkMemo(RingCache):
    """The gateway's RingCache with remembered walks, shared by a run's gateway
    replicas: the same answers as RingCache (tests/sim/test_fleet.py checks the
    rows are identical), found once per session instead of at every decision
    (bench/simulate.py's profile at 256 engines: the walk was a quarter of the run)."""

    def __init__(self, vnodes: int = DEFAULT_VNODES, size: int = 1 << 16):
        super().__init__(vnodes)
        self.size = size
        self._last: list[str] | None = None
        self._memo: _MemoRing | None = None

    def get(self, endpoints: Iterable[str]) -> _MemoRing:   # type: ignore[override]
        endpoints = list(endpoints)
        if endpoints != self._last or self._memo is None:
            self._last, self._memo = endpoints, _MemoRing(super().get(endpoints), self.size)
        return self._memo


class SimGateway:
    def __init__(self, name: str, urls: list[str], policy: PolicySpec, clock: Callable[[], float],
                 vnodes: int = DEFAULT_VNODES, index_capacity: int = DEFAULT_CAPACITY,
                 rings: RingCache | None = None, replicas: int = 1):
        """`replicas`: how many gateway replicas route this fleet (the pending
        record's default depends on it, as the operator deploys it)."""
        self.name = name
        self.policy = policy
        self.clock = clock
        self.endpoints = EndpointSet(clock=clock)
        self.endpoints.update(dict.fromkeys(urls, READY))
        ttl = pending_ttl_for(replicas) if policy.pending_ttl is None else policy.pending_ttl
        self.index = PrefixIndex(index_capacity, pending_ttl=ttl, clock=clock,
                                 pending_min_blocks=policy.pending_min_blocks,
                                 pending_max_load=policy.pending_max_load)
        rings = rings if rings is not None else RingCache(vnodes)
        if policy.name == "round-robin":
            self.picker = RoundRobinPicker()
        elif policy.name == "least-load":
            self.picker = LeastLoadPicker(rings)
        elif policy.name == "cache-aware":
            self.picker = CacheAwarePicker(policy.cache_aware)
        elif policy.name == LLMD:
            self.picker = LlmdPicker(self.index, f"{name}/llm-d")
        else:   # prefix, and ideal (one engine: any picker answers it)
            bound = BoundedLoad(policy.load_bound, policy.load_floor)
            prefix = PrefixPicker(self.index, bound, rings, policy.affinity_depth)
            self.picker = AdapterAffinity(prefix, self.endpoints.adapter_slots) if policy.adapter_affinity else prefix

    def loads(self) -> dict[str, int]:
        if isinstance(self.picker, CacheAwarePicker):
            return {u: self.endpoints.in_flight(u) for u in self.endpoints.routable()}
        return self.endpoints.loads(self.endpoints.routable())

    def route(self, request: RoutingInput) -> Decision:
        endpoints = self.endpoints.routable()
        if isinstance(self.picker, CacheAwarePicker):
            decision = self.picker.pick(request, endpoints, self.loads(), self.clock())
        else:
            decision = self.picker.pick(request, endpoints, self.loads())
            self.index.routed(decision.endpoint, request.block_hashes)   # as Gateway.handle does
        self.endpoints.acquire(decision.endpoint)
        return decision

    def would_choose(self, request: RoutingInput) -> str | None:
        """The endpoint this replica would pick now, without side effects (None
        for round-robin, whose counter makes the question meaningless)."""
        endpoints = self.endpoints.routable()
        if isinstance(self.picker, RoundRobinPicker):
            return None
        if isinstance(self.picker, CacheAwarePicker):
            return self.picker.choose(request, endpoints, self.loads())[0]
        return self.picker.pick(request, endpoints, self.loads()).endpoint

    def release(self, url: str) -> None:
        self.endpoints.release(url)

    def scraped(self, url: str, running: int, waiting: int, kv_usage: float = 0.0,
                lora: AdapterSlots | None = None) -> None:
        self.endpoints.set_scraped(url, running, waiting, self.endpoints.in_flight(url), lora=lora)
        if isinstance(self.picker, LlmdPicker):
            self.picker.scraped[url] = (waiting, kv_usage, lora)

    def feed(self, url: str, engine_id: str, events: list[tuple[str, list[bytes]]]) -> None:
        for event_type, hashes in events:
            if event_type == "stored":
                self.index.stored(url, hashes, engine_id)
            else:
                self.index.removed(url, hashes, engine_id)

    def evict_tree(self) -> None:
        if isinstance(self.picker, CacheAwarePicker):
            self.picker.evict()
