"""The start-up handshake of a tensor-parallel engine, on the TCPStore rank 0 hosts.

Every rank other than 0 may live in another process tree: spawned by rank 0 in the same pod, or
by a `pagedkube serve-worker` in another pod (engine/distributed/node.py). The store is the one
thing they all reach, so the handshake is a few keys on it, each written once:

    config        rank 0: its EngineConfig (a worker node reads what to load from it)
    ready/<rank>  rank r: WorkerReady(its KV pool's room, in blocks) or WorkerStartFailed(why)
    agreed        rank 0: the pool size every rank allocates, the smallest any rank has room for

torch's TCPStore is the rendezvous torch.distributed itself uses (init_process_group's env://);
it is reachable over TCP from other pods, which the multiprocessing pipes before it were not.
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from pagedkube.engine.config import EngineConfig
from pagedkube.engine.distributed.errors import WorkerFailed


@dataclass(frozen=True)
class WorkerReady:
    num_kv_blocks: int        # blocks the worker's pool has room for


@dataclass(frozen=True)
class WorkerStartFailed:
    message: str


CONFIG_KEY = "config"
AGREED_KEY = "agreed"


def _ready_key(rank: int) -> str:
    return f"ready/{rank}"


class Rendezvous:
    def __init__(self, store: dist.Store):
        self.store = store

    def _get(self, key: str, timeout_s: float, waiting_for: str) -> Any:
        try:
            self.store.wait([key], timedelta(seconds=timeout_s))
            return pickle.loads(self.store.get(key))
        except (RuntimeError, OSError) as e:     # DistStoreError (a RuntimeError): timeout or leader gone
            raise WorkerFailed(f"tensor-parallel start-up: no {waiting_for} from rank 0 within {timeout_s:g}s "
                               f"or rank 0 is gone ({str(e).strip().splitlines()[0] if str(e).strip() else e!r})") from e

    def _set(self, key: str, obj: Any) -> None:
        self.store.set(key, pickle.dumps(obj))   # type: ignore[arg-type]  # the stub says str; bytes are taken

    def post_config(self, config: EngineConfig) -> None:
        self._set(CONFIG_KEY, config)

    def read_config(self, timeout_s: float) -> EngineConfig:
        config = self._get(CONFIG_KEY, timeout_s, "engine config")
        assert isinstance(config, EngineConfig), type(config)
        return config

    def post_ready(self, rank: int, msg: WorkerReady | WorkerStartFailed) -> None:
        self._set(_ready_key(rank), msg)

    def take_ready(self, rank: int) -> WorkerReady | WorkerStartFailed | None:
        """Rank `rank`'s message, or None while it has not posted one (does not block)."""
        if not self.store.check([_ready_key(rank)]):
            return None
        msg = pickle.loads(self.store.get(_ready_key(rank)))
        assert isinstance(msg, (WorkerReady, WorkerStartFailed)), msg
        return msg

    def post_agreed(self, num_kv_blocks: int) -> None:
        self._set(AGREED_KEY, num_kv_blocks)

    def wait_agreed(self, timeout_s: float) -> int:
        return int(self._get(AGREED_KEY, timeout_s, "agreed KV pool size"))
