"""When `pagedkube up` restarts an engine: exponential back-off, and the health check
that kills a wedged one (pure; engines.py does the processes).

Kubernetes does the same for a pod (CrashLoopBackOff: 10 s doubling to 5 min, reset
after 10 min running; a liveness probe failing `failureThreshold` times restarts the
container). A local engine starts in seconds, so the numbers are smaller; each says
why below.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    # The first restart waits 1 s: long enough for the dead engine's port and memory to be
    # released, short enough that a one-off crash costs little more than the engine's start.
    initial_backoff_s: float = 1.0
    # Each further failure doubles the wait, up to 30 s: an engine that crashes on start
    # (bad flag, model that does not fit) then loads torch and the model at most twice a
    # minute, instead of eating the CPU the other engines serve from.
    max_backoff_s: float = 30.0
    # Ready this long, twice the cap, and it was no crash loop: the next failure waits
    # initial_backoff_s again.
    reset_after_s: float = 60.0
    # Once an engine is ready, GET /health this often...
    health_period_s: float = 5.0
    # ...allowing this long per answer: /health is a trivial handler, but on a loaded
    # 2-core laptop a busy engine's event loop can take seconds to reach it; a wedged
    # engine never answers.
    health_timeout_s: float = 5.0
    # This many failures in a row kill the engine (kubelet's default failureThreshold),
    # so a wedged engine is replaced within about 15-30 s.
    health_failures: int = 3
    # Until some engine of this run has been ready, a slot whose process exits this many
    # times in a row without getting ready means the run cannot work (a bad model file, a
    # flag the engine refuses, a model that does not fit): `up` stops with exit 1, as
    # `vllm serve` does, instead of restarting for ever. Once anything has served, crashes
    # are faults of a running service and are restarted without limit (as a kubelet does).
    give_up_after: int = 3

    def __post_init__(self) -> None:
        if not 0 < self.initial_backoff_s <= self.max_backoff_s:
            raise ValueError(f"need 0 < initial_backoff_s <= max_backoff_s, got "
                             f"{self.initial_backoff_s} and {self.max_backoff_s}")
        if self.reset_after_s < 0 or self.health_period_s <= 0 or self.health_timeout_s <= 0:
            raise ValueError("reset_after_s must be >= 0, health_period_s and health_timeout_s > 0")
        if self.health_failures < 1 or self.give_up_after < 1:
            raise ValueError(f"health_failures and give_up_after must be >= 1, got "
                             f"{self.health_failures} and {self.give_up_after}")


class Backoff:
    """The waits of one engine slot: 1, 2, 4, ... 30, 30 s; back to 1 s after a long good run."""

    def __init__(self, policy: RestartPolicy):
        self.policy = policy
        self._next = policy.initial_backoff_s

    def delay(self, ready_for_s: float | None) -> float:
        """The wait before the next start; ready_for_s: how long the run that just ended
        was ready (None if it never got ready)."""
        if ready_for_s is not None and ready_for_s >= self.policy.reset_after_s:
            self._next = self.policy.initial_backoff_s
        delay = self._next
        self._next = min(self._next * 2, self.policy.max_backoff_s)
        return delay
