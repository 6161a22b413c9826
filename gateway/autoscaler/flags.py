"""Autoscaler flags, shared by `pagedkube gateway` and `pagedkube up` (torch-free)."""
from __future__ import annotations

import argparse

from pagedkube.gateway.autoscaler import policy


def add_autoscale_args(p: argparse.ArgumentParser, *, kube: bool = True) -> None:
    g = p.add_argument_group("autoscaling (queue depth)")
    g.add_argument("--autoscale", action="store_true",
                   help="scale the engines on their mean queue depth (docs/autoscaling.md)")
    if kube:
        g.add_argument("--llmservice", metavar="NAME",
                       help="with --kube-service: the LLMService this gateway fronts; it writes its scale "
                            "subresource (with --autoscale) and its status.adapters (docs/operator.md)")
    g.add_argument("--min-replicas", type=int, default=policy.DEFAULT_MIN_REPLICAS,
                   help=f"fewest engines; 0 allows scale to zero (default {policy.DEFAULT_MIN_REPLICAS})")
    g.add_argument("--max-replicas", type=int, default=policy.DEFAULT_MAX_REPLICAS,
                   help=f"most engines (default {policy.DEFAULT_MAX_REPLICAS})")
    g.add_argument("--target-queue-depth", type=float, default=policy.DEFAULT_TARGET_QUEUE_DEPTH,
                   help=f"target waiting requests per ready engine (default {policy.DEFAULT_TARGET_QUEUE_DEPTH:g})")
    g.add_argument("--scale-up-window", type=float, default=policy.DEFAULT_SCALE_UP_WINDOW_S,
                   help=f"seconds of scale-up stabilization (default {policy.DEFAULT_SCALE_UP_WINDOW_S:g}, as HPA)")
    g.add_argument("--scale-down-window", type=float, default=policy.DEFAULT_SCALE_DOWN_WINDOW_S,
                   help=f"seconds of scale-down stabilization (default {policy.DEFAULT_SCALE_DOWN_WINDOW_S:g}, as HPA)")
    g.add_argument("--autoscale-interval", type=float, default=policy.DEFAULT_INTERVAL_S,
                   help=f"seconds between autoscaler decisions (default {policy.DEFAULT_INTERVAL_S:g})")
    g.add_argument("--max-held", type=int, default=policy.DEFAULT_MAX_HELD,
                   help=f"requests held at most while no engine is ready; more get 503 (default {policy.DEFAULT_MAX_HELD})")
    if kube:   # `pagedkube up` knows its engines' --max-num-seqs
        g.add_argument("--engine-capacity", type=int, default=policy.DEFAULT_ENGINE_CAPACITY, metavar="N",
                       help="requests one engine runs at once: its --max-num-seqs "
                            f"(default {policy.DEFAULT_ENGINE_CAPACITY}, the engine's)")
    g.add_argument("--scale-in-grace", type=float, default=None, metavar="SECONDS",
                   help="how long a drained engine may take to finish its requests before it is removed "
                        f"(default: {policy.GRACE_FACTOR:g} x max_model_len / the slowest measured decode rate)")
    g.add_argument("--scale-signal", choices=policy.SIGNALS, default="in-flight",
                   help="in-flight (default): running + waiting against the engines' capacity; "
                        "waiting: the engines' waiting queues only, the old signal (for comparisons)")


def autoscaler_config_from_args(args: argparse.Namespace) -> policy.AutoscalerConfig | None:
    """None without --autoscale; ValueError on bad values."""
    if not getattr(args, "autoscale", False):
        return None
    return policy.AutoscalerConfig(
        min_replicas=args.min_replicas, max_replicas=args.max_replicas,
        target_queue_depth=args.target_queue_depth, scale_up_window=args.scale_up_window,
        scale_down_window=args.scale_down_window, interval=args.autoscale_interval,
        llmservice=getattr(args, "llmservice", None), max_held=args.max_held,
        engine_capacity=getattr(args, "engine_capacity", None) or getattr(args, "max_num_seqs", None)
        or policy.DEFAULT_ENGINE_CAPACITY,
        signal=args.scale_signal, scale_in_grace=args.scale_in_grace)


def hold_timeout_from_args(args: argparse.Namespace) -> float:
    """--hold-timeout when given; else hold for scale from zero with --autoscale, else 0 (503 at once)."""
    if args.hold_timeout is not None:
        return args.hold_timeout
    return policy.DEFAULT_HOLD_TIMEOUT_S if getattr(args, "autoscale", False) else 0.0
