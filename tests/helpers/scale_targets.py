"""Test doubles of the autoscaler's ScaleTarget (the local and Kubernetes targets themselves are
tested against real processes and kmock)."""
from __future__ import annotations


class RecordingTarget:
    """A ScaleTarget that only records what it is asked: (replicas, victims) per scale call."""

    removes_not_ready_first = False

    def __init__(self, replicas: int):
        self.replicas = replicas
        self.calls: list[tuple[int, list[str]]] = []

    async def is_leader(self) -> bool:
        return True

    async def get_replicas(self) -> int:
        return self.replicas

    async def scale(self, replicas, victims, worth) -> None:
        self.calls.append((replicas, list(victims)))
        self.replicas = replicas

    async def close(self) -> None:
        pass
