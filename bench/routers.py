"""Router setups for bench/routing.py beyond one pagedkube gateway: R replicas of
our gateway, and vLLM's router (`vllm-router`, PyPI, policy `cache_aware`) with
R replicas, all in front of the same engines.

With R > 1 each request goes to a replica drawn at random (seeded per session
and turn, the same draws for every setup), as behind a Kubernetes Service.

Loads for max/mean: our gateways' in-flight counts summed over the replicas (each
counts its own requests); for vllm-router, which exports none of ours, the
engines' own running + waiting counts.
"""
from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import httpx

VLLM_ROUTER_POLICY = "cache_aware"


@dataclass
class Setup:
    """One routing setup: the URLs clients send to, and how to read it."""
    name: str
    urls: list[str]
    ours: list[str] = field(default_factory=list)     # our gateways: decisions and predicted-cache metrics
    bound: float = 1.5
    loads: Callable[[], dict] | None = None           # one load sample; None: not sampled (ideal)


def replica(seed: int, session_id: str, turn: int, n: int) -> int:
    """Which of n router replicas gets this turn (the same for every setup)."""
    return random.Random(f"{seed}/{session_id}/{turn}/replica").randrange(n) if n > 1 else 0


def gateway_loads(gateways: list[str], in_flight: Callable[[str], dict]) -> Callable[[], dict]:
    def sample() -> dict:
        loads: dict[str, float] = {}
        others = 0.0
        for g in gateways:
            one = in_flight(g)
            for engine, n in one["loads"].items():
                loads[engine] = loads.get(engine, 0.0) + n
            others += one["others"]
        return {"loads": loads, "others": others}
    return sample


def engine_loads(engines: list[str], scrape: Callable[..., dict]) -> Callable[[], dict]:
    names = ("vllm:num_requests_running", "vllm:num_requests_waiting")

    def sample() -> dict:
        return {"loads": {e: sum(scrape(e, *names).values()) for e in engines}, "others": 0.0}
    return sample


def start_vllm_router(procs, engines: list[str], name: str, free_port: Callable[[], int]) -> str:
    """vllm-router in front of `engines` (its own Prometheus port, so replicas do not collide)."""
    return procs.start(name, ["-m", "vllm_router.launch_router", "--worker-urls", *engines,
                              "--policy", VLLM_ROUTER_POLICY, "--prometheus-port", str(free_port())])


def wait_router(url: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url + "/v1/models", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"vllm-router at {url} not ready after {timeout} s")
        time.sleep(0.5)


def have_vllm_router() -> bool:
    try:
        import vllm_router  # noqa: F401
    except ImportError:
        print("vllm-router is not installed in this environment (pip install vllm-router==0.1.17)", file=sys.stderr)
        return False
    return True
