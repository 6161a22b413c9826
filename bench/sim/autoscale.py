"""An autoscaled fleet under a load that moves: the autoscaler's signal and scale-in, simulated.

The decisions are the gateway's own code (gateway/autoscaler/policy.py: desired_for_in_flight
or the old desired_replicas, bounded, the Stabilizer, scale_in_grace); what they act on is a
coarse model, because a scale-in question spans hours of load and a step-level engine
(sim/engine.py) would take hours to run it:

    engine     S = max_num_seqs slots; a request holds a slot for tokens / decode_rate seconds
               (decode-dominated answers: prefill is a rounding error at these lengths), FIFO
               waiting beyond S; a new engine serves after `startup_s`
    gateway    least-load routing over the serving engines; the scrape the autoscaler reads
               is exact (an upper bound on what a 1 s scrape can know)
    scale-in   `in-flight` (the new rule): drain the engines with the least in flight (no new
               requests), remove each once idle or after its grace; load coming back calls a
               drain off. `waiting` (the old rule): remove at once the engine the old code
               would (least cache worth; here the newest, no cache model), which then drains
               for `drain_timeout_s` and aborts what is left: those requests are lost.
    load       open-loop Poisson arrivals at a rate that follows a profile (steady, ramp,
               bursty, or the issue's step), each request short or long by a seeded draw

A run returns what docs/benchmarks.md "Autoscaling: the in-flight signal" compares: goodput
(output tokens of completed requests per second), requests lost, replica changes per hour,
the time the serving engines were fewer than the work in flight needs to run, queueing.
"""
from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from pagedkube.gateway.autoscaler.policy import (
    AutoscalerConfig, Stabilizer, bounded, desired_for_in_flight, desired_replicas, scale_in_grace)

from sim.events import EventLoop


@dataclass(frozen=True, slots=True)
class Load:
    name: str
    rate: Callable[[float], float]   # arrivals per second at time t
    duration_s: float
    short_tokens: int = 64
    long_tokens: int = 1200
    long_share: float = 0.2


@dataclass(frozen=True, slots=True)
class FleetModel:
    max_num_seqs: int = 8
    decode_rate: float = 20.0        # tokens/s per sequence (a loaded 8B on one GPU, or a CPU engine)
    startup_s: float = 30.0          # a new engine's load time (weights cached on the node)
    drain_timeout_s: float = 25.0    # the old scale-in: the engine's own SIGTERM drain, then abort
    max_model_len: int = 1400


@dataclass(slots=True)
class Request:
    tokens: int
    arrived: float
    started: float | None = None


@dataclass(eq=False)
class Engine:
    name: str
    ready_at: float
    running: set = field(default_factory=set)
    waiting: deque = field(default_factory=deque)
    draining: bool = False
    drain_deadline: float = math.inf
    removed: bool = False

    @property
    def load(self) -> int:
        return len(self.running) + len(self.waiting)


@dataclass(slots=True)
class AutoscaleResult:
    load: str
    signal: str
    requests: int
    completed: int
    lost: int
    goodput_tokens_s: float
    replica_changes_per_h: float
    under_needed_share: float      # share of ticks with fewer serving engines than the in-flight work needs
    queue_p99_s: float
    mean_replicas: float


class AutoscaledFleet:
    def __init__(self, config: AutoscalerConfig, model: FleetModel, load: Load, seed: int = 0):
        self.config, self.model, self.load = config, model, load
        self.loop = EventLoop()
        self.rng = random.Random(f"{seed}/{load.name}")
        self.engines: list[Engine] = []
        self.stabilizer = Stabilizer(config.scale_up_window, config.scale_down_window)
        self.requests = self.completed = self.lost = self.changes = 0
        self.tokens_done = 0
        self.queue_s: list[float] = []
        self.ticks = self.under = 0
        self.replica_time = 0.0
        self._n = 0
        for _ in range(max(1, config.min_replicas)):
            self._add(ready_at=0.0)

    # -- the fleet -------------------------------------------------------------------
    def _add(self, ready_at: float) -> None:
        self.engines.append(Engine(f"e{self._n}", ready_at))
        self._n += 1

    def live(self) -> list[Engine]:
        return [e for e in self.engines if not e.removed]

    def serving(self) -> list[Engine]:
        now = self.loop.now
        return [e for e in self.live() if not e.draining and e.ready_at <= now]

    def _admit(self, engine: Engine) -> None:
        while engine.waiting and len(engine.running) < self.model.max_num_seqs:
            request = engine.waiting.popleft()
            request.started = self.loop.now
            self.queue_s.append(self.loop.now - request.arrived)
            engine.running.add(id(request))
            self.loop.after(request.tokens / self.model.decode_rate, self._finish, engine, request)

    def _finish(self, engine: Engine, request: Request) -> None:
        if engine.removed or id(request) not in engine.running:
            return   # aborted by the removal
        engine.running.discard(id(request))
        self.completed += 1
        self.tokens_done += request.tokens
        self._admit(engine)

    def _remove(self, engine: Engine) -> None:
        self.lost += engine.load   # nothing, when it was drained idle
        engine.removed = True
        engine.running.clear()
        engine.waiting.clear()

    # -- the users -----------------------------------------------------------------
    def _arrive(self) -> None:
        now = self.loop.now
        if now >= self.load.duration_s:
            return
        tokens = self.load.long_tokens if self.rng.random() < self.load.long_share else self.load.short_tokens
        request = Request(tokens, now)
        self.requests += 1
        targets = self.serving()
        if targets:
            engine = min(targets, key=lambda e: (e.load, e.name))
            engine.waiting.append(request)
            self._admit(engine)
        else:
            self.lost += 1   # nothing serves: a hold queue would wait; none is modelled
        rate = max(1e-6, self.load.rate(now))
        self.loop.after(self.rng.expovariate(rate), self._arrive)

    # -- the autoscaler --------------------------------------------------------------
    def _tick(self) -> None:
        now, c, m = self.loop.now, self.config, self.model
        live, serving = self.live(), self.serving()
        in_flight = sum(e.load for e in live)
        current = len(live)
        draining = [e for e in live if e.draining]
        up = current - len(draining)
        if c.signal == "waiting":
            queue = sum(len(e.waiting) for e in serving)
            raw = desired_replicas(len(serving), up, queue, c.target_queue_depth, c.tolerance)
        else:
            raw = desired_for_in_flight(len(serving), up, in_flight, c.engine_capacity, c.target_queue_depth,
                                        c.tolerance)
        desired = self.stabilizer.recommend(bounded(raw, c), up, now)
        if desired > up:
            for engine in sorted(draining, key=lambda e: -e.load)[:desired - up]:
                engine.draining, engine.drain_deadline = False, math.inf   # called off
                up += 1
            for _ in range(desired - up):
                self._add(ready_at=now + m.startup_s)
            self.changes += desired > up   # one scale call, as pagedkube_autoscaler_scale_events_total counts
        elif desired < up and not draining:
            if c.signal == "waiting":
                for engine in sorted(serving, key=lambda e: e.name)[::-1][:up - desired]:   # the newest
                    engine.draining = True
                    self.loop.after(m.drain_timeout_s, self._remove, engine)
                self.changes += 1
            else:
                grace = scale_in_grace(c, m.max_model_len, m.decode_rate)
                for engine in sorted(serving, key=lambda e: (e.load, e.name))[:up - desired]:
                    engine.draining, engine.drain_deadline = True, now + grace
        if c.signal != "waiting":
            done = [e for e in self.live() if e.draining and (e.load == 0 or now >= e.drain_deadline)]
            for engine in done:
                self._remove(engine)
            self.changes += bool(done)
        self.ticks += 1
        self.under += len(self.serving()) < math.ceil(min(in_flight, current * m.max_num_seqs) / m.max_num_seqs)
        self.replica_time += len(self.live()) * c.interval
        if now < self.load.duration_s:
            self.loop.after(c.interval, self._tick)

    def run(self) -> AutoscaleResult:
        self.loop.at(0.0, self._arrive)
        self.loop.at(0.0, self._tick)
        self.loop.run()
        for engine in self.live():   # the end of the run: whatever still runs finishes, nothing is lost
            engine.removed = True
        q = sorted(self.queue_s)
        hours = self.load.duration_s / 3600
        return AutoscaleResult(
            load=self.load.name, signal=self.config.signal, requests=self.requests, completed=self.completed,
            lost=self.lost, goodput_tokens_s=self.tokens_done / self.load.duration_s,
            replica_changes_per_h=self.changes / hours, under_needed_share=self.under / max(1, self.ticks),
            queue_p99_s=q[int(0.99 * (len(q) - 1))] if q else 0.0,
            mean_replicas=self.replica_time / self.load.duration_s)


def engine_rate(model: FleetModel, load: Load) -> float:
    """Arrivals per second one engine serves with every slot busy."""
    mean_tokens = load.long_share * load.long_tokens + (1 - load.long_share) * load.short_tokens
    return model.max_num_seqs * model.decode_rate / mean_tokens


def loads(model: FleetModel, hours: float = 2.0) -> list[Load]:
    """Steady (1.7 engines' worth, near a boundary), a ramp to 3.5 and back, bursts to 3 over 0.5."""
    base = Load("x", lambda t: 1.0, hours * 3600)
    one = engine_rate(model, base)
    half = base.duration_s / 2
    return [
        Load("steady", lambda t: 1.7 * one, base.duration_s),
        Load("ramp", lambda t: one * (0.2 + 3.3 * (t / half if t < half else 2 - t / half)), base.duration_s),
        Load("bursty", lambda t: one * (3.0 if t % 600 < 120 else 0.5), base.duration_s),
    ]
