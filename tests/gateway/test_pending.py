"""The pending record (gateway/routing/pending.py) through PrefixIndex: blocks a
gateway routed to an engine count as held there until its feed reports them,
a TTL passes (an injected clock), the engine leaves or restarts, or the
per-endpoint cap pushes them out; a run draws only when it is long enough and
its engine idle enough; on for one router, off for several."""
import pytest

from pagedkube.gateway.routing.pending import (
    DEFAULT_PENDING_MAX_LOAD, DEFAULT_PENDING_MIN_BLOCKS, DEFAULT_PENDING_TTL_S, PendingBlocks, pending_ttl_for)
from pagedkube.gateway.routing.prefix_index import PrefixIndex

A, B = "http://a:8000", "http://b:8000"
H = [bytes([i]) * 32 for i in range(40)]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def index(ttl: float = 10.0, capacity: int = 1000, min_blocks: int = 1) -> tuple[PrefixIndex, Clock]:
    """min_blocks=1: the record's mechanics on short prompts (its gate has tests of its own)."""
    clock = Clock()
    return PrefixIndex(pending_ttl=ttl, pending_capacity=capacity, clock=clock, pending_min_blocks=min_blocks), clock


def test_on_by_default_for_one_router_off_for_several_and_zero_records_nothing():
    assert DEFAULT_PENDING_TTL_S > 0 and PrefixIndex().pending.enabled
    assert pending_ttl_for(1) == DEFAULT_PENDING_TTL_S and pending_ttl_for(1, 2.5) == 2.5
    assert pending_ttl_for(2) == pending_ttl_for(8) == 0.0
    with pytest.raises(ValueError, match="replicas"):
        pending_ttl_for(0)
    idx, _ = index(ttl=0.0)
    idx.routed(A, H[:4])
    assert idx.match_depths(H[:4], [A, B]) == {A: 0, B: 0} and len(idx.pending) == 0


def test_a_pending_run_draws_only_when_long_enough_and_its_engine_idle_enough():
    idx = PrefixIndex()                                     # the defaults: 16 blocks, load <= 1
    n = DEFAULT_PENDING_MIN_BLOCKS
    idx.routed(A, H[:n + 6])
    idx.routed(B, H[20:20 + n - 1])
    assert idx.match_depths(H[:n + 2], [A], {A: DEFAULT_PENDING_MAX_LOAD}) == {A: n + 2}
    assert idx.match_depths(H[:n + 2], [A], {A: DEFAULT_PENDING_MAX_LOAD + 1}) == {A: 0}   # busy: no draw
    assert idx.match_depths(H[:n + 2], [A], {}) == {A: n + 2}        # an engine with no load yet counts 0
    assert idx.match_depths(H[:n - 1], [A], {A: 0}) == {A: 0}         # a prompt sharing a short run: none
    assert idx.match_depths(H[20:20 + n - 1], [B], {B: 0}) == {B: 0}  # a short pending run: none
    # A held prefix counts in full whatever the load; only the pending run after it is gated.
    idx.stored(A, H[:4], "ea")
    assert idx.match_depths(H[:n + 6], [A], {A: 5}) == {A: 4}
    assert idx.match_depths(H[:n + 6], [A], {A: 1}) == {A: n + 6}
    idx.stored(B, H[20:24], "eb")        # 4 held + 11 pending: the pending run alone is too short
    assert idx.match_depths(H[20:20 + n - 1], [B], {B: 0}) == {B: 4}


def test_routed_blocks_count_as_held_on_that_engine_only():
    idx, _ = index()
    idx.routed(A, H[:6])
    assert idx.match_depths(H[:8], [A, B]) == {A: 6, B: 0}
    # A prompt sharing only the first three blocks matches three.
    assert idx.match_depths(H[:3] + [H[11]], [A]) == {A: 3}
    assert idx.num_hashes(A) == 0   # pending is not held: the held set is the feed's alone


def test_pending_extends_a_held_prefix_and_skips_what_is_held():
    idx, _ = index()
    idx.stored(A, H[:3], "ea")
    idx.routed(A, H[:6])            # H0-H2 are held: only H3-H5 become pending
    assert len(idx.pending) == 3
    assert idx.match_depths(H[:8], [A]) == {A: 6}
    idx.removed(A, [H[1]], "ea")    # the engine evicted H1: the prefix breaks there
    assert idx.match_depths(H[:8], [A]) == {A: 1}


def test_the_feeds_stored_event_clears_pending_blocks():
    idx, _ = index()
    idx.routed(A, H[:4])
    idx.stored(A, H[:2], "ea")
    assert len(idx.pending) == 2 and idx.match_depths(H[:4], [A]) == {A: 4}
    idx.stored(A, H[2:4], "ea")
    assert len(idx.pending) == 0 and idx.match_depths(H[:4], [A]) == {A: 4}
    # Once stored, a removal is the feed's word: nothing pending props the block up.
    idx.removed(A, H[:4], "ea")
    assert idx.match_depths(H[:4], [A]) == {A: 0}


def test_pending_blocks_expire_after_the_ttl():
    idx, clock = index(ttl=2.0)
    idx.routed(A, H[:3])
    clock.now += 1.0
    idx.routed(A, H[3:5])           # routed a second later: expires a second later
    assert idx.match_depths(H[:5], [A]) == {A: 5}
    clock.now += 1.0                # the first three are 2 s old
    assert idx.match_depths(H[:5], [A]) == {A: 0} and len(idx.pending) == 2
    clock.now += 1.0
    assert len(idx.pending) == 0
    idx.routed(A, H[:1])            # routing again renews a block
    assert idx.match_depths(H[:5], [A]) == {A: 1}


def test_pending_blocks_go_with_the_engine():
    idx, _ = index()
    idx.routed(A, H[:3])
    idx.routed(B, H[:3])
    idx.drop(A)                     # A left the endpoint set
    assert idx.match_depths(H[:3], [A, B]) == {A: 0, B: 3}
    idx.stored(B, [H[9]], "b1")
    idx.stored(B, [H[10]], "b2")    # B restarted (a new engine_id): its in-flight prompts are gone
    assert idx.match_depths(H[:3], [B]) == {B: 0} and len(idx.pending) == 0
    idx.routed(B, H[:2])
    idx.reset(B, [H[11]], "b2")     # a snapshot of the same engine (the feed fell behind): still in flight
    assert idx.match_depths(H[:2], [B]) == {B: 2}
    idx.reset(B, [H[11]], "b3")     # a snapshot from a newer restart: gone
    assert idx.match_depths(H[:2], [B]) == {B: 0}


def test_each_endpoint_keeps_at_most_capacity_pending_blocks_oldest_out_first():
    idx, _ = index(capacity=4)
    idx.routed(A, H[:3])
    idx.routed(A, H[5:8])
    assert len(idx.pending) == 4
    assert idx.match_depths(H[:3], [A]) == {A: 0}          # H0, H1 pushed out
    assert idx.match_depths([H[2]] + H[5:8], [A]) == {A: 4}
    idx.routed(B, H[:4])
    assert len(idx.pending) == 8                           # the cap is per endpoint


def test_a_prompt_longer_than_the_cap_keeps_its_head():
    """A prompt of more blocks than the cap records its leading blocks (what a
    match needs), not its tail."""
    idx, _ = index(capacity=4)
    idx.routed(A, H[:10])
    assert len(idx.pending) == 4 and idx.match_depths(H[:10], [A]) == {A: 4}


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="TTL"):
        PendingBlocks(ttl=-1)
    with pytest.raises(ValueError, match="capacity"):
        PendingBlocks(ttl=1, capacity=0)
    with pytest.raises(ValueError, match="min_blocks"):
        PendingBlocks(ttl=1, min_blocks=0)
    with pytest.raises(ValueError, match="max_load"):
        PendingBlocks(ttl=1, max_load=-1)


def test_the_flag_reaches_the_gateways_index_and_bad_values_are_refused():
    import argparse

    from pagedkube.gateway.app import Gateway
    from pagedkube.gateway.cli import config_from_args, register
    from pagedkube.gateway.config import GatewayConfig

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    config = config_from_args(parser.parse_args(["gateway", "--endpoints", "http://a:8000", "--pending-ttl", "2.5"]))
    assert config.pending_ttl == 2.5 and Gateway(config).index.pending.ttl == 2.5
    default = config_from_args(parser.parse_args(["gateway", "--endpoints", "http://a:8000"]))
    assert default.pending_ttl == DEFAULT_PENDING_TTL_S and Gateway(default).index.pending.enabled
    off = config_from_args(parser.parse_args(["gateway", "--endpoints", "http://a:8000", "--pending-ttl", "0"]))
    assert not Gateway(off).index.pending.enabled
    with pytest.raises(ValueError, match="--pending-ttl"):
        GatewayConfig(endpoints=["http://a:8000"], pending_ttl=-1.0)
