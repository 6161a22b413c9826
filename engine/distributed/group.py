"""TPGroup: the collectives one tensor-parallel engine uses, on a process group of its own.

The group is built from a TCPStore that rank 0 hosts (port chosen by the OS, handed to the
workers it spawns), not through torch.distributed.init_process_group: that one is a
process-wide default group, so a second engine in the same process (a test comparing TP=2
with TP=4) could not have its own. Four operations, each counted for bench/tp_step.py:

    all_reduce(x)          sum over ranks, in place: after o_proj and down_proj (row-parallel),
                           and after the vocab-parallel embedding
    gather_to_first(x)     rank 0 receives every rank's x (the lm_head's vocab shards of the
                           logits); the sampler runs on rank 0 only
    broadcast_object(obj)  rank 0's step inputs to every worker, once per step: a size, then
                           the pickled payload (two calls of one message)

gloo on CPU; on CUDA the tensors go through NCCL and the pickled step through a gloo group
beside it (vLLM keeps such a CPU group for metadata as well). A collective that fails (a peer's
socket closed) or times out raises WorkerFailed.
"""
from __future__ import annotations

import pickle
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from pagedkube.engine.distributed.errors import WorkerFailed


@dataclass
class CommStats:
    """Cumulative, per rank: bytes this rank put into each kind of collective, and wall time in all-reduces."""
    num_all_reduces: int = 0
    all_reduce_bytes: int = 0
    all_reduce_seconds: float = 0.0
    gather_bytes: int = 0
    broadcast_bytes: int = 0


def _options(op: Any, **fields: Any) -> Any:
    opts = op()
    for name, value in fields.items():
        setattr(opts, name, value)
    return opts


class TPGroup:
    def __init__(self, store: dist.Store, rank: int, world_size: int, timeout_s: float, device: torch.device):
        self.rank, self.world_size, self.device = rank, world_size, device
        timeout = timedelta(seconds=timeout_s)
        # Any: torch's stubs declare neither group's allreduce/gather/broadcast, which both have
        self.cpu: Any
        self.dev: Any
        try:
            self.cpu = dist.ProcessGroupGloo(dist.PrefixStore("cpu/", store), rank, world_size, timeout)
            if device.type == "cuda":
                opts = dist.ProcessGroupNCCL.Options()
                opts._timeout = timeout
                self.dev = dist.ProcessGroupNCCL(dist.PrefixStore("dev/", store), rank, world_size, opts)
            else:
                self.dev = self.cpu
        except RuntimeError as e:
            raise WorkerFailed(f"tensor-parallel rendezvous failed (rank {rank} of {world_size}): {e}") from e
        self.stats = CommStats()

    def _wait(self, work: Any, what: str) -> None:
        try:
            work.wait()
        except RuntimeError as e:
            detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise WorkerFailed(f"tensor-parallel {what} failed on rank {self.rank}: {detail}") from e

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        self._wait(self.dev.allreduce([x], _options(dist.AllreduceOptions, reduceOp=dist.ReduceOp.SUM)),
                   "all-reduce")
        stats = self.stats
        stats.num_all_reduces += 1
        stats.all_reduce_bytes += x.numel() * x.element_size()
        stats.all_reduce_seconds += time.perf_counter() - start
        return x

    def gather_to_first(self, x: torch.Tensor) -> list[torch.Tensor] | None:
        """Every rank's x (same shape) on rank 0, in rank order; None on the others."""
        x = x.contiguous()
        outputs = [[torch.empty_like(x) for _ in range(self.world_size)]] if self.rank == 0 else []
        self._wait(self.dev.gather(outputs, [x], _options(dist.GatherOptions, rootRank=0)), "gather")
        self.stats.gather_bytes += x.numel() * x.element_size()
        return outputs[0] if self.rank == 0 else None

    def broadcast_object(self, obj: Any = None) -> Any:
        """Rank 0's `obj` on every rank (the others pass nothing)."""
        opts = _options(dist.BroadcastOptions, rootRank=0)
        if self.rank == 0:
            payload = torch.frombuffer(bytearray(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), dtype=torch.uint8)
            size = torch.tensor([payload.numel()], dtype=torch.int64)
        else:
            size = torch.zeros(1, dtype=torch.int64)
        self._wait(self.cpu.broadcast([size], opts), "broadcast")
        if self.rank != 0:
            payload = torch.empty(int(size), dtype=torch.uint8)
        self._wait(self.cpu.broadcast([payload], opts), "broadcast")
        self.stats.broadcast_bytes += payload.numel() + size.numel() * 8
        return obj if self.rank == 0 else pickle.loads(payload.numpy().tobytes())
