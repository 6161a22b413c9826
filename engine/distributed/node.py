"""A worker node of a multi-node engine: `pagedkube serve-worker` runs this.

With nnodes > 1, an engine's world is tensor_parallel_size x nnodes ranks; node 0 (the leader
pod, `pagedkube serve --nnodes K`) holds rank 0 and hosts the TCPStore, and node k holds ranks
k*tp .. k*tp+tp-1:

    leader pod (node 0)                       worker pod (node k)
    pagedkube serve --nnodes K -tp 2          pagedkube serve-worker --master-addr LEADER --node-rank k
    ranks 0, 1; TCPStore on master_port <---- reads `config` from the store
                                              spawns ranks 2k, 2k+1 (worker.py), which join as rank 1 does

This process only supervises: it reads the leader's EngineConfig (so the two cannot disagree on
the model, dtype or quantization), spawns its node's ranks and waits. Its exit status is theirs:
0 when rank 0 shut the engine down, 1 as soon as one rank fails (a peer died, rank 0 is gone),
after killing the others, so that the pod restarts and LeaderWorkerSet restarts the group.

SIGTERM is noted and otherwise ignored: a group's pods are stopped together (scale-in, a rolling
update), and the leader drains its requests in flight on SIGTERM, which needs every rank until it
is done; it then shuts the engine down and this node exits 0. Were the leader to stay, the
kubelet's SIGKILL after the grace period ends the node all the same.
"""
from __future__ import annotations

import logging
import signal
from datetime import timedelta
from types import FrameType
from multiprocessing.connection import wait

import torch.distributed as dist

from pagedkube.engine.config import DEFAULT_DISTRIBUTED_TIMEOUT_S
from pagedkube.engine.distributed.errors import WorkerFailed
from pagedkube.engine.distributed.executor import exit_reason, spawn_workers, stop_workers
from pagedkube.engine.distributed.rendezvous import Rendezvous

log = logging.getLogger(__name__)


def run_node(master_addr: str, master_port: int, node_rank: int,
             join_timeout: float = DEFAULT_DISTRIBUTED_TIMEOUT_S) -> int:
    """Joins the engine whose rank 0 listens on master_addr:master_port as node `node_rank`;
    returns the exit status. WorkerFailed when the leader cannot be reached within join_timeout,
    ValueError for a node rank the leader's engine does not have."""
    try:
        store = dist.TCPStore(master_addr, master_port, None, False, timedelta(seconds=join_timeout))
    except RuntimeError as e:
        raise WorkerFailed(f"cannot reach the leader's store at {master_addr}:{master_port} "
                           f"within {join_timeout:g}s: {e}") from e
    config = Rendezvous(store).read_config(join_timeout)
    if not 1 <= node_rank < config.nnodes:
        raise ValueError(f"node rank {node_rank} is not a worker node of the leader's engine "
                         f"(nnodes {config.nnodes}: worker nodes are 1..{config.nnodes - 1})")
    tp = config.tensor_parallel_size
    ranks = range(node_rank * tp, (node_rank + 1) * tp)
    log.info("node %d of %d: ranks %d-%d of %s (tensor_parallel_size %d)", node_rank, config.nnodes,
             ranks[0], ranks[-1], config.model, tp)
    procs = spawn_workers(config, ranks, master_addr, master_port)

    def keep_serving(signum: int, frame: FrameType | None) -> None:
        log.info("SIGTERM: the ranks serve on until the leader has drained and shuts the engine down")

    signal.signal(signal.SIGTERM, keep_serving)
    del store                    # each rank has its own connection; this one would only idle
    try:
        running = list(procs)
        while running:
            wait([p.sentinel for p in running])
            for proc in list(running):
                code = proc.exitcode
                if code is None:
                    continue
                running.remove(proc)
                if code != 0:
                    log.error("%s %s: stopping this node's other ranks", proc.name, exit_reason(code))
                    return 1
        return 0
    finally:
        stop_workers(procs)
