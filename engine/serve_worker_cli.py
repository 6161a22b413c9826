"""`pagedkube serve-worker`: a worker node of a multi-node engine (engine/distributed/node.py).

Torch-free at import (`pagedkube --help` must work in the torch-free images). The flags are
torchrun's names for the same things; on a LeaderWorkerSet the operator passes
`--master-addr $(LWS_LEADER_ADDRESS) --node-rank $(LWS_WORKER_INDEX)`.
"""
from __future__ import annotations

import argparse
import logging
from typing import Any

from pagedkube.engine.config import DEFAULT_DISTRIBUTED_TIMEOUT_S, DEFAULT_MASTER_PORT


def add_serve_worker_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "serve-worker", help="join a multi-node engine (`serve --nnodes K`) as one of its worker nodes",
        description="Run the tensor-parallel ranks of one worker node of an engine whose leader runs "
                    "`pagedkube serve --nnodes K`; the model and engine settings are read from the leader.")
    p.add_argument("--master-addr", required=True, help="the leader's host name or address")
    p.add_argument("--master-port", type=int, default=DEFAULT_MASTER_PORT,
                   help="the leader's --master-port")
    p.add_argument("--node-rank", type=int, required=True,
                   help="this node's index, 1..K-1 (LeaderWorkerSet's LWS_WORKER_INDEX)")
    p.add_argument("--join-timeout", type=float, default=DEFAULT_DISTRIBUTED_TIMEOUT_S,
                   help="seconds to wait for the leader's store and its config")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.set_defaults(func=run_serve_worker)
    return p


def run_serve_worker(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from pagedkube.engine.distributed.errors import WorkerFailed
    from pagedkube.engine.distributed.node import run_node

    try:
        return run_node(args.master_addr, args.master_port, args.node_rank, args.join_timeout)
    except (ValueError, WorkerFailed) as exc:
        print(f"pagedkube serve-worker: error: {exc}", flush=True)
        return 1
