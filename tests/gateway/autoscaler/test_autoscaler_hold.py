"""Holding requests while no engine is ready, and the loop's use of held requests (in-process)."""
from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from prometheus_client import CollectorRegistry

from pagedkube.gateway.autoscaler.autoscaler import Autoscaler
from pagedkube.gateway.autoscaler.metrics import AutoscalerMetrics
from pagedkube.gateway.autoscaler.policy import AutoscalerConfig
from pagedkube.gateway.endpoints import NOT_READY, READY, EndpointSet
from pagedkube.gateway.errors import GatewayError
from pagedkube.gateway.hold import HoldQueue
from scale_targets import RecordingTarget

A, B, C = "http://127.0.0.1:9001", "http://127.0.0.1:9002", "http://127.0.0.1:9003"




def test_held_requests_wait_for_an_engine_and_the_bound_answers_503():
    async def scenario():
        endpoints = EndpointSet()
        endpoints.update({A: NOT_READY})
        hold = HoldQueue(endpoints, timeout=30, max_held=2)
        woken = []
        hold.on_hold = lambda: woken.append(hold.num_held)
        held = [asyncio.create_task(hold.routable()) for _ in range(2)]
        await asyncio.sleep(0.05)
        assert hold.num_held == 2 and woken == [1, 2]
        with pytest.raises(GatewayError) as over:
            await hold.routable()
        endpoints.set_discovered(A, READY)
        served = await asyncio.gather(*held)
        return over.value, served, hold.num_held

    over, served, num_held = asyncio.run(scenario())
    assert (over.status, over.headers) == (503, {"Retry-After": "5"})
    assert over.body()["error"]["type"] == "service_unavailable"
    assert served == [[A], [A]] and num_held == 0


def test_hold_timeout_answers_503_and_zero_timeout_does_not_hold():
    async def scenario():
        endpoints = EndpointSet()
        with pytest.raises(GatewayError) as late:
            await HoldQueue(endpoints, timeout=0.1, max_held=5).routable()
        no_hold = await HoldQueue(endpoints, timeout=0, max_held=5).routable()
        return late.value, no_hold

    late, no_hold = asyncio.run(scenario())
    assert late.status == 503 and "within 0.1 s" in late.message
    assert no_hold == []   # the gateway answers its usual 503 at once


def test_a_held_request_scales_from_zero_and_counts_as_queue():
    async def scenario():
        endpoints = EndpointSet()
        hold = HoldQueue(endpoints, timeout=30, max_held=4)
        target = RecordingTarget(0)
        ticks = iter([0.0, 1.0])
        auto = Autoscaler(AutoscalerConfig(min_replicas=0, max_replicas=3, target_queue_depth=1,
                                           scale_down_window=60), endpoints, hold, target,
                          AutoscalerMetrics(CollectorRegistry()), clock=lambda: next(ticks))
        idle = await auto.tick()
        held = [asyncio.create_task(hold.routable()) for _ in range(3)]
        await asyncio.sleep(0.05)
        busy = await auto.tick()
        endpoints.update({A: READY})
        await asyncio.gather(*held)
        return idle, busy, target.calls

    idle, busy, calls = asyncio.run(scenario())
    assert (idle.queue_depth, idle.desired) == (0, 0)
    # no engine ready: held requests ask for one engine, not ceil(3 / 1)
    assert (busy.ready, busy.queue_depth, busy.desired) == (0, 3, 1)
    assert calls == [(1, [])]


def test_autoscaler_and_up_import_without_torch_fastapi_or_kubernetes_at_import():
    code = ("import sys; import pagedkube.gateway.autoscaler.autoscaler, pagedkube.gateway.autoscaler.kube, "
            "pagedkube.gateway.local.cli, pagedkube.gateway.local.supervisor; "
            "print(sorted(m for m in ('torch', 'kubernetes', 'fastapi') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_cache_worth_comes_from_the_engine_watchers_scrape():
    """No scrape of its own: each tick reads the hits the engine watcher left in the EndpointSet."""
    async def scenario():
        endpoints = EndpointSet()
        endpoints.update({A: READY, B: READY, C: READY})
        ticks = iter([0.0, 10.0])
        auto = Autoscaler(AutoscalerConfig(min_replicas=3, max_replicas=3, target_queue_depth=1), endpoints,
                          HoldQueue(endpoints, timeout=0, max_held=0), RecordingTarget(3),
                          AutoscalerMetrics(CollectorRegistry()), clock=lambda: next(ticks))
        endpoints.set_scraped(A, 0, 0, 0, prefix_cache_hits=100.0)
        endpoints.set_scraped(B, 0, 0, 0, prefix_cache_hits=7.0)
        await auto.tick()
        endpoints.set_scraped(A, 0, 0, 0, prefix_cache_hits=160.0)
        endpoints.set_scraped(B, 0, 0, 0, prefix_cache_hits=7.0)   # C never exported hits
        await auto.tick()
        return {u: auto.worth.recent_hits(u) for u in (A, B, C)}, auto.worth.least_worth([A, B, C], 2)

    worth, least = asyncio.run(scenario())
    assert worth == {A: 60.0, B: 0.0, C: 0.0}
    assert least == [C, B]
