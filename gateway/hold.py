"""Holding requests while no engine is ready (scale from zero, engines restarting).

A request that finds no routable engine waits, up to `timeout` seconds, for one
to become ready; at most `max_held` wait at once. Beyond the bound, or past the
timeout, the client gets 503 with Retry-After (docs/design.md, pitfall "Scale to zero drops
requests": hold, but bounded, so a dead fleet cannot pile up unbounded work).
The number held counts toward the autoscaler's queue depth, and the first held
request wakes the autoscaler so it asks for an engine at once, not at its next tick.
"""
from __future__ import annotations

from typing import Callable

from pagedkube.gateway.endpoints import EndpointSet
from pagedkube.gateway.errors import GatewayError

RETRY_AFTER_S = 5   # a cold engine takes seconds to load: suggest clients come back after that


def hold_full(max_held: int) -> GatewayError:
    return GatewayError(503, f"No engine is ready and {max_held} requests are already waiting for one; "
                             f"retry after {RETRY_AFTER_S} s.",
                        headers={"Retry-After": str(RETRY_AFTER_S)})


def hold_timeout(seconds: float) -> GatewayError:
    return GatewayError(503, f"No engine became ready within {seconds:g} s; retry after {RETRY_AFTER_S} s.",
                        headers={"Retry-After": str(RETRY_AFTER_S)})


class HoldQueue:
    def __init__(self, endpoints: EndpointSet, timeout: float, max_held: int):
        if timeout < 0 or max_held < 0:
            raise ValueError(f"hold timeout and max held must be >= 0, got {timeout}, {max_held}")
        self.endpoints = endpoints
        self.timeout = timeout
        self.max_held = max_held
        self.num_held = 0
        self.on_hold: Callable[[], None] | None = None   # the autoscaler's wake-up

    async def routable(self) -> list[str]:
        """The routable endpoints now, or after holding; raises a 503 GatewayError."""
        routable = self.endpoints.routable()
        if routable:
            return routable
        if self.timeout <= 0:
            return []          # holding is off: the caller answers its usual 503
        if self.num_held >= self.max_held:
            raise hold_full(self.max_held)
        self.num_held += 1
        try:
            if self.on_hold is not None:
                self.on_hold()
            routable = await self.endpoints.wait_routable(self.timeout)
        finally:
            self.num_held -= 1
        if not routable:
            raise hold_timeout(self.timeout)
        return routable
