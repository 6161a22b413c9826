"""The scale-in that loses nothing, tick by tick (in-process, fake clock): the engines with the
least work are drained, leave only when idle or after their grace, and a drain is called off
when load comes back. The same against real processes: tests/gateway/local/test_up_scale_in.py."""
from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from pagedkube.gateway.autoscaler.autoscaler import Autoscaler
from pagedkube.gateway.autoscaler.metrics import AutoscalerMetrics
from pagedkube.gateway.autoscaler.policy import AutoscalerConfig
from pagedkube.gateway.endpoints import READY, EndpointSet
from pagedkube.gateway.hold import HoldQueue
from scale_targets import RecordingTarget

A, B, C = "http://127.0.0.1:9001", "http://127.0.0.1:9002", "http://127.0.0.1:9003"




class Engines:
    """What each engine's POST /drain would answer: its requests in flight; records the calls."""

    def __init__(self, endpoints: EndpointSet, running: dict[str, int]):
        self.endpoints, self.running = endpoints, running
        self.calls: list[tuple[str, str]] = []
        self.set(**{})

    def set(self, **running: int) -> None:
        self.running.update({globals()[k]: v for k, v in running.items()})
        for url, n in self.running.items():
            self.endpoints.set_scraped(url, running=n, waiting=0, own=0)

    async def drain(self, url: str) -> int:
        self.calls.append(("POST", url))
        return self.running[url]

    async def undrain(self, url: str) -> None:
        self.calls.append(("DELETE", url))


def fleet(running: dict[str, int], **config):
    clock = [0.0]
    endpoints = EndpointSet(clock=lambda: clock[0])
    endpoints.update(dict.fromkeys(running, READY))
    engines = Engines(endpoints, dict(running))
    target = RecordingTarget(len(running))
    cfg = AutoscalerConfig(min_replicas=1, max_replicas=3, target_queue_depth=4, engine_capacity=8,
                           scale_down_window=0, **config)
    auto = Autoscaler(cfg, endpoints, HoldQueue(endpoints, 0, 0), target, AutoscalerMetrics(CollectorRegistry()),
                      clock=lambda: clock[0], drainer=engines, max_model_len=lambda: 1000)
    return auto, endpoints, engines, target, clock


def test_a_scale_in_drains_the_least_busy_engine_and_removes_it_only_when_idle():
    async def scenario():
        # 9 in flight on 3 engines of 8 slots: 2 can run them (ceil(9 / 7.2)); C is the least busy.
        auto, endpoints, engines, target, clock = fleet({A: 5, B: 3, C: 1})
        d = await auto.tick()
        assert (d.in_flight, d.desired) == (9, 2)
        assert endpoints.routable() == [A, B] and endpoints.draining() == [C]
        assert target.calls == [] and ("POST", C) in engines.calls          # draining, not removed
        for t in (1.0, 2.0, 3.0):   # its request runs on: it stays, however long (within grace)
            clock[0] = t
            await auto.tick()
        assert target.calls == []
        engines.set(C=0)            # finished
        clock[0] = 4.0
        await auto.tick()
        assert target.calls == [(2, [C])] and auto.drains == {}
        return auto

    auto = asyncio.run(scenario())
    assert auto.metrics.scale_events.labels("down")._value.get() == 1


def test_load_coming_back_calls_the_drain_off_before_any_engine_starts():
    async def scenario():
        auto, endpoints, engines, target, clock = fleet({A: 5, B: 3, C: 1})
        await auto.tick()
        assert endpoints.draining() == [C]
        engines.set(A=12, B=12)      # 25 in flight: more than 2 x (8 + 4), so 3 engines, which C still is
        clock[0] = 1.0
        d = await auto.tick()
        return d, endpoints, engines, target

    d, endpoints, engines, target = asyncio.run(scenario())
    assert d.desired == 3 and target.calls == []          # no new engine: the drained one serves again
    assert endpoints.routable() == [A, B, C] and endpoints.draining() == []
    assert ("DELETE", C) in engines.calls


def test_after_the_grace_a_drained_engine_goes_even_with_requests_left():
    async def scenario():
        auto, endpoints, engines, target, clock = fleet({A: 5, B: 3, C: 1}, scale_in_grace=30)
        await auto.tick()
        clock[0] = 29.0
        await auto.tick()
        assert target.calls == []
        clock[0] = 30.0
        await auto.tick()
        return target

    assert asyncio.run(scenario()).calls == [(2, [C])]


def test_the_grace_is_derived_from_max_model_len_and_the_measured_decode_rate():
    async def scenario():
        auto, endpoints, engines, target, clock = fleet({A: 5, B: 3, C: 1})
        for url in (A, B, C):   # 10 tokens/s per sequence on every engine: two scrapes, 1 s apart
            endpoints.set_scraped(url, running=1, waiting=0, own=0, generation_tokens=100)
        clock[0] = 1.0
        for url in (A, B, C):
            endpoints.set_scraped(url, running=1, waiting=0, own=0, generation_tokens=110)
        await auto.tick()
        return auto

    auto = asyncio.run(scenario())
    assert len(auto.drains) == 2   # 3 in flight: one engine runs them
    for drain in auto.drains.values():
        assert drain.deadline - drain.started == 1.25 * 1000 / 10   # max_model_len 1000 at 10 tokens/s


def test_the_old_signal_removes_at_once_as_it_did():
    async def scenario():
        # Busy engines with empty queues: the waiting signal sees no queue and scales to the minimum.
        auto, endpoints, engines, target, clock = fleet({A: 5, B: 3, C: 1}, signal="waiting")
        d = await auto.tick()
        return d, target, engines

    d, target, engines = asyncio.run(scenario())
    assert d.desired == 1 and len(target.calls) == 1 and target.calls[0][0] == 1   # 9 requests in flight, regardless
    assert not [c for c in engines.calls if c[0] == "POST"]
