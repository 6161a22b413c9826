"""Pickers: affinity within the bound, ring otherwise, replicas agree."""
import hashlib

from pagedkube.gateway.routing.bounded_load import BoundedLoad
from pagedkube.gateway.routing.picker import PrefixPicker
from pagedkube.gateway.routing.policies import LeastLoadPicker, RoundRobinPicker
from pagedkube.gateway.routing.prefix_index import PrefixIndex
from pagedkube.gateway.routing.ring import HashRing, RingCache
from pagedkube.gateway.routing.types import RoutingInput, predicted_cached_tokens

PODS = [f"http://10.0.0.{i}:8000" for i in range(1, 5)]
IDLE = dict.fromkeys(PODS, 0)


def chain(tag: str, n: int) -> tuple[bytes, ...]:
    return tuple(hashlib.sha256(f"{tag}/{i}".encode()).digest() for i in range(n))


def request(tag: str, n_blocks: int = 4, tokens: int | None = None, tokenized: bool = True) -> RoutingInput:
    hashes = chain(tag, n_blocks) if tokenized else ()
    return RoutingInput(ring_key=hashlib.sha256(tag.encode()).digest(), block_hashes=hashes,
                        num_prompt_tokens=tokens if tokens is not None else n_blocks * 16 + 3, tokenized=tokenized)


def make(index=None, c=1.25):
    return PrefixPicker(index or PrefixIndex(), BoundedLoad(c), RingCache())


def test_no_holder_goes_to_the_ring_owner():
    d = make().pick(request("x"), PODS, IDLE)
    assert d.endpoint == HashRing(PODS).owner(hashlib.sha256(b"x").digest())
    assert d.reason == "ring" and d.matched_blocks == 0 and d.predicted_cached_tokens == 0
    assert sorted(d.endpoints) == sorted(PODS)


def test_deepest_holder_wins_and_predicts_cached_tokens():
    index = PrefixIndex()
    req = request("doc", n_blocks=4, tokens=70)
    index.stored(PODS[0], req.block_hashes[:1])
    index.stored(PODS[2], req.block_hashes[:3])
    d = make(index).pick(req, PODS, IDLE)
    assert (d.endpoint, d.reason, d.matched_blocks, d.predicted_cached_tokens) == (PODS[2], "affinity", 3, 48)


def test_holder_over_the_bound_gives_way_to_an_equally_deep_one_then_to_the_ring():
    """DESIGN §6: the deepest holder if within the bound, otherwise the ring. A
    shallower holder (say, of a shared system prompt only) gets no preference: it
    would draw every moved session of that prompt, and leave an engine idle."""
    req = request("doc")
    walk = HashRing(PODS).walk(req.ring_key)
    index = PrefixIndex()
    index.stored(walk[1], req.block_hashes)
    index.stored(walk[3], req.block_hashes)
    index.stored(walk[2], req.block_hashes[:2])
    loads = {walk[0]: 0, walk[1]: 5, walk[2]: 0, walk[3]: 0}  # capacity ceil(1.25*6/4) = 2
    d = make(index).pick(req, PODS, loads)
    assert (d.endpoint, d.reason, d.matched_blocks) == (walk[3], "overflow", 4)
    loads[walk[3]] = 5  # capacity ceil(1.25*11/4) = 4: no deepest holder fits; the ring's first that does
    d = make(index).pick(req, PODS, loads)
    assert (d.endpoint, d.reason, d.matched_blocks, d.predicted_cached_tokens) == (walk[0], "overflow", 0, 0)
    loads[walk[0]] = 5  # capacity 5: the walk reaches the shallow holder, and its blocks count
    d = make(index).pick(req, PODS, loads)
    assert (d.endpoint, d.reason, d.matched_blocks, d.predicted_cached_tokens) == (walk[2], "overflow", 2, 32)


def test_ring_owner_over_the_bound_overflows_along_the_walk():
    req = request("y")
    walk = HashRing(PODS).walk(req.ring_key)
    loads = dict(IDLE, **{walk[0]: 2})  # capacity ceil(1.25*3/4) = 1
    d = make().pick(req, PODS, loads)
    assert (d.endpoint, d.reason) == (walk[1], "overflow")
    assert d.endpoints == (walk[1], walk[0], walk[2], walk[3])


def test_untokenized_requests_are_fallback():
    d = make().pick(request("raw", tokenized=False), PODS, IDLE)
    assert d.reason == "fallback" and d.endpoint == HashRing(PODS).walk(hashlib.sha256(b"raw").digest())[0]


def test_two_replicas_agree_given_the_same_inputs():
    """Two pickers built separately, fed the same feed events, loads and
    endpoint sets (in different orders), make the same choices."""
    a, b = PrefixIndex(), PrefixIndex()
    for index in (a, b):
        for i, pod in enumerate(PODS):
            index.stored(pod, chain(f"doc{i}", 2 + i))
    pa, pb = make(a), make(b)
    for i in range(300):
        req = request(f"doc{i % 6}", n_blocks=5)
        loads = {p: (i * 7 + j) % 3 for j, p in enumerate(PODS)}
        da = pa.pick(req, PODS, loads)
        db = pb.pick(req, list(reversed(PODS)), dict(reversed(list(loads.items()))))
        assert (da.endpoints, da.reason) == (db.endpoints, db.reason)


def test_baselines():
    rr = RoundRobinPicker()
    assert [rr.pick(request("a"), PODS, IDLE).endpoint for _ in range(5)] == sorted(PODS) + [sorted(PODS)[0]]
    ll = LeastLoadPicker(RingCache())
    loads = {PODS[0]: 2, PODS[1]: 0, PODS[2]: 1, PODS[3]: 0}
    d = ll.pick(request("a"), PODS, loads)
    assert d.endpoint in (PODS[1], PODS[3]) and d.reason == "least_load"
    assert d.endpoints[-1] == PODS[0]


def test_predicted_cached_tokens_never_covers_the_last_token():
    assert predicted_cached_tokens(4, 64, 16) == 48   # exactly 4 blocks: the 4th holds the last token
    assert predicted_cached_tokens(4, 65, 16) == 64
    assert predicted_cached_tokens(2, 100, 16) == 32
    assert predicted_cached_tokens(3, 0, 16) == 0
