"""A tensor-parallel worker (rank r > 0): loads its shard, then runs the steps rank 0 broadcasts.

The process is spawned by rank 0 (engine/distributed/executor.py) and has no scheduler, no
sampler and no requests: each step arrives as one broadcast StepInputs, and the worker runs the
same forward pass as rank 0 on its shard, taking part in every all-reduce and in the logits'
gather. It dies with rank 0 (PR_SET_PDEATHSIG, and a failed collective when rank 0's sockets
close) and ignores SIGINT (a terminal's Ctrl-C reaches the whole process group; rank 0 decides).
"""
from __future__ import annotations

import logging
import signal
import sys
from datetime import timedelta
from multiprocessing.connection import Connection

import torch
import torch.distributed as dist

from pagedkube.engine.distributed.errors import WorkerFailed
from pagedkube.engine.distributed.executor import (STORE_HOST, StartGroup, WorkerArgs, WorkerReady,
                                                   WorkerStartFailed)
from pagedkube.engine.distributed.group import TPGroup
from pagedkube.parent_death import die_with_parent

log = logging.getLogger(__name__)


class WorkerLink:
    """A worker's side of the start-up handshake; the ModelRunner's `tp` on ranks > 0."""

    def __init__(self, args: WorkerArgs, conn: Connection):
        self.rank, self.world_size = args.rank, args.config.tensor_parallel_size
        self.timeout_s = args.config.distributed_timeout
        self.conn = conn
        self.store = dist.TCPStore(STORE_HOST, args.store_port, self.world_size, False,
                                   timedelta(seconds=self.timeout_s))
        self.group: TPGroup | None = None

    def agree(self, num_kv_blocks: int, device: torch.device) -> tuple[int, TPGroup]:
        self.conn.send(WorkerReady(num_kv_blocks))
        msg = self.conn.recv()
        assert isinstance(msg, StartGroup), msg
        self.group = TPGroup(self.store, self.rank, self.world_size, self.timeout_s, device)
        return msg.num_kv_blocks, self.group


def run_worker(args: WorkerArgs, conn: Connection) -> None:
    """The worker process's entry point (multiprocessing "spawn" target)."""
    die_with_parent(signal.SIGKILL, args.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=args.log_level,
                        format=f"%(asctime)s %(levelname)s %(name)s [rank {args.rank}]: %(message)s")
    torch.set_num_threads(args.num_threads)
    from pagedkube.engine.model_runner import ModelRunner

    link = WorkerLink(args, conn)
    try:
        runner = ModelRunner(args.config, tp=link)
    except BaseException as exc:
        log.exception("loading tensor-parallel rank %d failed", args.rank)
        conn.send(WorkerStartFailed(f"{type(exc).__name__}: {exc}"))
        sys.exit(1)
    assert link.group is not None     # ModelRunner agreed the pool size, which builds the group
    try:
        while (step := link.group.broadcast_object()) is not None:
            runner.execute_shard(step)
    except WorkerFailed as exc:
        log.error("%s: exiting", exc)
        sys.exit(1)
