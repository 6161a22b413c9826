"""The cache_aware re-implementation follows the published policy (bench/sim/cache_aware.py)."""
import hashlib

from pagedkube.gateway.routing.types import RoutingInput

from sim.cache_aware import CacheAwareConfig, CacheAwarePicker

W = ["w0", "w1", "w2"]


def req(tag: str, shared: int, own: int) -> RoutingInput:
    hashes = tuple(hashlib.sha256(f"s/{i}".encode()).digest() for i in range(shared)) + \
        tuple(hashlib.sha256(f"{tag}/{i}".encode()).digest() for i in range(own))
    return RoutingInput(ring_key=b"k" * 32, block_hashes=hashes, num_prompt_tokens=16 * (shared + own) + 1)


def test_match_above_threshold_goes_to_the_holder_below_it_to_the_smallest_tree():
    p = CacheAwarePicker(CacheAwareConfig(cache_threshold=0.3))
    idle = dict.fromkeys(W, 0)
    first = p.pick(req("a", 4, 4), W, idle, now=1.0)
    assert first.endpoint == "w0" and first.reason == "cache_aware:cache_miss"     # all trees empty: ties by name
    assert p.tree_tokens("w0") == 8 * 16
    # 4 of 9 blocks' worth matches (> 0.3): the holder, whatever the other trees' sizes.
    assert p.pick(req("b", 4, 5), W, idle, now=2.0).endpoint == "w0"
    # 1 shared block of 10 (< 0.3): the smallest tree, w1.
    other = p.pick(req("c", 1, 9), W, idle, now=3.0)
    assert other.endpoint == "w1" and other.reason == "cache_aware:cache_miss"


def test_imbalance_needs_both_thresholds_and_sends_to_the_least_loaded():
    p = CacheAwarePicker(CacheAwareConfig(balance_abs_threshold=4, balance_rel_threshold=1.5))
    p.pick(req("a", 4, 4), W, dict.fromkeys(W, 0))
    r = req("a", 4, 5)
    assert p.choose(r, W, {"w0": 5, "w1": 2, "w2": 2})[0] == "w0"     # difference 3 <= 4: cache decides
    assert p.choose(r, W, {"w0": 9, "w1": 3, "w2": 2}) == ("w2", "imbalanced")
    assert p.choose(r, W, {"w0": 20, "w1": 15, "w2": 14})[0] == "w0"  # 20 > 14 + 4 but not > 14 * 1.5


def test_eviction_cuts_each_tenant_lru_leaves_first():
    p = CacheAwarePicker()
    old, new = req("old", 2, 3), req("new", 2, 3)
    p.insert(old.block_hashes, "w0", now=1.0)
    p.insert(new.block_hashes, "w0", now=2.0)
    assert p.tree_tokens("w0") == 8 * 16      # 2 shared + 3 + 3 blocks
    p.evict(max_tokens=5 * 16)
    assert p.tree_tokens("w0") == 5 * 16
    # The old branch went first; the shared blocks and the new branch stay.
    assert p.choose(new, W, dict.fromkeys(W, 0))[0] == "w0"
    assert p._match(old.block_hashes) == (2, "w0")
    p.evict(max_tokens=0)
    assert p.tree_tokens("w0") == 0 and p._match(new.block_hashes) == (0, None)
