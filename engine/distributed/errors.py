"""WorkerFailed: a tensor-parallel rank died or hung. Torch-free, so the engine core can catch it.

A step of a tensor-parallel engine needs every rank: a partial all-reduce is no answer. So a
rank's death (its process exited, a collective failed) or hang (a collective waited longer than
EngineConfig.distributed_timeout) is fatal to the whole engine, unlike a bad step of one request:
the engine core fails every request in flight with an error and exits non-zero, and its
supervisor (kubelet, `pagedkube up`) starts the group again.
"""
from __future__ import annotations


class WorkerFailed(RuntimeError):
    """A tensor-parallel rank is gone; the engine cannot step any more."""
