"""`pagedkube serve --tensor-parallel-size 2` as a real server process, through the openai client.

- A storm of 256 concurrent clients (chats and completions, streamed and not, n up to 2) is
  answered in full: every request gets its choices and its tokens.
- A worker killed mid-generation (SIGKILL of the rank-1 process) fails the requests in flight
  loudly: a 500 with an OpenAI error for the plain request, an error event for the stream (the
  openai client raises on it), and the server exits non-zero so that its supervisor restarts
  the group; no answer ends as if it were whole.
"""
from __future__ import annotations

import asyncio
import threading
from typing import Callable

import openai
import psutil
import pytest

from .conftest import ServerProcess, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

NUM_CLIENTS = 256
MAX_TOKENS = 8


def tp_server(tmp_path_factory, name: str, *args: str) -> ServerProcess:
    return ServerProcess(tmp_path_factory.mktemp(name), "--tensor-parallel-size", "2", "--served-model-name", "tiny",
                         *args, name=name).start()


def workers(server: ServerProcess) -> list[psutil.Process]:
    """The tensor-parallel worker processes: the processes the engine core spawned."""
    def spawned(p: psutil.Process) -> list[psutil.Process]:
        return [c for c in p.children() if "spawn_main" in " ".join(c.cmdline())]

    (core,) = spawned(psutil.Process(server.proc.pid))
    return spawned(core)


async def storm(url: str) -> list[tuple[int, list[int]]]:
    """(choices, completion tokens per choice) of every client."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)

    async def one(i: int) -> tuple[int, list[int]]:
        n = 2 if i % 5 == 0 else 1
        common = dict(model="tiny", max_tokens=MAX_TOKENS, n=n, temperature=0.0 if i % 2 else 0.7, seed=i,
                      extra_body={"ignore_eos": True})
        if i % 3 == 0:
            stream = await client.completions.create(prompt=f"Dog number {i} needs", stream=True, **common)
            counts = [0] * n
            async for chunk in stream:
                for c in chunk.choices:
                    counts[c.index] += 1 if c.text or c.finish_reason is None else 0
            return n, counts
        if i % 3 == 1:
            r = await client.chat.completions.create(
                messages=[{"role": "user", "content": f"How often should I feed dog {i}?"}], **common)
        else:
            r = await client.completions.create(prompt=f"Can dog {i} eat apples?", **common)
        assert r.usage.completion_tokens == n * MAX_TOKENS
        return len(r.choices), [MAX_TOKENS] * len(r.choices)

    try:
        return await asyncio.gather(*(one(i) for i in range(NUM_CLIENTS)))
    finally:
        await client.close()


def test_256_clients_are_all_answered_under_tp2(tmp_path_factory):
    server = tp_server(tmp_path_factory, "tp-storm", "--max-model-len", "256")
    try:
        assert len(workers(server)) == 1
        results = asyncio.run(storm(server.url))
        assert len(results) == NUM_CLIENTS
        for i, (choices, counts) in enumerate(results):
            assert choices == (2 if i % 5 == 0 else 1) and len(counts) == choices
            assert all(c >= 1 for c in counts), (i, counts)
        assert server.proc.poll() is None
    finally:
        assert server.stop() == 0


def assert_a_killed_rank_fails_in_flight_requests(server: ServerProcess, kill: Callable[[], None],
                                                  message: str) -> None:
    """A plain request and a stream in flight; `kill` ends a rank mid-answer: the stream ends with an
    error event, the plain request with a 500 carrying `message`, and the server exits non-zero."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
    long = dict(model="tiny", max_tokens=1900, temperature=0.0, extra_body={"ignore_eos": True})
    outcome: dict[str, object] = {}

    def plain() -> None:
        try:
            outcome["plain"] = client.completions.create(prompt="My dog barks at night.", **long)
        except openai.APIStatusError as exc:
            outcome["plain"] = exc

    thread = threading.Thread(target=plain)
    thread.start()
    stream = client.chat.completions.create(messages=[{"role": "user", "content": "Hi"}], stream=True, **long)
    chunks = iter(stream)
    next(chunks)
    next(chunks)                                   # tokens are flowing
    kill()
    with pytest.raises(openai.APIError, match="tensor-parallel"):
        for _ in chunks:
            pass
    thread.join(60)
    err = outcome["plain"]
    assert isinstance(err, openai.InternalServerError), err
    assert err.status_code == 500 and message in err.message
    wait_until(lambda: server.proc.poll() is not None, timeout=60)
    assert server.proc.returncode not in (0, None)
    assert "the engine cannot step any more" in server.log()


def test_a_killed_worker_fails_requests_loudly_and_the_server_exits_non_zero(tmp_path_factory):
    server = tp_server(tmp_path_factory, "tp-kill", "--max-model-len", "2048")
    try:
        def kill() -> None:
            (worker,) = workers(server)
            worker.kill()
        assert_a_killed_rank_fails_in_flight_requests(server, kill, "tensor-parallel rank 1 killed by SIGKILL")
    finally:
        server.kill()
