"""Rank 0's side of a tensor-parallel engine: it starts the workers and feeds them each step.

vLLM's multiprocessing executor, in small: the process that owns the scheduler is rank 0; it
hosts the TCPStore, spawns ranks 1..N-1 of its own node (engine/distributed/worker.py), each
loads its own shard while rank 0 loads its own, then:

    rank 0                                     rank r (r > 0)
    TPWorkers(config): store, spawn ---------> run_worker: ModelRunner(config, tp=WorkerLink)
    load shard 0                                load shard r
    agree(): ready/r on the store  <---------- agree(): WorkerReady(its KV pool's room, in blocks)
             agreed on the store   ----------> (every rank allocates the same number of blocks)
    TPGroup over the TCPStore     <==========> TPGroup
    per step: broadcast_object(StepInputs) ==> forward on its shard, all-reduces, lm_head gather
    shutdown(): broadcast_object(None)     ==> exits

With nnodes > 1 the store listens on master_port on every interface and ranks of nodes 1..K-1
are started by `pagedkube serve-worker` in other pods (engine/distributed/node.py), which read
the config from the store; the handshake is the same keys (engine/distributed/rendezvous.py).

Block tables, the scheduler, the prefix cache and the cache feed exist only on rank 0: a worker
sees a step as tensors (slot mapping, block tables) and never decides anything. Start-up waits
for every rank's ready key while watching that the local workers are still alive, so a worker
that fails to load is a WorkerFailed naming its error, and a node that never joins is one after
EngineConfig.distributed_timeout, naming the missing ranks. During steps, check_alive() before
each broadcast and the collectives' own errors and timeout turn a dead or hung worker into
WorkerFailed (engine/distributed/errors.py says what follows).
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
from multiprocessing.process import BaseProcess
from typing import Any, Iterator

import torch
import torch.distributed as dist

from pagedkube.engine.config import EngineConfig
from pagedkube.engine.distributed.errors import WorkerFailed
from pagedkube.engine.distributed.group import TPGroup
from pagedkube.engine.distributed.rendezvous import Rendezvous, WorkerStartFailed

log = logging.getLogger(__name__)

STORE_HOST = "127.0.0.1"     # where a node's own workers reach the store (it listens on every interface)
POLL_S = 0.1                 # start-up: how often a silent worker's liveness is checked
JOIN_TIMEOUT_S = 10.0
EXIT_GRACE_S = 2.0           # a failed collective: how long to wait to see which worker exited


@dataclass(frozen=True)
class WorkerArgs:
    config: EngineConfig
    rank: int
    store_host: str
    store_port: int
    num_threads: int          # torch threads of the worker: the cores shared out between the node's ranks
    parent_pid: int
    log_level: int


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


def stop_workers(procs: list[BaseProcess]) -> None:
    for proc in procs:
        if proc.is_alive():
            proc.kill()
        proc.join(JOIN_TIMEOUT_S)


def spawn_workers(config: EngineConfig, ranks: range, store_host: str, store_port: int) -> list[BaseProcess]:
    """Starts one worker process per rank, sharing this process's torch threads out between them
    (and this process itself when it is rank 0)."""
    from pagedkube.engine.distributed.worker import run_worker

    num_threads = max(1, torch.get_num_threads() // config.tensor_parallel_size)
    torch.set_num_threads(num_threads)
    ctx = multiprocessing.get_context("spawn")
    procs: list[BaseProcess] = []
    with _children_allowed():
        for rank in ranks:
            args = WorkerArgs(config, rank, store_host, store_port, num_threads, os.getpid(),
                              logging.getLogger().level)
            proc = ctx.Process(target=run_worker, args=(args,), name=f"tp-rank-{rank}", daemon=True)
            proc.start()
            procs.append(proc)
    return procs


def exit_reason(code: int) -> str:
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"


class TPWorkers:
    rank = 0

    def __init__(self, config: EngineConfig):
        self.world_size = config.world_size
        self.nnodes, self.master_port = config.nnodes, config.master_port
        self.timeout_s = config.distributed_timeout
        assert self.world_size > 1, self.world_size
        # one node: the OS picks the port and the workers get it in their arguments; more: the
        # fixed master_port, which the other nodes' serve-worker is told
        port = 0 if config.nnodes == 1 else config.master_port
        try:
            self.store = dist.TCPStore(STORE_HOST, port, self.world_size, True,
                                       timedelta(seconds=self.timeout_s), wait_for_workers=False)
        except RuntimeError as e:
            raise WorkerFailed(f"tensor-parallel store cannot listen on port {port}: {e}") from e
        self.rendezvous = Rendezvous(self.store)
        if config.nnodes > 1:
            self.rendezvous.post_config(config)
        self.procs = spawn_workers(config, range(1, config.tensor_parallel_size), STORE_HOST, self.store.port)
        self.group: TPGroup | None = None
        self._finalizer = weakref.finalize(self, stop_workers, self.procs)

    def _local(self, rank: int) -> BaseProcess | None:
        """The process of a rank this process spawned; None for a rank of another node."""
        return self.procs[rank - 1] if rank <= len(self.procs) else None

    def _wait_ready(self) -> dict[int, int]:
        """Every rank's pool room, once all have loaded their shards; WorkerFailed when one fails,
        exits, or (a rank of another node) has not joined within the timeout."""
        rooms: dict[int, int] = {}
        deadline = time.monotonic() + self.timeout_s
        while len(rooms) < self.world_size - 1:
            for rank in range(1, self.world_size):
                if rank in rooms:
                    continue
                msg = self.rendezvous.take_ready(rank)
                if isinstance(msg, WorkerStartFailed):
                    raise WorkerFailed(f"tensor-parallel rank {rank} failed to start: {msg.message}")
                if msg is not None:
                    rooms[rank] = msg.num_kv_blocks
                    continue
                proc = self._local(rank)
                if proc is not None and proc.exitcode is not None:
                    raise WorkerFailed(f"tensor-parallel rank {rank} {exit_reason(proc.exitcode)} while starting")
            # this node's ranks are watched by their processes (loading may take long); another
            # node's may never come, so only they have a deadline
            remote = [r for r in range(len(self.procs) + 1, self.world_size) if r not in rooms]
            if remote and time.monotonic() > deadline:
                nodes = sorted({r // (len(self.procs) + 1) for r in remote})
                raise WorkerFailed(f"tensor-parallel ranks {remote} did not join within {self.timeout_s:g}s; is "
                                   f"`pagedkube serve-worker --master-addr <this host> --master-port "
                                   f"{self.master_port} --node-rank N` running for node(s) {nodes}?")
            if len(rooms) < self.world_size - 1:
                time.sleep(POLL_S)
        return rooms

    def agree(self, num_kv_blocks: int, device: torch.device) -> tuple[int, TPGroup]:
        """Waits for every worker's shard; returns the pool size all ranks allocate, and the group."""
        agreed = min([num_kv_blocks, *self._wait_ready().values()])
        self.rendezvous.post_agreed(agreed)
        self.group = TPGroup(self.store, 0, self.world_size, self.timeout_s, device)
        return agreed, self.group

    def check_alive(self) -> None:
        """A local worker's exit; another node's ranks are seen by the collectives failing."""
        for rank, proc in enumerate(self.procs, start=1):
            code = proc.exitcode
            if code is not None:
                raise WorkerFailed(f"tensor-parallel rank {rank} {exit_reason(code)}")

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
        if self.nnodes > 1:
            return WorkerFailed(f"{exc} (no worker of this node exited: a rank on another node is gone or hung)")
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
