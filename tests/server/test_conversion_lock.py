"""Two `pagedkube serve` processes started on one GGUF with one cache convert it once
(engine/gguf/prepare.py under engine/cache_lock.py), and the second one is seen waiting.

To see the wait rather than hope for it, engine A is frozen (SIGSTOP to its process group)
right after it logs that it is converting, that is while it holds the lock; engine B is
started then, and A is thawed only once B has logged that it waits on A's lock.
"""
from __future__ import annotations

import os
import signal

import openai

from gguf_factory import write_tiny_gguf

from .conftest import START_TIMEOUT_S, ServerProcess, wait_until

GGUF = "tiny.Q4_1.gguf"
CONVERTING = f"converting {GGUF} (sha256 "
CONVERTED = f"converted {GGUF} in "
WAITING = f"converting {GGUF}: waiting for another process that holds "
FOUND = f"{GGUF}: converted by another process while this one waited; using "


def answer(server: ServerProcess) -> str:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
    reply = client.chat.completions.create(model=client.models.list().data[0].id, max_tokens=8, temperature=0,
                                           messages=[{"role": "user", "content": "Hello"}])
    return reply.choices[0].message.content


def test_two_engines_on_one_gguf_convert_it_once_and_the_second_waits_on_the_lock(tmp_path) -> None:
    gguf = write_tiny_gguf(tmp_path / GGUF, "llama", "Q4_1")
    env = {**os.environ, "PAGEDKUBE_CACHE_DIR": str(tmp_path / "cache")}
    args = ("--model", str(gguf), "--max-model-len", "256")
    a = ServerProcess(tmp_path, *args, name="a", env=env).launch()
    b = ServerProcess(tmp_path, *args, name="b", env=env)
    try:
        wait_until(lambda: CONVERTING in a.log(), timeout=START_TIMEOUT_S)
        os.killpg(a.proc.pid, signal.SIGSTOP)
        try:
            assert CONVERTED not in a.log(), "A finished converting before it could be frozen"
            b.launch()
            wait_until(lambda: WAITING in b.log(), timeout=START_TIMEOUT_S)
            assert CONVERTED not in a.log()
        finally:
            os.killpg(a.proc.pid, signal.SIGCONT)
        a.wait_ready()
        b.wait_ready()
        assert answer(a) == answer(b)
    finally:
        a.stop()
        b.stop()
    logs = a.log() + b.log()
    assert logs.count(CONVERTING) == 1 and logs.count(CONVERTED) == 1
    assert CONVERTING in a.log() and FOUND in b.log(), b.log()
