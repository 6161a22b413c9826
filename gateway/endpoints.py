"""The set of engine endpoints, their state and their load.

Discovery (a static list or EndpointSlices) says which endpoints exist and
whether they are ready; the passive health check ejects an endpoint for a
while after consecutive failures; the engine watcher's one scrape per engine
records its running and waiting counts and its prefix-cache hits. Routing reads `routable()` and `loads()`; the autoscaler
reads the same object (the engines' waiting queues and cache hits) and uses `wait_routable`
to hold requests while no engine is ready.

    state:  ready | not_ready | terminating  (discovery)  + ejected (health)
    load:   in_flight   requests this gateway has open on the engine (exact, now)
          + others      the engine's running + waiting at the last scrape, less
                        this gateway's own requests then: other replicas' load

Counting the scraped queue on top of in_flight instead would count this
gateway's own queued requests twice, and keep counting them for a scrape
interval after they finished; at low load one such phantom request moves a
session off its engine (capacity ceil(c (L + 1) / n) is 1 while L <= 2 of 4).
With the split, replicas also see nearly the same load: each sees the engine's
total, its own part fresh.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from pagedkube.gateway.routing.adapters import AdapterSlots

READY = "ready"
NOT_READY = "not_ready"
TERMINATING = "terminating"
EJECTED = "ejected"
STATES = (READY, NOT_READY, TERMINATING, EJECTED)

# Envoy's outlier detection defaults are 5 consecutive 5xx and 30 s; a local
# connect refusal is a surer sign, so eject sooner and for less.
DEFAULT_EJECT_AFTER_FAILURES = 2
DEFAULT_EJECT_SECONDS = 10.0


@dataclass(slots=True)
class Endpoint:
    url: str
    name: str = ""              # the pod's name when discovery knows it: metric labels show this, not the address
    discovered: str = NOT_READY
    in_flight: int = 0
    waiting: int = 0            # the engine's queue at the last scrape (the old autoscaler signal)
    others: int = 0             # other replicas' requests on it at the last scrape
    draining: bool = False      # a scale-in chose it: no new requests, removed once its own are done
    generation_tokens: float | None = None   # the engine's cumulative output tokens at the last scrape
    scraped_at: float | None = None
    decode_rate: float | None = None         # output tokens/s per running sequence, last measured
    prefix_cache_hits: float | None = None   # the engine's cumulative cache hits at the last scrape (cache worth)
    lora: AdapterSlots | None = None         # its LoRA adapter slots at the last scrape (None: LoRA off or unknown)
    consecutive_failures: int = 0
    ejected_until: float = 0.0

    def state(self, now: float) -> str:
        if self.discovered == READY and self.draining:
            return TERMINATING
        if self.discovered == READY and self.ejected_until > now:
            return EJECTED
        return self.discovered


class EndpointSet:
    def __init__(self, eject_after_failures: int = DEFAULT_EJECT_AFTER_FAILURES,
                 eject_seconds: float = DEFAULT_EJECT_SECONDS, clock: Callable[[], float] = time.monotonic):
        if eject_after_failures <= 0:
            raise ValueError(f"eject_after_failures must be positive, got {eject_after_failures}")
        if eject_seconds < 0:
            raise ValueError(f"eject_seconds must be >= 0, got {eject_seconds}")
        self.eject_after_failures = eject_after_failures
        self.eject_seconds = eject_seconds
        self.clock = clock
        self._endpoints: dict[str, Endpoint] = {}
        self._listeners: list[Callable[[set[str], set[str]], None]] = []
        self._changed = asyncio.Event()  # binds to a loop on first wait (Python >= 3.10)

    # -- discovery -------------------------------------------------------------
    def update(self, states: Mapping[str, str], names: Mapping[str, str] | None = None) -> None:
        """Replace the discovered set: `states` maps every endpoint URL that exists
        now to ready / not_ready / terminating. Endpoints not in it are removed.
        `names`: URL -> pod name, where discovery knows it."""
        for url, state in states.items():
            if state not in (READY, NOT_READY, TERMINATING):
                raise ValueError(f"unknown endpoint state {state!r} for {url}")
        added = set(states) - set(self._endpoints)
        removed = set(self._endpoints) - set(states)
        for url in removed:
            del self._endpoints[url]
        for url, state in states.items():
            endpoint = self._endpoints.setdefault(url, Endpoint(url))
            endpoint.discovered = state
            endpoint.name = (names or {}).get(url, endpoint.name)
        for listener in self._listeners:
            listener(added, removed)
        self._notify()

    def set_discovered(self, url: str, state: str) -> None:
        """One endpoint's readiness changed (static mode probes /ready)."""
        endpoint = self._endpoints.get(url)
        if endpoint is not None and endpoint.discovered != state:
            endpoint.discovered = state
            self._notify()

    def subscribe(self, listener: Callable[[set[str], set[str]], None]) -> None:
        """`listener(added, removed)` after every update()."""
        self._listeners.append(listener)

    # -- reads -----------------------------------------------------------------
    def urls(self) -> list[str]:
        return sorted(self._endpoints)

    def get(self, url: str) -> Endpoint | None:
        return self._endpoints.get(url)

    def routable(self) -> list[str]:
        now = self.clock()
        return sorted(u for u, e in self._endpoints.items() if e.state(now) == READY)

    def set_draining(self, url: str, draining: bool) -> None:
        """A scale-in chose `url` (routing stops at once) or called it off."""
        if (e := self._endpoints.get(url)) is not None and e.draining != draining:
            e.draining = draining
            self._notify()

    def draining(self) -> list[str]:
        return sorted(u for u, e in self._endpoints.items() if e.draining)

    def slowest_decode_rate(self) -> float | None:
        """The lowest per-sequence decode rate measured on any engine, None before any."""
        rates = [e.decode_rate for e in self._endpoints.values() if e.decode_rate]
        return min(rates) if rates else None

    def loads(self, urls: Iterable[str] | None = None) -> dict[str, int]:
        urls = self._endpoints if urls is None else urls
        return {u: e.in_flight + e.others for u in urls if (e := self._endpoints.get(u)) is not None}

    def adapter_slots(self, urls: Iterable[str]) -> dict[str, AdapterSlots]:
        """The last scraped adapter slots of those of `urls` that reported any (routing/adapters.py)."""
        return {u: e.lora for u in urls if (e := self._endpoints.get(u)) is not None and e.lora is not None}

    def label(self, url: str) -> str:
        """How metrics name an endpoint: its pod's name under Kubernetes discovery (an engine's
        address is nobody's business on an open /metrics), else the URL as configured."""
        e = self._endpoints.get(url)
        return e.name if e is not None and e.name else url

    def load_parts(self) -> dict[str, tuple[int, int]]:
        """Each endpoint's (in_flight, others), the two halves of `loads()`, by label()."""
        return {self.label(u): (e.in_flight, e.others) for u, e in sorted(self._endpoints.items())}

    def in_flight(self, url: str) -> int:
        e = self._endpoints.get(url)
        return e.in_flight if e is not None else 0

    def counts_by_state(self) -> dict[str, int]:
        now = self.clock()
        counts = dict.fromkeys(STATES, 0)
        for e in self._endpoints.values():
            counts[e.state(now)] += 1
        return counts

    # -- load and health -----------------------------------------------------------
    def acquire(self, url: str) -> None:
        if (e := self._endpoints.get(url)) is not None:
            e.in_flight += 1

    def release(self, url: str) -> None:
        if (e := self._endpoints.get(url)) is not None and e.in_flight > 0:
            e.in_flight -= 1

    def set_scraped(self, url: str, running: int, waiting: int, own: int,
                    prefix_cache_hits: float | None = None, generation_tokens: float | None = None,
                    lora: AdapterSlots | None = None) -> None:
        """An engine reported `running` and `waiting` requests (and its cumulative
        prefix-cache hits and output tokens, None when not exported; its adapter slots) while this gateway
        had `own` requests open on it (the larger of its counts before and after the
        scrape: a request of ours that ended meanwhile is not taken for another replica's).
        Two scrapes with sequences running measure its decode rate per sequence."""
        if (e := self._endpoints.get(url)) is None:
            return
        now = self.clock()
        e.waiting = max(0, int(waiting))
        e.others = max(0, int(running) + e.waiting - max(0, own))
        e.prefix_cache_hits = prefix_cache_hits
        e.lora = lora
        if generation_tokens is not None and e.generation_tokens is not None and e.scraped_at is not None \
                and running > 0 and now > e.scraped_at and generation_tokens > e.generation_tokens:
            e.decode_rate = (generation_tokens - e.generation_tokens) / (now - e.scraped_at) / running
        e.generation_tokens, e.scraped_at = generation_tokens, now

    def report_success(self, url: str) -> None:
        if (e := self._endpoints.get(url)) is not None:
            e.consecutive_failures = 0

    def report_failure(self, url: str) -> bool:
        """Counts a connect error or 5xx; returns True when this ejects the endpoint."""
        e = self._endpoints.get(url)
        if e is None:
            return False
        e.consecutive_failures += 1
        if e.consecutive_failures >= self.eject_after_failures:
            e.consecutive_failures = 0
            e.ejected_until = self.clock() + self.eject_seconds
            return True
        return False

    # -- holding requests while nothing is ready (the autoscaler's hook) ---------------
    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self, timeout: float) -> None:
        """Returns at the next change of any endpoint's state, or after `timeout` seconds."""
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    async def wait_routable(self, timeout: float) -> list[str]:
        """The routable endpoints, waiting up to `timeout` seconds for one to appear."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not (routable := self.routable()):
            remaining = deadline - loop.time()
            if remaining <= 0:
                return []
            try:
                await asyncio.wait_for(self._changed.wait(), min(remaining, 0.5))
            except asyncio.TimeoutError:
                pass
        return routable

