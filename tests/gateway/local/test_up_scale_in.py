"""The scale-in that lost requests, with real processes (`pagedkube up --autoscale`):

    --min-replicas 1 --max-replicas 3 --target-queue-depth 4 --max-num-seqs 8 --scale-down-window 30
    40 clients of short requests, then 12 long streams

Before, the autoscaler went 1 -> 3 -> 2 -> 3 -> 1 and removed two of three engines while the 12
streams ran (its signal, the engines' waiting queues, read a busy engine with an empty queue as
idle); the drain timed out and aborted 3 streams. Now: no request is lost, the engines that
serve never fall below what the streams in flight need to run (ceil(12 / 8) = 2), and the
replica count changes at most once per scale-down window while the streams run.
"""
from __future__ import annotations

import asyncio
import json
import math
import time

import httpx
import pytest
from up_process import START_TIMEOUT_S, Up, assert_stopped_cleanly

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

MAX_NUM_SEQS, TARGET, WINDOW_S = 8, 4, 30
CLIENTS, STREAMS, STREAM_TOKENS = 40, 12, 1200
FLAGS = ["--replicas", "1", "--autoscale", "--min-replicas", "1", "--max-replicas", "3",
         "--target-queue-depth", str(TARGET), "--max-num-seqs", str(MAX_NUM_SEQS),
         "--scale-up-window", "0", "--scale-down-window", str(WINDOW_S), "--autoscale-interval", "0.5",
         "--max-model-len", "1400", "--num-kv-blocks", "800"]


async def short_clients(url: str, stop: asyncio.Event, answers: list) -> None:
    async def one(c: int) -> None:
        async with httpx.AsyncClient(timeout=600) as http:
            i = 0
            while not stop.is_set():
                r = await http.post(f"{url}/v1/completions", json={
                    "model": "tiny", "prompt": f"Client {c} asks question {i} about dogs", "max_tokens": 24,
                    "ignore_eos": True})
                answers.append((r.status_code, r.json()["usage"]["completion_tokens"] if r.status_code == 200 else r.text))
                i += 1
    await asyncio.gather(*(one(c) for c in range(CLIENTS)))


async def long_stream(url: str, n: int) -> dict:
    """One streamed completion of STREAM_TOKENS tokens: what arrived, and how it ended."""
    tokens, finish, errors, done = 0, None, [], False
    async with httpx.AsyncClient(timeout=900) as http:
        async with http.stream("POST", f"{url}/v1/completions", json={
                "model": "tiny", "prompt": f"Stream {n}: tell me everything about parrots", "stream": True,
                "max_tokens": STREAM_TOKENS, "ignore_eos": True, "stream_options": {"include_usage": True}}) as r:
            status = r.status_code
            async for line in r.aiter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    event = json.loads(line[6:])
                    if "error" in event:
                        errors.append(event["error"])
                    elif event.get("usage"):
                        tokens = event["usage"]["completion_tokens"]
                    for choice in event.get("choices", []):
                        finish = choice.get("finish_reason") or finish
    return {"status": status, "tokens": tokens, "finish": finish, "errors": errors, "done": done}


async def sampler(up: Up, samples: list, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            m = await asyncio.to_thread(up.metrics)
            samples.append((time.monotonic(), m))
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.25)


def changes(samples: list) -> list[float]:
    """When the scale events counter moved (up or down), from the sampled gauges."""
    def events(m: dict) -> float:
        return sum(v for k, v in m.items() if k.startswith("pagedkube_autoscaler_scale_events_total"))
    return [t for (_, a), (t, b) in zip(samples, samples[1:]) if events(b) != events(a)]


def test_scale_in_under_long_streams_loses_nothing_and_does_not_flip_flop(tmp_path):
    up = Up(tmp_path, *FLAGS)
    try:
        up.wait_for(lambda: httpx.get(f"{up.url}/ready", timeout=5).status_code == 200, START_TIMEOUT_S,
                    "the first engine")

        async def scenario():
            samples: list = []
            stop_sampling, stop_clients = asyncio.Event(), asyncio.Event()
            sampling = asyncio.create_task(sampler(up, samples, stop_sampling))
            answers: list = []
            clients = asyncio.create_task(short_clients(up.url, stop_clients, answers))
            # The 40 clients scale the fleet to its maximum; they stop once all three engines serve.
            deadline = time.monotonic() + 3 * START_TIMEOUT_S
            while not (samples and samples[-1][1].get("pagedkube_autoscaler_ready_replicas") == 3):
                assert time.monotonic() < deadline, up.text()[-4000:]
                await asyncio.sleep(0.5)
            await asyncio.sleep(3)
            stop_clients.set()
            await clients
            streams_start = time.monotonic()
            streams = await asyncio.gather(*(long_stream(up.url, n) for n in range(STREAMS)))
            streams_end = time.monotonic()
            stop_sampling.set()
            await sampling
            return answers, streams, samples, streams_start, streams_end

        answers, streams, samples, t0, t1 = asyncio.run(scenario())
        # No request lost: every short request answered in full, every stream whole.
        assert answers and all(a == (200, 24) for a in answers), [a for a in answers if a != (200, 24)][:5]
        for s in streams:
            assert s == {"status": 200, "tokens": STREAM_TOKENS, "finish": "length", "errors": [], "done": True}, s
        # Never below the engines the work in flight needs to run, while the streams run.
        during = [m for t, m in samples if t0 + 2 <= t <= t1]
        assert during
        for m in during:
            needed = math.ceil(min(m["pagedkube_autoscaler_in_flight"], STREAMS) / MAX_NUM_SEQS)
            assert m["pagedkube_autoscaler_ready_replicas"] >= needed, m
        # Under this steady load: at most one replica change per scale-down window.
        moves = [t for t in changes(samples) if t0 <= t <= t1]
        assert len(moves) <= math.ceil((t1 - t0) / WINDOW_S), (moves, t1 - t0)
        assert all(b - a >= WINDOW_S for a, b in zip(moves, moves[1:])), moves
        assert "draining" in up.text() and "aborting" not in up.text()
    finally:
        assert_stopped_cleanly(up, len(up.engine_pids()))
