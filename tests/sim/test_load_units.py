"""Which load unit predicts TTFT (issue 17, "the decision"): the simulator can trace,
for every request, the chosen engine's load in requests (the bound's unit) and in
prompt tokens it has still to prefill, and reports Spearman's rho of each with TTFT."""
import math
from dataclasses import fields, replace

import pytest

from sim.engine import EngineConfig, SimEngine, SimRequest
from sim.events import EventLoop
from sim.fleet import FleetConfig, simulate, spearman
from sim.gateway import PolicySpec
from sim.timing import PROFILES
from sim.workloads import WorkloadSpec

RHO = ("ttft_rho_requests", "ttft_rho_backlog", "ttft_rho_backlog_own")


def test_spearman_ranks_with_ties():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ranks (0, 1.5, 1.5, 3) against (0, 1, 2, 3): 4.5 / sqrt(4.5 * 5)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(4.5 / math.sqrt(22.5))
    assert math.isnan(spearman([5, 5, 5], [1, 2, 3]))      # a constant side
    assert math.isnan(spearman([1, 2], [1, 2]))            # too few pairs


def test_prefill_backlog_counts_uncached_prompt_tokens():
    loop = EventLoop()
    engine = SimEngine("e0", loop, EngineConfig(num_blocks=64, block_size=16), PROFILES["cpu"])
    prompt = list(range(1000, 1100))                        # 100 tokens: 6 full blocks can be hits
    engine.submit(SimRequest("a", prompt, [1, 2]))
    engine.submit(SimRequest("b", prompt + [7] * 20, [1, 2]))
    assert engine.prefill_backlog() == 100 + 120            # nothing cached yet
    loop.run()
    assert engine.prefill_backlog() == 0
    engine.submit(SimRequest("c", prompt, [1, 2]))
    assert engine.prefill_backlog() == 100 - 6 * 16          # the cache serves 6 blocks; the rest is work


def test_tracing_changes_no_result_and_reports_each_unit():
    fleet = FleetConfig(engines=8, engine=EngineConfig(num_blocks=512))
    spec = WorkloadSpec(kind="petcare", sessions=200, rate=80.0, think_s=0.5, turns=(2, 5), answer_tokens=(8, 16))
    plain = simulate(fleet, spec, PolicySpec("prefix"))
    traced = simulate(replace(fleet, trace_load=True), spec, PolicySpec("prefix"))
    others = [f.name for f in fields(plain) if f.name not in RHO]
    assert {k: getattr(traced, k) for k in others} == {k: getattr(plain, k) for k in others}
    assert all(math.isnan(getattr(plain, k)) for k in RHO)
    assert all(-1.0 <= getattr(traced, k) <= 1.0 for k in RHO)
    # What docs/benchmarks.md reports at fleet scale holds here too: the tokens an engine
    # has to prefill, with the request's own, predict its TTFT better than its request count.
    assert traced.ttft_rho_backlog_own > traced.ttft_rho_requests
