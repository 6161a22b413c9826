"""512 clients at once through one gateway process (uvicorn on uvloop, as
`pagedkube gateway` runs) in front of two upstreams that answer at once
(tests/helpers/fake_upstream.py), with the default routing (one router: the pending
record on, every decision records its prompt's blocks) and with it off (--pending-ttl 0,
as several replicas run): every request answered 200, every one counted, and nothing left
in flight. The engine's own behaviour under such load is
tests/server's; this is the gateway's connection handling and bookkeeping."""
from __future__ import annotations

import asyncio

import httpx
import pytest

from fake_upstream import FakeEngine

pytestmark = pytest.mark.slow  # a real gateway process

CLIENTS = 512


@pytest.mark.parametrize("flags", [(), ("--pending-ttl", "0")], ids=["default", "no-pending-record"])
def test_512_concurrent_clients(processes, metric, wait_until, flags):
    events: list[str] = []
    with FakeEngine(events) as a, FakeEngine(events) as b:
        gw = processes.gateway([a.url, b.url], *flags)
        processes.wait_ready(gw)
        wait_until(lambda: httpx.get(gw.url + "/ready").json()["tokenizer"], timeout=60)

        async def burst() -> list[int]:
            limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
            async with httpx.AsyncClient(timeout=300, limits=limits) as http:
                async def one(i: int) -> int:
                    body = {"model": "tiny", "messages": [{"role": "user", "content": f"Is dog {i} a good boy?"}]}
                    return (await http.post(gw.url + "/v1/chat/completions", json=body)).status_code
                return await asyncio.gather(*(one(i) for i in range(CLIENTS)))

        codes = asyncio.run(burst())
    assert codes == [200] * CLIENTS
    assert len([e for e in events if e.startswith("upstream got")]) == CLIENTS
    assert metric(gw.url, "pagedkube_gateway_requests_total", model="tiny", code="200") == CLIENTS
    assert metric(gw.url, "pagedkube_gateway_endpoint_in_flight") == 0
