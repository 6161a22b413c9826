"""Issue 17's Must-show on the simulator: deterministic, the ideal bounds every
policy, and on the seeded pet-care workload at 16 engines the default routing
against the ideal, round-robin and the cache_aware re-implementation, with one
and two gateway replicas, at low and high load. Sized for CI (seconds per run);
the large sweeps are bench runs (docs/benchmarks.md "Simulator: routing at fleet scale")."""
from dataclasses import replace

import pytest

from pagedkube.gateway.routing.bounded_load import DEFAULT_LOAD_BOUND
from pagedkube.gateway.routing.pending import SUGGESTED_PENDING_TTL_S

from sim.engine import EngineConfig
from sim.fleet import FleetConfig, simulate
from sim.gateway import PolicySpec
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
    # Beyond the product prompt the default matches or beats cache_aware in every cell.
    assert ours.session_hit_rate >= ca.session_hit_rate
    if (load, replicas) == ("low", 1):
        # The one cell cache_aware wins on the whole prompt, by two product prompts: two
        # sessions of a product arrived while its first session's prefill was still
        # running, so no engine had reported its blocks and the ring sent them to
        # other engines (5 ring decisions against cache_aware's 3 misses: its tree
        # records a prompt when it routes it). Nothing moved (no overflow), and beyond
        # the product prompt the two are equal (docs/benchmarks.md "Simulator: routing
        # at fleet scale": the cold-start keys and the pending record that close it
        # cost more elsewhere: the pending record's test below).
        assert ours.reasons == {"ring": 5, "affinity": ours.requests - 5}
        assert ca.hit_rate - 0.004 <= ours.hit_rate < ca.hit_rate
    else:
        assert ours.hit_rate >= ca.hit_rate
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
    two and four replicas choose as one (DESIGN §6)."""
    for replicas in (2, 4):
        fleet = replace(FLEET, replicas=replicas, feed_delay_s=0.0, scrape_interval_s=0.0)
        result = simulate(fleet, LOADS["high"], PolicySpec("prefix"))
        assert result.disagreement == 0.0 and result.requests > 500
    delayed = simulate(replace(FLEET, replicas=2, feed_delay_s=0.05), LOADS["high"], PolicySpec("prefix"))
    assert 0.0 < delayed.disagreement < 0.5


def test_the_pending_record_closes_the_low_load_cell_and_costs_elsewhere(grid):
    """--pending-ttl (off by default): each gateway counts the blocks it routed as
    held until the feed reports them. It wins the one cell the default loses to
    cache_aware, exactly as cache_aware does (3 cold product prompts), but at high
    load it concentrates the first burst of each product on its first engine
    (more moves, a lower hit rate), and replicas with identical feeds and loads
    no longer agree, since each knows only its own routes (docs/benchmarks.md
    "The pending record")."""
    pending = PolicySpec("prefix", pending_ttl=SUGGESTED_PENDING_TTL_S)
    low = simulate(FLEET, LOADS["low"], pending)
    ca, ours = grid[("low", 1, "cache-aware")], grid[("low", 1, "default")]
    assert low.hit_rate >= ca.hit_rate > ours.hit_rate
    assert low.reasons == {"ring": 3, "affinity": low.requests - 3}
    high, ours_high = simulate(FLEET, LOADS["high"], pending), grid[("high", 1, "default")]
    assert high.hit_rate < ours_high.hit_rate and high.overflow_share > ours_high.overflow_share
    same_views = replace(FLEET, replicas=2, feed_delay_s=0.0, scrape_interval_s=0.0)
    assert simulate(same_views, LOADS["high"], pending).disagreement > 0.0
