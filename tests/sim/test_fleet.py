"""Issue 17's Must-show on the simulator: deterministic, the ideal bounds every
policy, and on the seeded pet-care workload at 16 engines the default routing
against the ideal, round-robin and the cache_aware re-implementation, with one
and two gateway replicas, at low and high load. Sized for CI (seconds per run);
the large sweeps are bench runs (docs/benchmarks.md "Simulator: routing at fleet scale")."""
from dataclasses import replace

import pytest

from pagedkube.gateway.routing.bounded_load import DEFAULT_LOAD_BOUND
from pagedkube.gateway.routing.pending import DEFAULT_PENDING_TTL_S

from sim.engine import EngineConfig
from sim.fleet import FleetConfig, simulate
from sim.gateway import PolicySpec
from sim.timing import PROFILES
from sim.workloads import WorkloadSpec

FLEET = FleetConfig(engines=16, engine=EngineConfig(num_blocks=512))
# Pet-care: 3 product prompts of 500-2,000 tokens, a dog profile, 2-5 turns, 0.5 s think time.
PETCARE = WorkloadSpec(kind="petcare", think_s=0.5, turns=(2, 5), answer_tokens=(8, 16))
LOADS = {"low": replace(PETCARE, sessions=160, rate=8.0),      # ~1 request in flight per engine
         "high": replace(PETCARE, sessions=400, rate=160.0)}    # ~6 per engine: above the floor of 4
POLICIES = {"ideal": PolicySpec("ideal"), "round-robin": PolicySpec("round-robin"),
            "cache-aware": PolicySpec("cache-aware"), "default": PolicySpec("prefix")}


@pytest.fixture(scope="module")
def grid():
    return {(load, r, name): simulate(replace(FLEET, replicas=r), spec, policy)
            for load, spec in LOADS.items() for r in (1, 2) for name, policy in POLICIES.items()}


def test_same_seed_same_output_other_seed_other_output():
    fleet = replace(FLEET, engines=4, replicas=2)
    spec = replace(PETCARE, sessions=24, rate=6.0)
    a = simulate(fleet, spec, PolicySpec("prefix")).row()
    b = simulate(fleet, spec, PolicySpec("prefix")).row()
    assert a == b
    # Remembered ring walks (the simulator's speed-up) change nothing.
    assert simulate(replace(fleet, memo_walks=False), spec, PolicySpec("prefix")).row() == a
    c = simulate(replace(fleet, seed=1), replace(spec, seed=1), PolicySpec("prefix")).row()
    assert (c["hit_rate"], c["ttft_p50_s"]) != (a["hit_rate"], a["ttft_p50_s"])


@pytest.mark.parametrize("kind", ["petcare", "sharegpt", "tenants"])
def test_the_ideal_bounds_every_policy(kind):
    fleet = replace(FLEET, engines=4, engine=EngineConfig(num_blocks=1024))
    spec = WorkloadSpec(kind=kind, sessions=40, rate=10.0, think_s=0.5, turns=(1, 4), answer_tokens=(4, 8))
    ideal = simulate(fleet, spec, PolicySpec("ideal")).hit_rate
    others = {p.label: simulate(fleet, spec, p).hit_rate for p in (
        PolicySpec("round-robin"), PolicySpec("least-load"), PolicySpec("cache-aware"), PolicySpec("prefix"),
        PolicySpec("prefix", load_bound=1.25, load_floor=0, affinity_depth=None, ring_key_blocks=16))}
    assert all(hit <= ideal for hit in others.values()), (ideal, others)
    if kind == "sharegpt":   # nothing shared between sessions: only a session's own turns hit
        assert ideal < 0.9


@pytest.mark.parametrize("load", ["low", "high"])
@pytest.mark.parametrize("replicas", [1, 2])
def test_default_routing_against_ideal_round_robin_and_cache_aware(grid, load, replicas):
    run = {name: grid[(load, replicas, name)] for name in POLICIES}
    ours, ideal, rr, ca = run["default"], run["ideal"], run["round-robin"], run["cache-aware"]
    assert ours.hit_rate >= 0.90 * ideal.hit_rate
    # 2x round-robin on the whole prompt is arithmetically out of reach here: every
    # engine caches the three product prompts under any policy, so round-robin hits
    # 0.83-0.86 and even the ideal is below twice that. The 2x target applies to what
    # routing controls: the tokens after the product prompt (profile and conversation).
    assert ideal.hit_rate < 2 * rr.hit_rate
    assert ours.session_hit_rate >= 2 * rr.session_hit_rate
    # The default matches or beats cache_aware in every cell, on the whole prompt and beyond
    # the product prompt.
    assert ours.session_hit_rate >= ca.session_hit_rate
    assert ours.hit_rate >= ca.hit_rate
    if (load, replicas) == ("low", 1):
        # The cell the stateless rule lost: two sessions of a product arrived while
        # its first session's prefill was still running (one 3 ms after it), before
        # any feed could report the blocks. The one router's pending record sends
        # them to that engine, as cache_aware's tree does: 3 cold product prompts
        # (ring decisions), like its 3 misses, and nothing moved.
        assert ours.reasons == {"ring": 3, "affinity": ours.requests - 3}
        assert ours.hit_rate == ca.hit_rate
    if load == "high":
        # The bound holds at each placement on the gateway's view; over the run each
        # engine's mean load stays within c of the mean (1.54 at R=1: requests end unevenly).
        assert ours.max_mean_run <= DEFAULT_LOAD_BOUND + 0.05
        assert ours.ttft_p99_s < ca.ttft_p99_s
    if replicas == 1:
        assert ours.disagreement == 0.0
    else:
        # With the feed's 5 ms delay and 1 s scrapes replicas differ on some decisions
        # at high load (none at low load, where the floor keeps every choice on the
        # holder), where cache_aware's private trees differ on most.
        assert ours.disagreement < ca.disagreement
        assert (ours.disagreement > 0.0) == (load == "high")


def test_replicas_with_identical_views_never_disagree():
    """Feed events delivered at once and loads scraped before every decision:
    two and four replicas choose as one (docs/design.md "Gateway")."""
    for replicas in (2, 4):
        fleet = replace(FLEET, replicas=replicas, feed_delay_s=0.0, scrape_interval_s=0.0)
        result = simulate(fleet, LOADS["high"], PolicySpec("prefix"))
        assert result.disagreement == 0.0 and result.requests > 500
    delayed = simulate(replace(FLEET, replicas=2, feed_delay_s=0.05), LOADS["high"], PolicySpec("prefix"))
    assert 0.0 < delayed.disagreement < 0.5


def test_the_pending_record_is_the_one_routers_and_its_gate_keeps_it_from_concentrating_load(grid):
    """The pending record (pending.py): on by default for a gateway that is the
    fleet's one router, off with several (pending_ttl_for, as the operator
    deploys it). With one router it wins the low-load cell exactly as
    cache_aware does; ungated (any pending run draws, to any engine within the
    bound) it concentrated the first burst of each product on its first engine
    at high load (a lower hit rate, more moves), and drew every cold first turn
    of the calibration workload, whose sessions share only a short chat
    template and system prompt, to one engine (docs/benchmarks.md "The pending
    record")."""
    off = PolicySpec("prefix", pending_ttl=0)
    low_off = simulate(FLEET, LOADS["low"], off)
    assert grid[("low", 1, "default")].hit_rate > low_off.hit_rate
    assert low_off.reasons == {"ring": 5, "affinity": low_off.requests - 5}
    # Several routers: off, so the default is exactly the stateless rule.
    assert grid[("low", 2, "default")].row() | {"policy": None} == \
        simulate(replace(FLEET, replicas=2), LOADS["low"], off).row() | {"policy": None}

    ungated = PolicySpec("prefix", pending_ttl=DEFAULT_PENDING_TTL_S, pending_min_blocks=1, pending_max_load=1 << 20)
    high, ours_high = simulate(FLEET, LOADS["high"], ungated), grid[("high", 1, "default")]
    assert high.hit_rate < ours_high.hit_rate and high.overflow_share > ours_high.overflow_share

    calibration = FleetConfig(engines=4, time_model=PROFILES["cpu"],
                              engine=EngineConfig(num_blocks=320, max_num_seqs=16))
    chat = WorkloadSpec(kind="bench-petcare", sessions=32, rate=4.0, think_s=0.5, answer_tokens=(20, 40))
    hits = {name: simulate(calibration, chat, policy).hit_rate for name, policy in (
        ("default", PolicySpec("prefix")), ("off", off),
        ("short runs draw", PolicySpec("prefix", pending_min_blocks=4)))}
    assert hits["default"] == hits["off"] > hits["short runs draw"]


def test_a_pending_record_per_replica_breaks_agreement():
    """Why it is off with several routers: each replica knows only its own
    routes, so replicas with identical feeds and loads no longer choose alike."""
    same_views = replace(FLEET, replicas=2, feed_delay_s=0.0, scrape_interval_s=0.0)
    on = PolicySpec("prefix", pending_ttl=DEFAULT_PENDING_TTL_S)
    assert simulate(same_views, LOADS["high"], on).disagreement > 0.0
    assert simulate(same_views, LOADS["high"], PolicySpec("prefix")).disagreement == 0.0
