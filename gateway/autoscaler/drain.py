"""Draining engines for a scale-in: the engine's POST / DELETE /drain, over the gateway's
control client (which carries the engine key).

    POST   {engine}/drain   -> {"draining": true, "in_flight": N}   refuse new requests (503
                               `draining`, which gateways retry elsewhere), /ready 503, so a
                               Kubernetes ReplicaSet deletes this (not ready) pod first
    DELETE {engine}/drain   -> {"draining": false, ...}            the scale-in was called off

The autoscaler posts again every tick until the engine says `in_flight: 0`. An engine
without the endpoint (the vllm runtime: 404) or one that does not answer gives None; the
autoscaler then counts its load as the gateway last scraped it.
"""
from __future__ import annotations

import logging

import httpx

log = logging.getLogger("pagedkube.autoscaler")


class EngineDrainer:
    def __init__(self, client: httpx.AsyncClient):
        self.client = client

    async def drain(self, url: str) -> int | None:
        """Asks `url` to drain (again); the requests it still has in flight, or None."""
        try:
            r = await self.client.post(f"{url}/drain")
            if r.status_code == 200:
                return int(r.json()["in_flight"])
            log.debug("POST %s/drain: HTTP %d", url, r.status_code)
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
            log.debug("POST %s/drain: %s", url, e)
        return None

    async def undrain(self, url: str) -> None:
        try:
            await self.client.delete(f"{url}/drain")
        except httpx.HTTPError as e:
            log.warning("DELETE %s/drain: %s", url, e)
