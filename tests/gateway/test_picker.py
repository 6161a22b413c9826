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


def make(index=None, c=1.25, floor=0, depth=0):
    """The paper's bound (no floor) and any-prefix affinity, unless asked."""
    return PrefixPicker(index or PrefixIndex(), BoundedLoad(c, floor), RingCache(), depth)


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
    """docs/design.md "Gateway": the deepest holder if within the bound, otherwise the ring. A
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


def turn(session: str, n_blocks: int, head_blocks: int, system: str = "sys", system_blocks: int = 2) -> RoutingInput:
    """A chat turn: `system_blocks` blocks of a shared system prompt, then the
    session's own blocks; its ring key covers `head_blocks` of them."""
    hashes = chain(system, system_blocks) + chain(session, n_blocks - system_blocks)
    return RoutingInput(ring_key=hashlib.sha256(session.encode()).digest(), block_hashes=hashes,
                        num_prompt_tokens=n_blocks * 16 + 3, head_blocks=head_blocks)


def test_head_only_rule_a_holder_of_the_system_prompt_alone_does_not_draw_a_first_turn():
    """docs/design.md "Gateway" rule 1: affinity only to an engine holding the request's whole
    ring-key head. A first turn is all head; an engine holding just the shared
    system prompt (2 of its 4 blocks) does not draw it: the ring owner does."""
    first = turn("s1", n_blocks=4, head_blocks=4)
    walk = HashRing(PODS).walk(first.ring_key)
    index = PrefixIndex()
    index.stored(walk[2], first.block_hashes[:2])   # the system prompt only
    d = make(index, c=1.5, depth=None).pick(first, PODS, IDLE)
    assert (d.endpoint, d.reason, d.matched_blocks) == (walk[0], "ring", 0)
    # affinity_depth=0 (the default): any held prefix draws it.
    old = PrefixPicker(index, BoundedLoad(1.5), RingCache(), affinity_depth=0).pick(first, PODS, IDLE)
    assert (old.endpoint, old.reason, old.matched_blocks) == (walk[2], "affinity", 2)
    # A numeric depth asks for min(depth, head) blocks: 2 is met by the system prompt's holder.
    two = PrefixPicker(index, BoundedLoad(1.5), RingCache(), affinity_depth=2).pick(first, PODS, IDLE)
    assert two.endpoint == walk[2]
    assert PrefixPicker(index, BoundedLoad(1.5), RingCache(), affinity_depth=3).pick(first, PODS, IDLE).endpoint \
        == walk[0]


def test_head_only_rule_a_later_turn_follows_its_session_wherever_it_ran():
    """Turn 3 of a session that ran on a non-owner (the bound moved it): that engine
    holds the whole head and more, so it draws the turn by affinity; an engine
    with only the system prompt does not."""
    later = turn("s2", n_blocks=9, head_blocks=4)
    walk = HashRing(PODS).walk(later.ring_key)
    index = PrefixIndex()
    index.stored(walk[0], later.block_hashes[:2])
    index.stored(walk[3], later.block_hashes[:7])
    d = make(index, c=1.5, depth=None).pick(later, PODS, IDLE)
    assert (d.endpoint, d.reason, d.matched_blocks, d.predicted_cached_tokens) == (walk[3], "affinity", 7, 112)


def test_the_floor_keeps_a_session_on_a_lightly_loaded_engine():
    """At low load ceil(c (L + 1) / n) is 1: with no floor one other request on the
    holder moves the session (and its whole history) elsewhere; with floor 4 the
    holder takes it until it has 4."""
    req = request("chat", n_blocks=6)
    walk = HashRing(PODS).walk(req.ring_key)
    index = PrefixIndex()
    index.stored(walk[1], req.block_hashes)
    loads = dict(IDLE, **{walk[1]: 1})                 # capacity ceil(1.5 * 2 / 4) = 1
    assert make(index, c=1.5, floor=0).pick(req, PODS, loads).reason == "overflow"
    d = make(index, c=1.5, floor=4).pick(req, PODS, loads)
    assert (d.endpoint, d.reason, d.matched_blocks) == (walk[1], "affinity", 6)
    loads[walk[1]] = 4                                 # capacity max(ceil(1.5 * 5 / 4), 4) = 4 < 4 + 1
    assert make(index, c=1.5, floor=4).pick(req, PODS, loads).reason == "overflow"
    assert BoundedLoad(1.5, 4).capacity({p: 10 for p in PODS}, PODS) == 16   # above the floor: c x mean


def test_head_only_rule_no_head_blocks_means_any_prefix():
    """A head shorter than one block (head_blocks 0) asks for one block, as before."""
    req = turn("s3", n_blocks=3, head_blocks=0)
    walk = HashRing(PODS).walk(req.ring_key)
    index = PrefixIndex()
    index.stored(walk[1], req.block_hashes[:1])
    assert make(index, c=1.5, depth=None).pick(req, PODS, IDLE).endpoint == walk[1]


def test_defaults_and_bad_values():
    assert (BoundedLoad().c, BoundedLoad().floor) == (1.5, 8)   # docs/design.md "Gateway"'s c; the simulator's floor
    picker = PrefixPicker(PrefixIndex(), BoundedLoad(), RingCache())
    assert picker.affinity_depth == 0   # any held prefix (the simulator overturned "head")
    assert picker.required_depth(turn("s", n_blocks=9, head_blocks=4)) == 1
    head = PrefixPicker(PrefixIndex(), BoundedLoad(), RingCache(), affinity_depth=None)
    assert head.required_depth(turn("s", n_blocks=9, head_blocks=4)) == 4
    assert head.required_depth(turn("s", n_blocks=3, head_blocks=16)) == 3   # never past the prompt
    for bad in (-1, 1.5, True):
        try:
            BoundedLoad(1.5, bad)
        except ValueError as e:
            assert "load floor" in str(e)
        else:
            raise AssertionError(f"floor {bad!r} was accepted")
    for bad in (-1, -5):
        try:
            PrefixPicker(PrefixIndex(), BoundedLoad(), RingCache(), affinity_depth=bad)
        except ValueError as e:
            assert "affinity depth" in str(e)
        else:
            raise AssertionError("a negative depth was accepted")
    try:
        RoutingInput(ring_key=b"k" * 32, head_blocks=-1)
    except ValueError as e:
        assert "head_blocks" in str(e)
    else:
        raise AssertionError("a negative head_blocks was accepted")
