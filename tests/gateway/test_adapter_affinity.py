"""Adapter affinity (gateway/routing/adapters.py): resident first, then a free slot, then the
fewest busy adapters, each within the bound, prefix and ring inside the tier; and the scrape
that feeds it (gateway/engine_metrics.py) from a real engine metrics page."""
import hashlib

from pagedkube.engine.llm_engine import EngineStats
from pagedkube.engine.server.metrics import EngineMetrics
from pagedkube.gateway.endpoints import EndpointSet
from pagedkube.gateway.engine_metrics import parse_engine_metrics
from pagedkube.gateway.routing.adapters import AdapterAffinity, AdapterSlots, adapter_tier
from pagedkube.gateway.routing.bounded_load import BoundedLoad
from pagedkube.gateway.routing.picker import PrefixPicker
from pagedkube.gateway.routing.prefix_index import PrefixIndex
from pagedkube.gateway.routing.ring import HashRing, RingCache
from pagedkube.gateway.routing.types import RoutingInput

PODS = [f"http://10.0.0.{i}:8000" for i in range(1, 5)]
IDLE = dict.fromkeys(PODS, 0)


def request(tag: str, lora: str | None = "dogs") -> RoutingInput:
    hashes = tuple(hashlib.sha256(f"{tag}/{i}".encode()).digest() for i in range(4))
    return RoutingInput(ring_key=hashlib.sha256(tag.encode()).digest(), block_hashes=hashes,
                        num_prompt_tokens=67, lora_name=lora)


def picker(slots: dict[str, AdapterSlots], index: PrefixIndex | None = None, c: float = 1.25, floor: int = 0):
    inner = PrefixPicker(index or PrefixIndex(), BoundedLoad(c, floor), RingCache())
    return AdapterAffinity(inner, lambda urls: {u: slots[u] for u in urls if u in slots})


def slots(*resident: str, max_loras: int = 2, running: tuple[str, ...] = ()) -> AdapterSlots:
    return AdapterSlots(max_loras, frozenset(resident), frozenset(running))


def test_tiers():
    assert adapter_tier("dogs", slots("cats", "dogs")) == 0
    assert adapter_tier("dogs", slots("cats")) == 1                                  # a free slot
    assert adapter_tier("dogs", slots("cats", "diet")) == 2                          # full, both idle
    assert adapter_tier("dogs", slots("cats", "diet", running=("cats",))) == 3
    assert adapter_tier("dogs", None) == 2


def test_the_engine_holding_the_adapter_wins_over_the_ring_owner():
    req = request("x")
    walk = HashRing(PODS).walk(req.ring_key)
    state = {walk[0]: slots("cats", "diet"), walk[1]: slots("a", "b"), walk[2]: slots("dogs", "b"), walk[3]: slots()}
    d = picker(state).pick(req, PODS, IDLE)
    assert d.endpoint == walk[2] and d.reason == "ring"          # the ring's first of the tier
    assert sorted(d.endpoints) == sorted(PODS) and d.endpoints[1:] == tuple(e for e in walk if e != walk[2])


def test_among_holders_the_prefix_decides_then_the_bound_moves_it():
    req = request("x")
    walk = HashRing(PODS).walk(req.ring_key)
    index = PrefixIndex()
    index.stored(walk[3], req.block_hashes[:3])
    index.stored(walk[0], req.block_hashes)                      # deepest, but does not hold the adapter
    state = {e: slots("dogs") for e in walk[1:]} | {walk[0]: slots("cats", "diet")}
    d = picker(state, index).pick(req, PODS, IDLE)
    assert (d.endpoint, d.reason, d.matched_blocks) == (walk[3], "affinity", 3)
    # walk[3] over the fleet's bound (ceil(1.25 * 7 / 4) = 3): the other holders, ring order
    d = picker(state, index).pick(req, PODS, IDLE | {walk[3]: 6})
    assert d.endpoint == walk[1]


def test_resident_nowhere_goes_to_a_free_slot_then_to_the_least_busy_slots():
    req = request("x")
    walk = HashRing(PODS).walk(req.ring_key)
    state = {walk[0]: slots("a", "b", running=("a",)), walk[1]: slots("c", "d", running=("c", "d")),
             walk[2]: slots("e", "f"), walk[3]: slots("g")}
    assert picker(state).pick(req, PODS, IDLE).endpoint == walk[3]          # free slot
    state[walk[3]] = slots("g", "h", running=("g", "h"))
    assert picker(state).pick(req, PODS, IDLE).endpoint == walk[2]          # full, nothing busy
    state[walk[2]] = slots("e", "f", running=("e",))
    assert picker(state).pick(req, PODS, IDLE).endpoint == walk[0]          # one busy: the ring's first of them
    # the least disruptive engine over the bound gives way to the next tier
    assert picker(state).pick(req, PODS, IDLE | {walk[0]: 6, walk[2]: 6}).endpoint == walk[1]   # both 2 busy


def test_base_requests_and_engines_without_slots_route_as_before():
    req = request("x", lora=None)
    plain = PrefixPicker(PrefixIndex(), BoundedLoad(1.25, 0), RingCache())
    state = {e: slots("dogs") for e in PODS}
    assert picker(state).pick(req, PODS, IDLE) == plain.pick(req, PODS, IDLE)
    assert picker({}).pick(request("x"), PODS, IDLE) == plain.pick(request("x"), PODS, IDLE)


def test_a_real_engine_page_reports_its_slots_to_the_endpoint_set():
    stats = EngineStats(num_running=1, num_waiting=1, kv_cache_usage=0.1, prefix_cache_queries=0,
                        prefix_cache_hits=0, num_preemptions=0, num_kv_blocks=8, num_free_blocks=4,
                        running_lora_adapters=("dogs",), waiting_lora_adapters=("diet",),
                        num_lora_slot_loads=5, resident_lora_adapters=("cats", "dogs"))
    page = EngineMetrics("tiny", lambda: (stats, 0), max_lora=2).render().decode()
    scrape = parse_engine_metrics(page)
    assert scrape.lora == AdapterSlots(2, frozenset({"cats", "dogs"}), frozenset({"dogs"}), frozenset({"diet"}))
    eps = EndpointSet()
    eps.update({PODS[0]: "ready", PODS[1]: "ready"})
    eps.set_scraped(PODS[0], scrape.running, scrape.waiting, 0, lora=scrape.lora)
    eps.set_scraped(PODS[1], 0, 0, 0)
    assert eps.adapter_slots(PODS) == {PODS[0]: scrape.lora}
    assert parse_engine_metrics(EngineMetrics("tiny", lambda: (stats, 0)).render().decode()).lora is None
    # vLLM exports no resident lines: its running adapters count as resident (llm-d's reading)
    vllm = 'vllm:lora_requests_info{max_lora="4",running_lora_adapters="a,b",waiting_lora_adapters=""} 1.7e9\n'
    assert parse_engine_metrics(vllm).lora == AdapterSlots(4, frozenset("ab"), frozenset("ab"), frozenset())
