"""bench/sim/autoscale.py: the autoscaler's decisions (the gateway's own policy code) over a
coarse fleet model, under loads that move. The in-flight signal with its drain loses nothing;
the old waiting signal, whose scale-in aborts what is left after the drain timeout, does."""
from __future__ import annotations

import pytest

from pagedkube.gateway.autoscaler.policy import AutoscalerConfig
from sim.autoscale import AutoscaledFleet, FleetModel, engine_rate, loads

MODEL = FleetModel()


def run(load, signal: str, seed: int = 0):
    config = AutoscalerConfig(min_replicas=1, max_replicas=6, target_queue_depth=4,
                              engine_capacity=MODEL.max_num_seqs, scale_down_window=300, signal=signal)
    return AutoscaledFleet(config, MODEL, load, seed).run()


@pytest.mark.parametrize("load", loads(MODEL, hours=1.0), ids=lambda load: load.name)
def test_the_in_flight_signal_loses_no_request(load):
    result = run(load, "in-flight")
    assert result.requests > 1000 and result.lost == 0 and result.completed > 0.95 * result.requests


def test_the_old_signal_loses_requests_and_flip_flops_under_a_steady_load():
    steady = loads(MODEL, hours=1.0)[0]
    old, new = run(steady, "waiting"), run(steady, "in-flight")
    assert old.lost > 0 and new.lost == 0
    # one window is 300 s: at most 12 changes an hour would be one per window
    assert new.replica_changes_per_h <= 4 < 12 < old.replica_changes_per_h
    assert new.goodput_tokens_s > old.goodput_tokens_s


def test_runs_are_deterministic_and_the_rate_is_as_stated():
    steady = loads(MODEL, hours=0.5)[0]
    assert run(steady, "in-flight", seed=3) == run(steady, "in-flight", seed=3)
    # 8 slots x 20 tokens/s over a mean answer of 0.8 x 64 + 0.2 x 1200 = 291.2 tokens
    assert engine_rate(MODEL, steady) == pytest.approx(8 * 20 / 291.2)
