"""A tensor-parallel worker (rank r > 0): loads its shard, then runs the steps rank 0 broadcasts.

The process is spawned by rank 0 (engine/distributed/executor.py) or, on another node, by
`pagedkube serve-worker` (engine/distributed/node.py), and has no scheduler, no sampler and no
requests: each step arrives as one broadcast StepInputs, and the worker runs the same forward
pass as rank 0 on its shard, taking part in every all-reduce and in the logits' gather. It dies
with the process that spawned it (PR_SET_PDEATHSIG), exits when a collective fails (rank 0's
sockets close) and ignores SIGINT (a terminal's Ctrl-C reaches the whole process group; rank 0
decides).
"""
from __future__ import annotations

import logging
import signal
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from pagedkube.engine.distributed.errors import WorkerFailed
from pagedkube.engine.distributed.executor import WorkerArgs
from pagedkube.engine.distributed.group import TPGroup
from pagedkube.engine.distributed.rendezvous import Rendezvous, WorkerReady, WorkerStartFailed
from pagedkube.parent_death import die_with_parent

log = logging.getLogger(__name__)
# How long a loaded worker waits for rank 0 to load its own shard and agree the pool size: rank 0
# may read a large model from a slow volume; its death ends the wait at once (the store closes).
AGREE_TIMEOUT_S = 3600.0


class WorkerLink:
    """A worker's side of the start-up handshake; the ModelRunner's `tp` on ranks > 0."""

    def __init__(self, args: WorkerArgs):
        self.rank, self.world_size = args.rank, args.config.world_size
        self.timeout_s = args.config.distributed_timeout
        try:
            self.store = dist.TCPStore(args.store_host, args.store_port, None, False, timedelta(seconds=self.timeout_s))
        except RuntimeError as e:
            raise WorkerFailed(f"tensor-parallel rank {self.rank} cannot reach the store at "
                               f"{args.store_host}:{args.store_port}: {e}") from e
        self.rendezvous = Rendezvous(self.store)
        self.group: TPGroup | None = None

    def agree(self, num_kv_blocks: int, device: torch.device) -> tuple[int, TPGroup]:
        self.rendezvous.post_ready(self.rank, WorkerReady(num_kv_blocks))
        agreed = self.rendezvous.wait_agreed(AGREE_TIMEOUT_S)
        self.group = TPGroup(self.store, self.rank, self.world_size, self.timeout_s, device)
        return agreed, self.group

    def fail(self, exc: BaseException) -> None:
        """Tells rank 0 why this rank cannot start (so its error names the cause, not a timeout)."""
        try:
            self.rendezvous.post_ready(self.rank, WorkerStartFailed(f"{type(exc).__name__}: {exc}"))
        except (RuntimeError, OSError):
            pass                                     # rank 0 is gone already


def run_worker(args: WorkerArgs) -> None:
    """The worker process's entry point (multiprocessing "spawn" target)."""
    die_with_parent(signal.SIGKILL, args.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=args.log_level,
                        format=f"%(asctime)s %(levelname)s %(name)s [rank {args.rank}]: %(message)s")
    torch.set_num_threads(args.num_threads)
    from pagedkube.engine.model_runner import ModelRunner

    try:
        link = WorkerLink(args)
    except WorkerFailed as exc:
        log.error("%s: exiting", exc)
        sys.exit(1)
    try:
        runner = ModelRunner(args.config, tp=link)
    except BaseException as exc:
        log.exception("loading tensor-parallel rank %d failed", args.rank)
        link.fail(exc)
        sys.exit(1)
    assert link.group is not None     # ModelRunner agreed the pool size, which builds the group
    try:
        while (step := link.group.broadcast_object()) is not None:
            runner.execute_shard(step)
    except WorkerFailed as exc:
        log.error("%s: exiting", exc)
        sys.exit(1)
