"""Header limits on the real servers: an engine (`pagedkube serve`) and a gateway in
front of it, each attacked with oversized heads, thousands of headers and 200
slow-header connections while a real client is served, and each one's resident
memory measured over the attack (pagedkube/http_head_limits.py)."""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from head_attacks import RssPeak, big_header, many_headers, send_head, slow_head

HEADER_READ_TIMEOUT = "2"
LIMIT_FLAGS = ["--header-read-timeout", HEADER_READ_TIMEOUT]
BIG_HEADERS = 50            # at once, 1 MiB each: 50 MiB a server without a limit would buffer
SLOW_CLIENTS = 200
# What an attack may add to a server's resident memory. Limited, the heads cost at most
# 50 x (16 KiB + one 256 KiB socket read) = 13.6 MiB at the worst instant, plus the
# connections' own objects; unlimited, the 50 MiB of headers alone are buffered whole.
RSS_BOUND = 32 << 20


@pytest.fixture(scope="module")
def servers(module_processes):
    engine = module_processes.engine("--served-model-name", "tiny", "--max-model-len", "256", *LIMIT_FLAGS)
    module_processes.wait_ready(engine)
    gateway = module_processes.gateway([engine.url], *LIMIT_FLAGS, route_headers=False)
    module_processes.wait_ready(gateway)
    return {"engine": engine, "gateway": gateway}


def complete(url: str) -> int:
    """A real request through the server (the engine answers it, directly or behind the gateway)."""
    r = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": "Hello", "max_tokens": 4}, timeout=120)
    return r.status_code


async def attack(port: int, url: str) -> tuple[list, list, list, int]:
    big = [asyncio.create_task(send_head(port, big_header(1 << 20), chunk=1 << 16)) for _ in range(BIG_HEADERS)]
    many = asyncio.create_task(send_head(port, many_headers(10_000)))
    slow = [asyncio.create_task(slow_head(port, interval_s=0.25, give_up_after=120)) for _ in range(SLOW_CLIENTS)]
    served = await asyncio.to_thread(complete, url)   # while all of the above are open
    return await asyncio.gather(*big), [await many], await asyncio.gather(*slow), served


@pytest.mark.parametrize("name", ["engine", "gateway"])
def test_head_attacks_get_431_and_408_while_others_are_served_in_bounded_memory(servers, name):
    proc = servers[name]
    port = int(proc.url.rsplit(":", 1)[1])
    assert complete(proc.url) == 200   # warm: the first request's own allocations are not the attack's
    with RssPeak(proc.popen.pid) as rss:
        big, many, slow, served = asyncio.run(attack(port, proc.url))
    assert served == 200
    assert [a.status for a in big + many] == [431] * (BIG_HEADERS + 1)
    assert json.loads(many[0].body)["error"] == {"message": "The request has more than 100 headers, the limit.",
                                                 "type": "invalid_request_error", "param": None, "code": None}
    assert [a.status for a in slow] == [408] * SLOW_CLIENTS
    assert max(a.sent for a in slow) < 120 + 100   # each cut by the server, none gave up
    print(f"{name}: RSS {rss.baseline >> 20} MiB, grew {rss.growth / 2**20:.1f} MiB")
    assert rss.growth < RSS_BOUND, f"{name} grew by {rss.growth >> 20} MiB over the attack"
