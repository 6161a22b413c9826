"""What the autoscaler scales: one small interface, two implementations.

    KubeScaleTarget (autoscaler/kube.py)   the LLMService scale subresource; pod-deletion-cost
                                           on the engines to remove; one acting gateway (Lease)
    LocalEngines   (local/supervisor.py)   engine processes of `pagedkube up`
"""
from __future__ import annotations

from typing import Mapping, Protocol, Sequence


class ScaleTarget(Protocol):
    # True where a scale-in removes not-ready replicas first rather than the victims named (a
    # ReplicaSet): the autoscaler then waits for a drained engine to be seen not ready.
    removes_not_ready_first: bool

    async def is_leader(self) -> bool:
        """True when this gateway replica may act (always, locally)."""
        ...

    async def get_replicas(self) -> int:
        """The replica count asked for now (engines loading included)."""
        ...

    async def scale(self, replicas: int, victims: Sequence[str], worth: Mapping[str, float]) -> None:
        """Ask for `replicas` engines. On a scale-in, `victims` are the endpoint URLs
        to remove first (least cache worth first) and `worth` holds every ready
        endpoint's recent prefix-cache hits; on a scale-up both may be empty."""
        ...

    async def close(self) -> None:
        ...
