"""Consistent-hash ring: deterministic walks, ~1/N key movement, bounded loads."""
import hashlib

import pytest

from pagedkube.gateway.routing.bounded_load import BoundedLoad
from pagedkube.gateway.routing.ring import HashRing, RingCache

PODS = [f"http://10.0.0.{i}:8000" for i in range(1, 5)]


def key(i: int) -> bytes:
    return hashlib.sha256(f"key-{i}".encode()).digest()


def test_walk_visits_every_endpoint_once_and_is_order_independent():
    ring = HashRing(PODS)
    again = HashRing(list(reversed(PODS)) + [PODS[0]])
    for i in range(200):
        walk = ring.walk(key(i))
        assert sorted(walk) == sorted(PODS)
        assert walk == again.walk(key(i))


def test_every_endpoint_owns_about_a_quarter_of_keys():
    ring = HashRing(PODS)
    counts = {p: 0 for p in PODS}
    for i in range(8000):
        counts[ring.owner(key(i))] += 1
    for n in counts.values():
        assert 0.17 < n / 8000 < 0.33, counts


def test_adding_an_endpoint_moves_only_about_one_nth_of_keys_and_only_to_it():
    before, after = HashRing(PODS), HashRing(PODS + ["http://10.0.0.5:8000"])
    moved = [i for i in range(8000) if before.owner(key(i)) != after.owner(key(i))]
    assert all(after.owner(key(i)) == "http://10.0.0.5:8000" for i in moved)
    assert 0.12 < len(moved) / 8000 < 0.28  # ideal 1/5


def test_removing_an_endpoint_moves_only_its_keys():
    before, after = HashRing(PODS), HashRing(PODS[1:])
    for i in range(4000):
        if before.owner(key(i)) != PODS[0]:
            assert after.owner(key(i)) == before.owner(key(i))
        else:  # its keys go to the next endpoint of their walk
            assert after.owner(key(i)) == before.walk(key(i))[1]


def test_empty_ring_and_validation():
    assert HashRing([]).walk(key(1)) == []
    with pytest.raises(ValueError):
        HashRing(PODS, vnodes=0)
    cache = RingCache()
    assert cache.get(PODS) is cache.get(list(reversed(PODS)))


def test_bounded_load_capacity_is_ceil_c_times_mean_after_adding_one():
    bound = BoundedLoad(1.25, floor=0)
    loads = {PODS[0]: 3, PODS[1]: 1, PODS[2]: 0, PODS[3]: 0}
    # total 4, one more: ceil(1.25 * 5 / 4) = 2
    assert bound.capacity(loads, PODS) == 2
    assert bound.first_within(PODS, loads, PODS) == PODS[1]
    assert bound.first_within([PODS[0], PODS[2]], loads, PODS) == PODS[2]
    with pytest.raises(ValueError):
        BoundedLoad(0.9)


def test_bounded_load_always_finds_room_and_caps_max_over_mean():
    """Feed 400 requests that all share one key, never finishing: the bound must
    spread them so that max load <= ceil(c * mean) at every step."""
    bound, ring = BoundedLoad(1.25, floor=0), HashRing(PODS)
    loads = dict.fromkeys(PODS, 0)
    walk = ring.walk(key(7))
    for n in range(400):
        chosen = bound.first_within(walk, loads, PODS)
        loads[chosen] += 1
        assert max(loads.values()) <= -(-1.25 * (n + 1) // 4)
    assert loads[walk[0]] == 125 == max(loads.values())  # the key's owner fills to c x mean


def test_bounded_load_floor():
    """Below the floor an engine always takes one more; above it, c x mean rules."""
    bound = BoundedLoad(1.5, floor=4)
    assert bound.capacity(dict.fromkeys(PODS, 0), PODS) == 4           # ceil(1.5 * 1 / 4) = 1 < 4
    assert bound.capacity({PODS[0]: 3}, PODS) == 4
    assert bound.capacity(dict.fromkeys(PODS, 8), PODS) == 13          # ceil(1.5 * 33 / 4)
    loads = dict.fromkeys(PODS, 0)
    walk = HashRing(PODS).walk(key(3))
    for _ in range(4):                                                 # one key, never finishing
        loads[bound.first_within(walk, loads, PODS)] += 1
    assert loads[walk[0]] == 4 and sum(loads.values()) == 4            # the owner takes the first four
    with pytest.raises(ValueError):
        BoundedLoad(1.5, floor=-1)
