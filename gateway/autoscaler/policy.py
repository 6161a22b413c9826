"""How many engines: in-flight work against the engines' capacity, and HPA's stabilization windows.

The signal (the default, `in-flight`), with S = --engine-capacity (each engine's max_num_seqs)
and T = --target-queue-depth:

    in flight    D = sum over every engine (ready or draining) of its running + waiting
                     requests, + requests the gateway holds (no engine ready yet)
    queue depth    = D - ready x S     the requests beyond what the ready engines run at
                                       once (the gauge; per ready engine it is what T bounds)
    up             = ceil(D / (S + T))          fewest engines keeping queue depth <= T each
    down           = ceil(D / (S x (1 - h)))    fewest engines that still *run* all of D, with
                                                headroom h (= the tolerance, 0.1)
    desired        = up if up > current; down if down < current; else current
    bounded        = clamp(desired, min, max)

Since down >= up, a load between them keeps the count (hysteresis): scale-up waits until
more than T requests per engine would queue, and scale-in never leaves fewer engines than
the requests in flight need to run, so a busy engine with an empty queue does not look idle
(the `waiting` signal's failure: it counted waiting requests only, and removed two of three
engines while twelve long streams ran). The old rule stays selectable (`--scale-signal
waiting`) for comparison (bench/autoscale.py, bench/sim/autoscale.py):

    queue depth  = sum of the ready engines' vllm:num_requests_waiting + held requests
    desired      = ceil(ready * (queue depth / ready) / T)   (HPA: ceil(current * ratio)),
                   unchanged while |ratio - 1| <= tolerance

Stabilization is HPA's `behavior` (kube-controller-manager, replica_calculator +
horizontal.go stabilizeRecommendationWithBehaviors): every raw recommendation is
kept with its time; the result moves up only to the *smallest* recommendation
of the scale-up window and down only to the *largest* of the scale-down window:

    up_floor   = min(recommendations in the last scale_up_window)
    down_ceil  = max(recommendations in the last scale_down_window)
    next       = current, raised to up_floor if below it, lowered to down_ceil if above it

A burst (every recent recommendation high) scales up after the short window; a
lull must last the whole long window before a scale-down, so load that dips
between bursts does not flap.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from pagedkube.defaults import default_of
from pagedkube.engine.config import EngineConfig

# HPA's defaults (kube-controller-manager --horizontal-pod-autoscaler-tolerance,
# behavior.scaleUp/scaleDown.stabilizationWindowSeconds); the operator passes the same.
DEFAULT_TOLERANCE = 0.1
DEFAULT_SCALE_UP_WINDOW_S = 0.0
DEFAULT_SCALE_DOWN_WINDOW_S = 300.0
DEFAULT_TARGET_QUEUE_DEPTH = 4.0   # docs/design.md "Defaults"
DEFAULT_MIN_REPLICAS = 1           # one engine stays warm (0, scale to zero, is opt-in: a cold start costs minutes)
DEFAULT_MAX_REPLICAS = 4           # a small fleet until the user says more (docs/design.md "Defaults")
# HPA syncs every 15 s; queue depth moves faster than CPU, and a scrape is cheap.
DEFAULT_INTERVAL_S = 5.0
# Scale from zero: how long a held request may wait for the first engine. A
# model download plus load takes minutes; Knative's activator holds up to the
# revision timeout (300 s). 120 s covers a local or cached model.
DEFAULT_HOLD_TIMEOUT_S = 120.0
DEFAULT_MAX_HELD = 256              # held requests beyond this get 503 at once
DEFAULT_ENGINE_CAPACITY: int = default_of(EngineConfig, "max_num_seqs")   # the engine's (vLLM's) default
SIGNALS = ("in-flight", "waiting")
# A drained engine is removed once its requests finished, or after this grace. Derived, it is
# GRACE_FACTOR x the time the longest allowed request (max_model_len tokens) takes at the slowest
# measured per-sequence decode rate; before any rate is measured, the fallback: the gateway's
# own default upstream timeout, the longest a request may go quiet.
GRACE_FACTOR = 1.25
FALLBACK_SCALE_IN_GRACE_S = 600.0


@dataclass(frozen=True, slots=True)
class BoundNames:
    """How an entry point names the three bounds in its error messages."""
    min_replicas: str
    max_replicas: str
    target_queue_depth: str


FLAG_NAMES = BoundNames("--min-replicas", "--max-replicas", "--target-queue-depth")
SPEC_NAMES = BoundNames("spec.autoscaling.minReplicas", "spec.autoscaling.maxReplicas",
                        "spec.autoscaling.targetQueueDepth")


def check_bounds(min_replicas: int, max_replicas: int, target_queue_depth: float,
                 names: BoundNames = FLAG_NAMES) -> None:
    """The autoscaling bounds, for every entry point: the gateway's flags (AutoscalerConfig) and
    the LLMService spec (operator/spec.py). ValueError names the field. The CRD states the
    same rules as schema minimums and a CEL rule for the API server; tests/operator/test_crd.py
    checks that the two accept and refuse alike."""
    if min_replicas < 0:
        raise ValueError(f"{names.min_replicas} must be >= 0, got {min_replicas}")
    if max_replicas < 1:
        raise ValueError(f"{names.max_replicas} must be >= 1, got {max_replicas}")
    if min_replicas > max_replicas:
        raise ValueError(f"{names.min_replicas} {min_replicas} exceeds {names.max_replicas} {max_replicas}")
    if not target_queue_depth > 0:
        raise ValueError(f"{names.target_queue_depth} must be > 0, got {target_queue_depth}")


@dataclass(frozen=True, slots=True)
class AutoscaleBounds:
    """The three bounds every entry point holds and checks alike (check_bounds): the
    gateway's AutoscalerConfig and the operator's spec.Autoscaling extend it."""
    min_replicas: int = DEFAULT_MIN_REPLICAS
    max_replicas: int = DEFAULT_MAX_REPLICAS
    target_queue_depth: float = DEFAULT_TARGET_QUEUE_DEPTH


@dataclass(frozen=True, slots=True)
class AutoscalerConfig(AutoscaleBounds):
    scale_up_window: float = DEFAULT_SCALE_UP_WINDOW_S
    scale_down_window: float = DEFAULT_SCALE_DOWN_WINDOW_S
    interval: float = DEFAULT_INTERVAL_S
    tolerance: float = DEFAULT_TOLERANCE
    llmservice: str | None = None      # Kubernetes: the LLMService whose scale subresource we write
    max_held: int = DEFAULT_MAX_HELD
    engine_capacity: int = DEFAULT_ENGINE_CAPACITY   # requests one engine runs at once (its max_num_seqs)
    signal: str = "in-flight"          # or "waiting", the old signal (comparisons only)
    scale_in_grace: float | None = None   # seconds a drained engine may finish in; None: derived (above)

    def __post_init__(self) -> None:
        check_bounds(self.min_replicas, self.max_replicas, self.target_queue_depth)
        if self.scale_up_window < 0 or self.scale_down_window < 0:
            raise ValueError("--scale-up-window and --scale-down-window must be >= 0")
        if not self.interval > 0:
            raise ValueError(f"--autoscale-interval must be > 0, got {self.interval}")
        if not 0 <= self.tolerance < 1:
            raise ValueError(f"tolerance must be in [0, 1), got {self.tolerance}")
        if self.max_held < 0:
            raise ValueError(f"--max-held must be >= 0, got {self.max_held}")
        if self.engine_capacity < 1:
            raise ValueError(f"--engine-capacity must be >= 1, got {self.engine_capacity}")
        if self.signal not in SIGNALS:
            raise ValueError(f"--scale-signal must be one of {', '.join(SIGNALS)}, got {self.signal!r}")
        if self.scale_in_grace is not None and not self.scale_in_grace >= 0:
            raise ValueError(f"--scale-in-grace must be >= 0 seconds, got {self.scale_in_grace}")


def desired_replicas(ready: int, current: int, queue_depth: float, target: float, tolerance: float) -> int:
    """The raw recommendation (before bounds and stabilization).

    `ready` engines serve now, `current` is the replica count asked for so far
    (it may include engines still loading). With no ready engine, any queued
    request asks for one (scale from zero) and an empty queue asks for none.
    """
    if ready < 0 or current < 0 or queue_depth < 0:
        raise ValueError(f"negative input: ready={ready} current={current} queue_depth={queue_depth}")
    if ready == 0:
        return max(current, 1) if queue_depth > 0 else 0
    ratio = (queue_depth / ready) / target
    if abs(ratio - 1.0) <= tolerance:
        return current
    # round() first: 3 * (4/3) must give 4, not 5 from 4.000000000000001.
    return math.ceil(round(ready * ratio, 9))


def desired_for_in_flight(ready: int, current: int, in_flight: float, capacity: int, target: float,
                          headroom: float) -> int:
    """The raw recommendation of the in-flight signal (module docstring), before bounds and
    stabilization. With no ready engine, work in flight asks for one (scale from zero)."""
    if ready < 0 or current < 0 or in_flight < 0:
        raise ValueError(f"negative input: ready={ready} current={current} in_flight={in_flight}")
    if ready == 0:
        return max(current, 1) if in_flight > 0 else 0
    # round() first: 12 / 12 must give 1, not 2 from 1.0000000000000002.
    up = math.ceil(round(in_flight / (capacity + target), 9))
    down = math.ceil(round(in_flight / (capacity * (1.0 - headroom)), 9))
    if up > current:
        return up
    if down < current:
        return down
    return current


def in_flight_queue_depth(in_flight: float, ready: int, capacity: int) -> float:
    """The in-flight signal's queue depth: requests beyond what the ready engines run at once."""
    return max(0.0, in_flight - ready * capacity)


def scale_in_grace(config: AutoscalerConfig, max_model_len: int | None, decode_rate: float | None) -> float:
    """How long a drained engine may take to finish its requests (module constants)."""
    if config.scale_in_grace is not None:
        return config.scale_in_grace
    if max_model_len and decode_rate:
        return GRACE_FACTOR * max_model_len / decode_rate
    return FALLBACK_SCALE_IN_GRACE_S


def bounded(replicas: int, config: AutoscalerConfig) -> int:
    return max(config.min_replicas, min(config.max_replicas, replicas))


class Stabilizer:
    """HPA's stabilization windows over timestamped recommendations."""

    def __init__(self, scale_up_window: float, scale_down_window: float):
        self.scale_up_window = scale_up_window
        self.scale_down_window = scale_down_window
        self._history: deque[tuple[float, int]] = deque()   # (time, recommendation), oldest first

    def recommend(self, recommendation: int, current: int, now: float) -> int:
        self._history.append((now, recommendation))
        horizon = now - max(self.scale_up_window, self.scale_down_window)
        while self._history and self._history[0][0] < horizon:
            self._history.popleft()
        up_floor = down_ceil = recommendation
        for t, r in self._history:
            if t >= now - self.scale_up_window:
                up_floor = min(up_floor, r)
            if t >= now - self.scale_down_window:
                down_ceil = max(down_ceil, r)
        result = current
        if result < up_floor:
            result = up_floor
        if result > down_ceil:
            result = down_ceil
        return result
