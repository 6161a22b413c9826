"""The engine core runs in its own process: its death is reported, never hung on, and it
never outlives the HTTP process.

Real `pagedkube serve` processes; the core is found as the server's child process.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx

from .conftest import ServerProcess, wait_until


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def engine_core_pid(server_pid: int) -> int:
    cores = [c for c in children(server_pid)
             if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
    assert len(cores) == 1, cores
    return cores[0]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_core_death_fails_requests_and_exits_non_zero(tmp_path):
    """A dead core cannot come back inside this process: its requests fail loudly and
    the server exits 1, so that kubelet or `pagedkube up` restarts it (it used to
    answer 500 forever)."""
    server = ServerProcess(tmp_path, "--max-model-len", "256", name="core-death").start()
    try:
        core = engine_core_pid(server.proc.pid)
        with httpx.Client(base_url=server.url, timeout=60) as c:
            body = {"prompt": "Tell me about dogs.", "max_tokens": 200, "ignore_eos": True, "stream": True}
            with c.stream("POST", "/v1/completions", json=body) as s:
                lines = s.iter_lines()
                first = next(line for line in lines if line)
                assert first.startswith("data: {") and '"choices"' in first
                os.kill(core, signal.SIGKILL)
                rest = [line for line in lines if line]
            # The stream ends with an error event naming the cause, and no [DONE]: it is not whole.
            assert "the engine-core process died" in rest[-1] and "data: [DONE]" not in rest
        assert server.proc.wait(30) == 1
        assert "the engine core exited unexpectedly" in server.log()
    finally:
        server.kill()


def test_core_exits_when_the_http_process_is_killed(tmp_path):
    server = ServerProcess(tmp_path, "--max-model-len", "256", name="orphan").start()
    try:
        core = engine_core_pid(server.proc.pid)
        assert alive(core)
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(10)
        wait_until(lambda: not alive(core), timeout=30)
    finally:
        server.kill()


def test_engine_in_process_mode_answers_the_same(tmp_path, server):
    """--engine-in-process (the engine in a thread of the HTTP process) is kept for
    debugging: same greedy tokens as the default engine-core process."""
    body = {"prompt": "How often should I feed my cat?", "max_tokens": 12, "temperature": 0, "logprobs": 2}
    threaded = ServerProcess(tmp_path, "--max-model-len", "512", "--engine-in-process", name="in-process").start()
    try:
        assert not [c for c in children(threaded.proc.pid)
                    if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
        with httpx.Client(timeout=60) as c:
            a = c.post(f"{threaded.url}/v1/completions", json=body).json()["choices"][0]
            b = c.post(f"{server.url}/v1/completions", json=body).json()["choices"][0]
    finally:
        threaded.stop()
    assert a["text"] == b["text"] and a["logprobs"]["tokens"] == b["logprobs"]["tokens"]
    assert len(a["logprobs"]["tokens"]) == 12
