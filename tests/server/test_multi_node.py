"""A multi-node engine on one machine: `pagedkube serve --nnodes 2` and a `pagedkube serve-worker`
started separately (not spawned by the leader), joined over the leader's TCPStore on 127.0.0.1,
through the openai client.

- The pair gives TP=1's greedy tokens (rank 0 and rank 1 each hold half of builtin://tiny); a
  serve-worker with a node rank the engine does not have exits 1 with a clear error first; both
  stopped at once (SIGTERM), the request in flight is drained whole and both exit 0.
- Killing the worker node fails the requests in flight loudly (500, an SSE error event) and
  the leader exits non-zero.
- A leader whose worker node never joins fails after --distributed-timeout, naming the node.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from .conftest import ServerProcess, free_port
from .test_tensor_parallel import assert_a_killed_rank_fails_in_flight_requests

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PROMPTS = ["My dog barks at night.", "Can dogs eat apples?", "How often should I walk a puppy?"]
GREEDY = dict(model="tiny", max_tokens=16, temperature=0.0, extra_body={"ignore_eos": True})


class WorkerNode:
    """`pagedkube serve-worker` in a process group of its own, as another pod would run it."""

    def __init__(self, log_path: Path, master_port: int, node_rank: int):
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pagedkube", "serve-worker", "--master-addr", "127.0.0.1",
             "--master-port", str(master_port), "--node-rank", str(node_rank), "--join-timeout", "120"],
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self._log.close()


def leader(tmp_path: Path, name: str, master_port: int, *args: str) -> ServerProcess:
    return ServerProcess(tmp_path, "--served-model-name", "tiny", "--nnodes", "2", "--master-port", str(master_port),
                         *args, name=name).launch()


def greedy_texts(url: str) -> list[str]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    texts = [client.completions.create(prompt=p, **GREEDY).choices[0].text for p in PROMPTS]
    chat = client.chat.completions.create(messages=[{"role": "user", "content": PROMPTS[0]}], **GREEDY)
    return texts + [chat.choices[0].message.content]


def test_a_leader_and_a_separately_started_worker_node_give_tp1s_greedy_tokens(tmp_path):
    single = ServerProcess(tmp_path, "--served-model-name", "tiny", name="tp1").start()
    try:
        expected = greedy_texts(single.url)
    finally:
        assert single.stop() == 0
    port = free_port()
    server = leader(tmp_path, "leader", port)
    stray = WorkerNode(tmp_path / "stray.log", port, node_rank=2)
    worker = None
    try:
        assert stray.proc.wait(120) == 1
        assert "node rank 2 is not a worker node of the leader's engine (nnodes 2: worker nodes are 1..1)" \
            in stray.log()
        worker = WorkerNode(tmp_path / "worker.log", port, node_rank=1)
        server.wait_ready()
        assert "node 1 of 2: ranks 1-1 of builtin://tiny" in worker.log()
        assert greedy_texts(server.url) == expected
        # A group's pods are stopped together (scale-in, rollout): the worker node serves on while
        # the leader drains its request in flight, which completes; then both exit 0.
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
        chunks = iter(client.completions.create(prompt=PROMPTS[0], stream=True, **{**GREEDY, "max_tokens": 400}))
        next(chunks)
        worker.proc.send_signal(signal.SIGTERM)
        server.proc.send_signal(signal.SIGTERM)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finish == ["length"]                     # all 400 tokens: no rank left early
        assert server.proc.wait(60) == 0
        assert worker.proc.wait(60) == 0                # rank 0 shut the engine down: the node ends cleanly
        assert "SIGTERM: draining 1 in-flight request(s)" in server.log()
        assert "SIGTERM: the ranks serve on" in worker.log()
    finally:
        server.kill()
        stray.kill()
        if worker is not None:
            worker.kill()


def test_killing_the_worker_node_fails_in_flight_requests_loudly(tmp_path):
    port = free_port()
    server = leader(tmp_path, "leader", port, "--max-model-len", "2048")
    worker = WorkerNode(tmp_path / "worker.log", port, node_rank=1)
    try:
        server.wait_ready()
        assert_a_killed_rank_fails_in_flight_requests(server, worker.kill, "a rank on another node is gone or hung")
    finally:
        server.kill()
        worker.kill()


def test_a_worker_node_that_never_joins_fails_the_leader_with_a_clear_error(tmp_path):
    port = free_port()
    server = leader(tmp_path, "leader", port, "--distributed-timeout", "3")
    try:
        with pytest.raises(RuntimeError, match="server exited"):
            server.wait_ready()
        assert server.proc.returncode not in (0, None)
        assert (f"tensor-parallel ranks [1] did not join within 3s; is `pagedkube serve-worker --master-addr "
                f"<this host> --master-port {port} --node-rank N` running for node(s) [1]?") in server.log()
    finally:
        server.kill()
