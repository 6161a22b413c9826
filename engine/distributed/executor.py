"""Rank 0's side of a tensor-parallel engine: it starts the workers and feeds them each step.

vLLM's multiprocessing executor, in small: the process that owns the scheduler is rank 0; it
spawns ranks 1..N-1 (engine/distributed/worker.py), each loads its own shard while rank 0 loads
its own, then:

    rank 0                                   rank r (r > 0)
    TPWorkers(config)  -- spawn ------------> run_worker: ModelRunner(config, tp=WorkerLink)
    load shard 0                              load shard r
    agree(): WorkerReady(blocks) <---pipe---- agree(): its KV pool's room, in blocks
             StartGroup(min)     ----pipe---> (every rank allocates the same number of blocks)
    TPGroup over the TCPStore   <==========> TPGroup
    per step: broadcast_object(StepInputs) => forward on its shard, all-reduces, lm_head gather
    shutdown(): broadcast_object(None)   ==> exits

Block tables, the scheduler, the prefix cache and the cache feed exist only on rank 0: a worker
sees a step as tensors (slot mapping, block tables) and never decides anything. Start-up waits
for every worker's WorkerReady while watching that it is still alive, so a worker that fails to
load is a WorkerFailed naming its error, not a hang. During steps, check_alive() before each
broadcast and the collectives' own errors and timeout (EngineConfig.distributed_timeout) turn
a dead or hung worker into WorkerFailed (engine/distributed/errors.py says what follows).
"""
from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import signal
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Iterator

import torch
import torch.distributed as dist

from pagedkube.engine.config import EngineConfig
from pagedkube.engine.distributed.errors import WorkerFailed
from pagedkube.engine.distributed.group import TPGroup

log = logging.getLogger(__name__)

STORE_HOST = "127.0.0.1"     # one node: the workers are this process's children
POLL_S = 0.1                 # start-up: how often a silent worker's liveness is checked
JOIN_TIMEOUT_S = 10.0
EXIT_GRACE_S = 2.0           # a failed collective: how long to wait to see which worker exited


@dataclass(frozen=True)
class WorkerArgs:
    config: EngineConfig
    rank: int
    store_port: int
    num_threads: int          # torch threads of the worker: the cores shared out between the ranks
    parent_pid: int
    log_level: int


@dataclass(frozen=True)
class WorkerReady:
    num_kv_blocks: int        # blocks the worker's pool has room for


@dataclass(frozen=True)
class WorkerStartFailed:
    message: str


@dataclass(frozen=True)
class StartGroup:
    num_kv_blocks: int        # the agreed pool size: the smallest any rank has room for


def move_tensors(obj: Any, device: torch.device | str) -> Any:
    """A copy of a dataclass (StepInputs, AttentionMetadata) with every tensor on `device`;
    the metadata's derived-tensor cache is left behind (each rank derives its own)."""
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, torch.Tensor):
            changes[f.name] = value.to(device)
        elif dataclasses.is_dataclass(value):
            changes[f.name] = move_tensors(value, device)
        elif f.name == "derived":
            changes[f.name] = {}
    return dataclasses.replace(obj, **changes)


@contextmanager
def _children_allowed() -> Iterator[None]:
    """The server's engine core is a daemon process (it must not outlive the HTTP process), and
    multiprocessing refuses children to a daemon, because a daemon is killed without running its
    exit handlers and would orphan them. Ours cannot be orphaned: each worker dies with its
    parent (PR_SET_PDEATHSIG, worker.py) and with rank 0's sockets. So the flag is lifted while
    the workers start."""
    me = multiprocessing.current_process()
    daemon = me._config.get("daemon", False)     # type: ignore[attr-defined]
    me._config["daemon"] = False                 # type: ignore[attr-defined]
    try:
        yield
    finally:
        me._config["daemon"] = daemon            # type: ignore[attr-defined]


def _stop(procs: list[BaseProcess]) -> None:
    for proc in procs:
        if proc.is_alive():
            proc.kill()
        proc.join(JOIN_TIMEOUT_S)


class TPWorkers:
    rank = 0

    def __init__(self, config: EngineConfig):
        from pagedkube.engine.distributed.worker import run_worker

        self.world_size = config.tensor_parallel_size
        self.timeout_s = config.distributed_timeout
        assert self.world_size > 1, self.world_size
        # the OS picks the port; the workers get it in their arguments
        self.store = dist.TCPStore(STORE_HOST, 0, self.world_size, True, timedelta(seconds=self.timeout_s),
                                   wait_for_workers=False)
        num_threads = max(1, torch.get_num_threads() // self.world_size)
        torch.set_num_threads(num_threads)
        ctx = multiprocessing.get_context("spawn")
        self.procs: list[BaseProcess] = []
        self.conns: list[Connection] = []
        with _children_allowed():
            for rank in range(1, self.world_size):
                conn, child = ctx.Pipe(duplex=True)
                args = WorkerArgs(config, rank, self.store.port, num_threads, os.getpid(), logging.getLogger().level)
                proc = ctx.Process(target=run_worker, args=(args, child), name=f"tp-rank-{rank}", daemon=True)
                proc.start()
                child.close()
                self.procs.append(proc)
                self.conns.append(conn)
        self.group: TPGroup | None = None
        self._finalizer = weakref.finalize(self, _stop, self.procs)

    def _receive(self, rank: int) -> Any:
        proc, conn = self.procs[rank - 1], self.conns[rank - 1]
        while True:
            try:
                if conn.poll(POLL_S):
                    return conn.recv()
            except (EOFError, OSError):
                pass
            if not proc.is_alive():
                raise WorkerFailed(f"tensor-parallel rank {rank} exited with code {proc.exitcode} while starting")

    def agree(self, num_kv_blocks: int, device: torch.device) -> tuple[int, TPGroup]:
        """Waits for every worker's shard; returns the pool size all ranks allocate, and the group."""
        counts = [num_kv_blocks]
        for rank in range(1, self.world_size):
            msg = self._receive(rank)
            if isinstance(msg, WorkerStartFailed):
                raise WorkerFailed(f"tensor-parallel rank {rank} failed to start: {msg.message}")
            assert isinstance(msg, WorkerReady), msg
            counts.append(msg.num_kv_blocks)
        agreed = min(counts)
        for conn in self.conns:
            conn.send(StartGroup(agreed))
        self.group = TPGroup(self.store, 0, self.world_size, self.timeout_s, device)
        return agreed, self.group

    def check_alive(self) -> None:
        for rank, proc in enumerate(self.procs, start=1):
            code = proc.exitcode
            if code is not None:
                how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
                raise WorkerFailed(f"tensor-parallel rank {rank} {how}")

    def explain(self, exc: WorkerFailed) -> WorkerFailed:
        """The failure of a collective as the user needs it: which worker exited, and how (its
        peers' sockets close as it dies, so its exit may take a moment to be seen)."""
        deadline = time.monotonic() + EXIT_GRACE_S
        while time.monotonic() < deadline:
            try:
                self.check_alive()
            except WorkerFailed as exited:
                return exited
            time.sleep(POLL_S / 10)
        return exc

    def broadcast_step(self, step: Any) -> None:
        assert self.group is not None, "broadcast_step before agree"
        self.check_alive()
        self.group.broadcast_object(move_tensors(step, "cpu"))

    def shutdown(self) -> None:
        """Asks the workers to exit (kills those that do not); safe to call twice."""
        if self.group is not None and all(p.exitcode is None for p in self.procs):
            try:
                self.group.broadcast_object(None)
            except WorkerFailed:
                pass
            for proc in self.procs:
                proc.join(JOIN_TIMEOUT_S)
        self.group = None
        self._finalizer()
