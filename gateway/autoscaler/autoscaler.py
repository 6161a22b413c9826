"""The autoscaler loop: every `interval` seconds (or at once when a request is
held with no engine ready), read the queue, decide, and tell the ScaleTarget.

    tick:  leader?  -> current = target.get_replicas()
           ready    = endpoints.routable()
           queue    = sum(waiting of ready engines) + held requests
           worth    = each ready engine's recent prefix-cache hits             cache_worth.py
                      (waiting and hits: the engine watcher's scrape, read from the EndpointSet)
           raw      = bounded(desired_replicas(ready, current, queue))     policy.py
           desired  = stabilizer.recommend(raw, current, now)
           desired != current -> target.scale(desired, victims, worth)

Only the replica holding the Lease acts; the others keep their gauges (ready,
queue) current and let the leader decide.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Callable

from pagedkube.gateway.autoscaler.cache_worth import CacheWorth
from pagedkube.gateway.autoscaler.metrics import AutoscalerMetrics
from pagedkube.gateway.autoscaler.policy import AutoscalerConfig, Stabilizer, bounded, desired_replicas
from pagedkube.gateway.autoscaler.target import ScaleTarget
from pagedkube.gateway.endpoints import EndpointSet
from pagedkube.gateway.hold import HoldQueue

log = logging.getLogger("pagedkube.autoscaler")


@dataclass(slots=True)
class Decision:
    time: float
    ready: int
    queue_depth: int
    current: int
    recommendation: int   # bounded, before stabilization
    desired: int


class Autoscaler:
    def __init__(self, config: AutoscalerConfig, endpoints: EndpointSet, hold: HoldQueue, target: ScaleTarget,
                 metrics: AutoscalerMetrics, clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.endpoints = endpoints
        self.hold = hold
        self.target = target
        self.metrics = metrics
        self.clock = clock
        self.stabilizer = Stabilizer(config.scale_up_window, config.scale_down_window)
        self.worth = CacheWorth(max(config.scale_down_window, 10 * config.interval))
        self.last: Decision | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        metrics.target_queue_depth.set(config.target_queue_depth)
        metrics.min_replicas.set(config.min_replicas)
        metrics.max_replicas.set(config.max_replicas)
        hold.on_hold = self.wake

    # -- lifecycle ----------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="autoscaler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.target.close()

    def wake(self) -> None:
        self._wake.set()

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001  an API error must not end autoscaling: try again next tick
                log.warning("autoscaler tick failed: %s", e)
            try:
                await asyncio.wait_for(self._wake.wait(), self.config.interval)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()

    # -- one decision ---------------------------------------------------------------
    def queue_depth(self, ready: list[str]) -> int:
        waiting = sum(e.waiting for u in ready if (e := self.endpoints.get(u)) is not None)
        return waiting + self.hold.num_held

    def _observe_worth(self, ready: list[str], now: float) -> None:
        """Each ready engine's prefix-cache hits as the engine watcher last scraped them."""
        self.worth.forget(ready)
        for url in ready:
            e = self.endpoints.get(url)
            if e is not None and e.prefix_cache_hits is not None:
                self.worth.observe(url, e.prefix_cache_hits, now)

    async def tick(self) -> Decision | None:
        ready = self.endpoints.routable()
        queue = self.queue_depth(ready)
        self.metrics.ready_replicas.set(len(ready))
        self.metrics.queue_depth.set(queue)
        self.metrics.held_requests.set(self.hold.num_held)
        now = self.clock()
        self._observe_worth(ready, now)
        leader = await self.target.is_leader()
        self.metrics.leader.set(1 if leader else 0)
        if not leader:
            return None
        current = await self.target.get_replicas()
        c = self.config
        recommendation = bounded(desired_replicas(len(ready), current, queue, c.target_queue_depth, c.tolerance), c)
        desired = self.stabilizer.recommend(recommendation, current, now)
        self.metrics.desired_replicas.set(desired)
        decision = Decision(now, len(ready), queue, current, recommendation, desired)
        self.last = decision
        if desired != current:
            await self._apply(decision, ready)
        return decision

    async def _apply(self, d: Decision, ready: list[str]) -> None:
        direction = "up" if d.desired > d.current else "down"
        victims: list[str] = []
        worth: dict[str, float] = {}
        if direction == "down":
            worth = {u: self.worth.recent_hits(u) for u in ready}
            victims = self.worth.least_worth(ready, d.current - d.desired)
        log.info("scale %s: %d -> %d engines (ready %d, queue depth %d, target %g per engine)%s",
                 direction, d.current, d.desired, d.ready, d.queue_depth, self.config.target_queue_depth,
                 f"; removing {', '.join(victims)} first" if victims else "")
        await self.target.scale(d.desired, victims, worth)
        self.metrics.scale_events.labels(direction).inc()
