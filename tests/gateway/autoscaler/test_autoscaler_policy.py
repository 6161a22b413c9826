"""The desired-replica rule and HPA's stabilization windows on scripted sequences (fake clock)."""
from __future__ import annotations

import pytest

from pagedkube.gateway.autoscaler.policy import (
    FALLBACK_SCALE_IN_GRACE_S, AutoscalerConfig, Stabilizer, bounded, desired_for_in_flight, desired_replicas,
    in_flight_queue_depth, scale_in_grace)


@pytest.mark.parametrize("ready,current,queue,target,expected", [
    (1, 1, 12, 4, 3),      # 12 waiting on one engine, 4 each -> 3
    (2, 2, 9, 4, 3),       # mean 4.5 -> ratio 1.125 > tolerance -> ceil(2.25) = 3
    (2, 2, 8.6, 4, 2),     # mean 4.3 -> ratio 1.075: within tolerance -> unchanged
    (2, 3, 8.4, 4, 3),     # within tolerance keeps the count asked for (an engine still loading)
    (3, 3, 16, 4, 4),      # 3 * (16/3)/4 = 4 exactly, no float round-up to 5
    (4, 4, 0, 4, 0),       # empty queue -> as few as allowed
    (4, 4, 3, 4, 1),
    (0, 0, 1, 4, 1),       # scale from zero: one held request asks for one engine
    (0, 2, 5, 4, 2),       # none ready yet but two asked for: keep them
    (0, 0, 0, 4, 0),
])
def test_desired_replicas(ready, current, queue, target, expected):
    assert desired_replicas(ready, current, queue, target, 0.1) == expected


# The scenario of the issue that brought the in-flight signal: --max-num-seqs 8 (S), --target-queue-depth 4 (T).
@pytest.mark.parametrize("ready,current,in_flight,expected", [
    (1, 1, 40, 4),     # 40 clients: ceil(40 / (8 + 4)) = 4 (bounded to 3 by --max-replicas)
    (3, 3, 12, 2),     # 12 long streams: the fewest engines that still run all 12: ceil(12 / 7.2) = 2
    (2, 2, 12, 2),     # ... and there it stays while they run (one engine would queue 4 for minutes)
    (2, 2, 15, 2),     # between up (ceil(15/12) = 2) and down (ceil(15/7.2) = 3): kept, the hysteresis band
    (2, 2, 25, 3),     # beyond T per engine: up
    (3, 3, 0, 0),      # idle: as few as allowed
    (1, 1, 8, 1),      # a busy engine with an empty queue: kept (the old signal saw 0 and scaled in)
    (0, 0, 1, 1),      # scale from zero
    (0, 0, 0, 0),
    (1, 1, 12, 1),     # 12 = 8 running + 4 waiting: at the target, not above it
])
def test_desired_for_in_flight(ready, current, in_flight, expected):
    assert desired_for_in_flight(ready, current, in_flight, 8, 4, 0.1) == expected


def test_in_flight_queue_depth_counts_what_the_running_slots_cannot_hold():
    assert [in_flight_queue_depth(d, 2, 8) for d in (0, 16, 20)] == [0, 0, 4]
    with pytest.raises(ValueError, match="negative"):
        desired_for_in_flight(1, 1, -1, 8, 4, 0.1)


def test_a_steady_load_near_a_boundary_does_not_flip_flop():
    # in flight wanders 13..24 on 2 engines (up at 25, down at 7.2 or fewer): the count stays.
    out = [desired_for_in_flight(2, 2, d, 8, 4, 0.1) for d in (13, 18, 24, 8, 17, 21, 15)]
    assert out == [2] * 7
    # the same wander on 3 engines keeps 3 while it can still need them (more than 14.4 in flight)
    assert [desired_for_in_flight(3, 3, d, 8, 4, 0.1) for d in (15, 18, 24, 21)] == [3] * 4


def test_the_scale_in_grace_is_set_or_derived_from_the_longest_request():
    assert scale_in_grace(AutoscalerConfig(scale_in_grace=90), 4096, 20.0) == 90
    assert scale_in_grace(AutoscalerConfig(), 4096, 20.0) == pytest.approx(1.25 * 4096 / 20)   # 256 s
    assert scale_in_grace(AutoscalerConfig(), None, 20.0) == FALLBACK_SCALE_IN_GRACE_S
    assert scale_in_grace(AutoscalerConfig(), 4096, None) == FALLBACK_SCALE_IN_GRACE_S


def test_desired_replicas_rejects_negative_inputs():
    with pytest.raises(ValueError, match="negative"):
        desired_replicas(-1, 1, 0, 4, 0.1)


def test_bounds():
    c = AutoscalerConfig(min_replicas=1, max_replicas=3)
    assert [bounded(n, c) for n in (0, 1, 2, 3, 7)] == [1, 1, 2, 3, 3]
    z = AutoscalerConfig(min_replicas=0, max_replicas=2)
    assert [bounded(n, z) for n in (0, 1, 5)] == [0, 1, 2]


@pytest.mark.parametrize("kwargs,message", [
    (dict(min_replicas=-1), "min-replicas"), (dict(min_replicas=3, max_replicas=2), "max-replicas"),
    (dict(max_replicas=0, min_replicas=0), "max-replicas"), (dict(target_queue_depth=0), "target-queue-depth"),
    (dict(scale_down_window=-1), "window"), (dict(interval=0), "interval"), (dict(tolerance=1.0), "tolerance"),
    (dict(max_held=-1), "max-held"), (dict(engine_capacity=0), "engine-capacity"),
    (dict(signal="cpu"), "scale-signal"), (dict(scale_in_grace=-1), "scale-in-grace"),
])
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AutoscalerConfig(**kwargs)


def run(stab: Stabilizer, script: list[tuple[float, int]], start: int) -> list[int]:
    """Feeds (time, raw recommendation) and applies each result, as the loop does."""
    current, out = start, []
    for t, rec in script:
        current = stab.recommend(rec, current, t)
        out.append(current)
    return out


def test_scale_up_window_takes_the_smallest_recent_recommendation():
    stab = Stabilizer(scale_up_window=3.0, scale_down_window=10.0)
    # a one-tick spike does not scale up; a burst held for the 3 s window does
    script = [(0, 1), (1, 5), (2, 1), (3, 4), (4, 4), (5, 4), (6, 4), (7, 6)]
    assert run(stab, script, 1) == [1, 1, 1, 1, 1, 1, 4, 4]


def test_zero_scale_up_window_follows_at_once():
    stab = Stabilizer(scale_up_window=0.0, scale_down_window=10.0)
    assert run(stab, [(0, 1), (1, 3), (2, 5)], 1) == [1, 3, 5]


def test_scale_down_window_takes_the_largest_recent_recommendation():
    stab = Stabilizer(scale_up_window=0.0, scale_down_window=5.0)
    # the load falls at t=1; a dip back up at t=3 restarts the wait for the lull
    script = [(0, 4), (1, 1), (2, 1), (3, 2), (4, 1), (5, 1), (6, 1), (7, 1), (8, 1), (9, 1)]
    assert run(stab, script, 4) == [4, 4, 4, 4, 4, 4, 2, 2, 2, 1]


def test_flapping_load_does_not_flap_the_replicas():
    stab = Stabilizer(scale_up_window=0.0, scale_down_window=5.0)
    script = [(t, 3 if t % 2 == 0 else 1) for t in range(20)]
    out = run(stab, script, 1)
    assert out == [3] * 20
    changes = sum(1 for a, b in zip([1] + out, out) if a != b)
    assert changes == 1


def test_within_both_windows_current_is_kept():
    stab = Stabilizer(scale_up_window=2.0, scale_down_window=2.0)
    # recommendations on both sides of current inside both windows: no change
    assert run(stab, [(0, 2), (1, 3), (2, 1)], 2) == [2, 2, 2]


def test_history_is_bounded_by_the_longest_window():
    stab = Stabilizer(scale_up_window=1.0, scale_down_window=3.0)
    for t in range(100):
        stab.recommend(1, 1, float(t))
    assert len(stab._history) == 4   # t-3 .. t inclusive
