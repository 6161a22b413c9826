"""The scripted load of the Prometheus tier, through the official openai client.

    burst   clients send streamed chats that share one long system prompt
            (prefix-cache hits, affinity routing, predicted and realized cached
            tokens) and plain completions, until the autoscaler's second engine
            has served some of them (scale up, queue depth over target);
    errors  an unknown model (404 from the gateway), a bad body (400);
    lull    no traffic until the autoscaler scales back in (scale down).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx
import openai

from tier_stack import SCRAPE_INTERVAL_S, START_TIMEOUT_S, Up

# ~500 tokens of the built-in tokenizer: deeper than the ring key's 16 blocks of 16
# tokens, so a repeat lands on the engine that cached it (routing rule 1, affinity).
SYSTEM = ("You are the assistant of a small veterinary clinic. Answer briefly, kindly and with care; "
          "when a pet may be ill, tell the owner to call the clinic. ") * 10
QUESTIONS = ("How often should I feed my puppy?", "Is chocolate bad for cats?", "When do kittens get teeth?",
             "How long do rabbits sleep?", "Can dogs eat apples?", "Why does my parrot pluck feathers?")
CLIENTS = 8
MAX_BURST_REQUESTS = 240        # a bound on the burst if the second engine never comes
SECOND_ENGINE_SERVED = 4        # requests the scaled-up engine must answer before the burst ends


@dataclass(slots=True)
class LoadResult:
    start: float                                 # unix seconds
    end: float = 0.0
    statuses: dict[int, int] = field(default_factory=dict)
    engines: dict[str, int] = field(default_factory=dict)   # x-pagedkube-endpoint -> requests served


async def _client(c: int, up: Up, result: LoadResult, done: asyncio.Event, first_engine: str) -> None:
    client = openai.AsyncOpenAI(base_url=f"{up.url}/v1", api_key="unused", max_retries=0, timeout=300)
    i = 0
    async with client:
        while not done.is_set() and sum(result.statuses.values()) < MAX_BURST_REQUESTS:
            q = QUESTIONS[(c + i) % len(QUESTIONS)]
            if i % 3 == 2:
                raw = await client.completions.with_raw_response.create(
                    model="tiny", prompt=f"Client {c}, request {i}: my dog likes to", max_tokens=8)
                raw.parse()
            else:
                raw = await client.chat.completions.with_raw_response.create(
                    model="tiny", max_tokens=12, stream=True, stream_options={"include_usage": True},
                    messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}])
                async for _ in raw.parse():
                    pass
            engine = raw.headers.get("x-pagedkube-endpoint", "")
            result.statuses[raw.status_code] = result.statuses.get(raw.status_code, 0) + 1
            result.engines[engine] = result.engines.get(engine, 0) + 1
            if sum(n for url, n in result.engines.items() if url != first_engine) >= SECOND_ENGINE_SERVED:
                done.set()
            i += 1


async def _errors(up: Up, result: LoadResult) -> None:
    client = openai.AsyncOpenAI(base_url=f"{up.url}/v1", api_key="unused", max_retries=0, timeout=60)
    async with client:
        for _ in range(3):
            try:
                await client.completions.create(model="no-such-model", prompt="hi", max_tokens=2)
            except openai.NotFoundError as e:
                result.statuses[e.status_code] = result.statuses.get(e.status_code, 0) + 1
    async with httpx.AsyncClient(timeout=60) as http:
        r = await http.post(f"{up.url}/v1/completions", content=b"{not json")
        result.statuses[r.status_code] = result.statuses.get(r.status_code, 0) + 1


def run_load(up: Up) -> LoadResult:
    result = LoadResult(start=time.time())
    first_engine = up.engines()["engine-0"][1]

    async def burst() -> None:
        done = asyncio.Event()
        await asyncio.wait_for(asyncio.gather(*(_client(c, up, result, done, first_engine) for c in range(CLIENTS)),
                                              _errors(up, result)), START_TIMEOUT_S + 120)

    asyncio.run(burst())
    # The lull: the autoscaler scales back to one engine after its scale-down window.
    up.wait_for(lambda: sum(1 for state, _ in up.engines().values() if state == "ready") == 1
                and any(state == "stopped" for state, _ in up.engines().values()), 120, "the scale-in")
    time.sleep(4 * SCRAPE_INTERVAL_S)   # the last scrapes of the quiet fleet
    result.end = time.time()
    return result
