"""The autoscaler loop: every `interval` seconds (or at once when a request is
held with no engine ready), read the fleet, decide, and tell the ScaleTarget.

    tick:  leader?  -> current = target.get_replicas()      (drained engines included)
           ready    = endpoints.routable()                  (not draining)
           in flight = every engine's running + waiting + held requests        policy.py
           serving  = current - draining
           desired  = stabilizer.recommend(bounded(raw(...)), serving, now)
           desired > serving  -> call drains off first (they still hold their caches),
                                 then target.scale(up)
           desired < serving  -> drain the engines with the least work in flight (then the
                                 least cache worth): no new requests reach them (here at
                                 once; the engine's POST /drain refuses everyone else's)
           every tick         -> a drained engine whose requests have all finished, or whose
                                 grace passed (policy.scale_in_grace), is removed:
                                 target.scale(current - done, done)

So a scale-in loses nothing: an engine leaves only once it is idle (or the longest allowed
request has had its time), and in Kubernetes the ReplicaSet deletes the drained pod because
its /ready fails (a not-ready pod goes first), which needs no pod patch. For that, a target
that removes not-ready pods first (`removes_not_ready_first`) is scaled in only once the
drained engine is seen not ready (its readiness probe has failed: up to 15 s); scaled in
before, both pods ready, the ReplicaSet could delete the other one, and the drained engine
would stay, refusing work, as the only one. Should the wrong engine still go (a grace that
ran out first, a pod deleted by hand), a victim still there and not terminating
`REMOVAL_WAIT_S` after its scale-in is put back into service. The old signal
(`waiting`) keeps its old scale-in for comparison: the least-worth engines go at once, and
their own drain (SIGTERM, --drain-timeout) aborts what is left.

Only the replica holding the Lease acts; the others keep their gauges current and let the
leader decide. A replica that loses the Lease calls its drains off.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Callable, Protocol

from pagedkube.gateway.autoscaler.cache_worth import CacheWorth
from pagedkube.gateway.autoscaler.metrics import AutoscalerMetrics
from pagedkube.gateway.autoscaler.policy import (
    AutoscalerConfig, Stabilizer, bounded, desired_for_in_flight, desired_replicas, in_flight_queue_depth,
    scale_in_grace)
from pagedkube.gateway.autoscaler.target import ScaleTarget
from pagedkube.gateway.endpoints import READY, TERMINATING, EndpointSet
from pagedkube.gateway.hold import HoldQueue

log = logging.getLogger("pagedkube.autoscaler")

# How long a scaled-in victim may stay discovered (not terminating) before it is put back in
# service: the API server, the ReplicaSet and the EndpointSlice take seconds between them.
REMOVAL_WAIT_S = 60.0


class Drainer(Protocol):
    async def drain(self, url: str) -> int | None: ...   # requests still in flight, None: unknown
    async def undrain(self, url: str) -> None: ...


@dataclass(slots=True)
class Decision:
    time: float
    ready: int
    queue_depth: float
    current: int
    recommendation: int   # bounded, before stabilization
    desired: int
    in_flight: int = 0
    serving: int = 0      # current less the engines draining


@dataclass(slots=True)
class Drain:
    started: float
    deadline: float


class Autoscaler:
    def __init__(self, config: AutoscalerConfig, endpoints: EndpointSet, hold: HoldQueue, target: ScaleTarget,
                 metrics: AutoscalerMetrics, clock: Callable[[], float] = time.monotonic,
                 drainer: Drainer | None = None, max_model_len: Callable[[], int | None] = lambda: None):
        self.config = config
        self.endpoints = endpoints
        self.hold = hold
        self.target = target
        self.metrics = metrics
        self.clock = clock
        self.drainer = drainer
        self.max_model_len = max_model_len
        self.stabilizer = Stabilizer(config.scale_up_window, config.scale_down_window)
        self.worth = CacheWorth(max(config.scale_down_window, 10 * config.interval))
        self.drains: dict[str, Drain] = {}
        self.removed: dict[str, float] = {}   # victims scaled in: URL -> when
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

    # -- what the decision reads ---------------------------------------------------------
    def in_flight(self) -> int:
        """Every engine's running + waiting requests (this gateway's own counted fresh) + held ones."""
        return sum(self.endpoints.loads().values()) + self.hold.num_held

    def queue_depth(self, ready: list[str], in_flight: int) -> float:
        if self.config.signal == "waiting":
            return sum(e.waiting for u in ready if (e := self.endpoints.get(u)) is not None) + self.hold.num_held
        return in_flight_queue_depth(in_flight, len(ready), self.config.engine_capacity)

    def _observe_worth(self, ready: list[str], now: float) -> None:
        """Each ready engine's prefix-cache hits as the engine watcher last scraped them."""
        self.worth.forget(ready)
        for url in ready:
            e = self.endpoints.get(url)
            if e is not None and e.prefix_cache_hits is not None:
                self.worth.observe(url, e.prefix_cache_hits, now)

    def _raw(self, ready: int, serving: int, queue: float, in_flight: int) -> int:
        c = self.config
        if c.signal == "waiting":
            return desired_replicas(ready, serving, queue, c.target_queue_depth, c.tolerance)
        return desired_for_in_flight(ready, serving, in_flight, c.engine_capacity, c.target_queue_depth, c.tolerance)

    # -- one decision ---------------------------------------------------------------
    async def tick(self) -> Decision | None:
        for url in [u for u in self.drains if self.endpoints.get(u) is None]:
            del self.drains[url]   # gone (removed, restarted on a new port): nothing left to wait for
        ready = self.endpoints.routable()
        in_flight = self.in_flight()
        queue = self.queue_depth(ready, in_flight)
        self.metrics.ready_replicas.set(len(ready))
        self.metrics.queue_depth.set(queue)
        self.metrics.in_flight.set(in_flight)
        self.metrics.held_requests.set(self.hold.num_held)
        now = self.clock()
        self._observe_worth(ready, now)
        leader = await self.target.is_leader()
        self.metrics.leader.set(1 if leader else 0)
        if not leader:
            await self._call_off(len(self.drains))
            return None
        current = await self.target.get_replicas()
        serving = current - len(self.drains)
        recommendation = bounded(self._raw(len(ready), serving, queue, in_flight), self.config)
        desired = self.stabilizer.recommend(recommendation, serving, now)
        self.metrics.desired_replicas.set(desired)
        decision = Decision(now, len(ready), queue, current, recommendation, desired, in_flight, serving)
        self.last = decision
        if desired > serving and self.drains:
            serving += await self._call_off(desired - serving)
        if desired > serving:
            await self._scale(current + desired - serving, [], "up", decision)
        elif desired < serving and not self.drains:
            await self._begin_drains(ready, serving - desired, decision)
        await self._end_drains(now, decision)
        await self._check_removed(now)
        self.metrics.draining_replicas.set(len(self.drains))
        return decision

    async def _scale(self, replicas: int, victims: list[str], direction: str, d: Decision) -> None:
        log.info("scale %s: %d -> %d engines (ready %d, in flight %d, queue depth %g, target %g per engine)%s",
                 direction, d.current, replicas, d.ready, d.in_flight, d.queue_depth, self.config.target_queue_depth,
                 f"; removing {', '.join(victims)}" if victims else "")
        worth = {u: self.worth.recent_hits(u) for u in self.endpoints.urls()}
        await self.target.scale(replicas, victims, worth)
        self.metrics.scale_events.labels(direction).inc()

    def _rank(self, ready: list[str]) -> list[str]:
        """Scale-in order: the least work in flight, then the least cache worth (the old signal:
        cache worth alone), ties by CacheWorth's URL order so every replica picks alike."""
        by_worth = self.worth.least_worth(ready, len(ready))
        if self.config.signal == "waiting":
            return by_worth
        loads = self.endpoints.loads(ready)
        return sorted(by_worth, key=lambda u: loads.get(u, 0))   # stable: worth order within equal loads

    async def _begin_drains(self, ready: list[str], count: int, d: Decision) -> None:
        victims = self._rank(ready)[:count]
        old = self.config.signal == "waiting"
        grace = 0.0 if old else scale_in_grace(self.config, self.max_model_len(), self.endpoints.slowest_decode_rate())
        loads = self.endpoints.loads(victims)
        for url in victims:
            self.endpoints.set_draining(url, True)
            if self.drainer is not None and not old:
                await self.drainer.drain(url)
            self.drains[url] = Drain(d.time, d.time + grace)
        if not old:
            log.info("scale-in to %d engines: draining %s (in flight %s); each leaves when idle, or after %.0f s",
                     d.desired, ", ".join(victims), ", ".join(str(loads.get(u, 0)) for u in victims), grace)

    async def _end_drains(self, now: float, d: Decision) -> None:
        done = []
        for url, drain in sorted(self.drains.items()):
            left = await self.drainer.drain(url) if self.drainer is not None and drain.deadline > now else None
            if left is None:
                left = self.endpoints.loads([url]).get(url, 0)
            if left == 0 and now < drain.deadline and self._still_ready(url):
                continue   # idle, but its pod is still ready: the ReplicaSet might take the other one
            if left == 0 or now >= drain.deadline:
                if left:
                    log.warning("%s still has %d request(s) after the %.0f s grace: removing it", url, left,
                                drain.deadline - drain.started)
                done.append(url)
        if done:
            current = await self.target.get_replicas()
            await self._scale(current - len(done), done, "down", d)
            for url in done:
                del self.drains[url]
                self.removed[url] = now

    def _still_ready(self, url: str) -> bool:
        """The drained engine's pod still counts as ready where the target removes not-ready pods first."""
        endpoint = self.endpoints.get(url)
        return self.target.removes_not_ready_first and endpoint is not None and endpoint.discovered == READY

    async def _check_removed(self, now: float) -> None:
        """A victim that outlived its scale-in (another engine went instead) serves again."""
        for url, when in list(self.removed.items()):
            endpoint = self.endpoints.get(url)
            if endpoint is None or endpoint.discovered == TERMINATING:
                del self.removed[url]   # gone, or going: as planned
            elif now - when >= REMOVAL_WAIT_S:
                del self.removed[url]
                log.warning("%s is still here %.0f s after its scale-in (another engine went): serving again",
                            url, now - when)
                self.endpoints.set_draining(url, False)
                if self.drainer is not None:
                    await self.drainer.undrain(url)

    async def _call_off(self, count: int) -> int:
        """Ends up to `count` drains, the busiest first (their caches are the warmest); how many."""
        loads = self.endpoints.loads(list(self.drains))
        called_off = sorted(self.drains, key=lambda u: -loads.get(u, 0))[:max(0, count)]
        for url in called_off:
            del self.drains[url]
            self.endpoints.set_draining(url, False)
            if self.drainer is not None:
                await self.drainer.undrain(url)
        if called_off:
            log.info("scale-in called off for %s: load came back", ", ".join(called_off))
        return len(called_off)
