"""Subcommands of the gateway part: `pagedkube gateway` (torch-free at import)."""
from __future__ import annotations

import argparse
import logging
import os

from pagedkube.gateway.autoscaler.flags import add_autoscale_args, autoscaler_config_from_args, hold_timeout_from_args
from pagedkube.defaults import default_of
from pagedkube.gateway.autoscaler.policy import DEFAULT_HOLD_TIMEOUT_S
from pagedkube.gateway.config import GatewayConfig
from pagedkube.gateway.routing.types import ROUTING_POLICIES
from pagedkube.http_head_limits import add_head_limit_args, head_limits_from_args, limited_http_protocol
from pagedkube.observability import add_observability_args, observability_from_args


def _affinity_depth(value: str) -> int | None:
    if value == "head":
        return None
    try:
        depth = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'head' or an integer >= 0, got {value!r}") from None
    if depth < 0:
        raise argparse.ArgumentTypeError(f"expected 'head' or an integer >= 0, got {value!r}")
    return depth


def _default(name: str):
    """GatewayConfig's default for a field: the flags' defaults are the config's."""
    return default_of(GatewayConfig, name)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "gateway", help="cache-aware OpenAI-compatible gateway in front of engine servers",
        description="OpenAI-compatible proxy that routes each request to the engine most likely to hold "
                    "its prompt's KV blocks (prefix affinity, then consistent hashing with bounded loads).")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--endpoints", help="comma-separated engine URLs, e.g. http://127.0.0.1:8000,http://127.0.0.1:8001")
    src.add_argument("--kube-service", metavar="NAME", help="watch the EndpointSlices of this engine Service")
    p.add_argument("--namespace", default=_default("namespace"), help=f"namespace of --kube-service (default: {_default('namespace')})")
    p.add_argument("--host", default=_default("host"))
    p.add_argument("--port", type=int, default=_default("port"))
    p.add_argument("--log-level", default="info")
    r = p.add_argument_group("routing")
    r.add_argument("--routing", choices=ROUTING_POLICIES, default=_default("routing"))
    r.add_argument("--load-bound", type=float, default=_default("load_bound"),
                   help="c in consistent hashing with bounded loads: no engine above c x mean load "
                        f"(default {_default('load_bound'):g})")
    r.add_argument("--route-headers", action="store_true",
                   help="add x-pagedkube-endpoint and x-pagedkube-route (the engine and the routing reason) to "
                        "responses; off by default, as they show internal addresses to every client")
    a = p.add_argument_group("access and limits")
    a.add_argument("--api-keys", metavar="FILE", help="YAML file of API keys (docs/gateway.md)")
    a.add_argument("--engine-api-key", metavar="KEY", default=os.environ.get("PAGEDKUBE_ENGINE_API_KEY"),
                   help="bearer token of engines started with --api-key: sent on the cache feed, probes and "
                        "every forwarded request (default: $PAGEDKUBE_ENGINE_API_KEY)")
    a.add_argument("--max-body-bytes", type=int, default=_default("max_body_bytes"),
                   help=f"larger request bodies get 413 (default {_default('max_body_bytes') >> 20} MiB)")
    a.add_argument("--body-read-timeout", type=float, default=_default("body_read_timeout"), metavar="SECONDS",
                   help="a client that sent its headers but not its whole body within this gets 408 "
                        f"(default {_default('body_read_timeout'):g})")
    a.add_argument("--hold-timeout", type=float, default=None,
                   help="seconds to hold a request while no engine is ready "
                        f"(default 0: 503 at once; with --autoscale {DEFAULT_HOLD_TIMEOUT_S:g}, for scale from zero)")
    t = p.add_argument_group(
        "tuning", "measured defaults that deployments leave alone: for benchmarks and experiments (docs/gateway.md \"Tuning knobs\")")
    t.add_argument("--load-floor", type=int, default=_default("load_floor"), metavar="N",
                   help="an engine with fewer than N requests always takes one more, whatever c x mean says "
                        f"(default {_default('load_floor')}; 0: the plain bound)")
    t.add_argument("--affinity-depth", type=_affinity_depth, default=_default("affinity_depth"), metavar="N|head",
                   help="leading blocks an engine must hold to draw a request by affinity: 0 (default) any "
                        "held prefix, N at least min(N, the request's ring-key head), 'head' the whole head")
    t.add_argument("--pending-ttl", type=float, default=_default("pending_ttl"), metavar="SECONDS",
                   help="count the blocks of a prompt this gateway routed as held by its engine until the engine's "
                        f"cache feed reports them, at most this long (default {_default('pending_ttl'):g}; 0: off, "
                        "which one of several gateway replicas needs so that replicas choose alike; docs/gateway.md)")
    t.add_argument("--ring-key-blocks", type=int, default=_default("ring_key_blocks"),
                   help="the ring key is the hash of the first N blocks of the prompt head "
                        f"(default {_default('ring_key_blocks')})")
    t.add_argument("--tokenize-workers", type=int, default=None,
                   help=f"threads that tokenize large prompts off the event loop (default {_default('tokenize_workers')}, "
                        "see docs/gateway.md)")
    t.add_argument("--max-attempts", type=int, default=_default("max_attempts"),
                   help="engines tried per request on connect errors / 5xx")
    t.add_argument("--upstream-timeout", type=float, default=_default("upstream_timeout"), help="seconds to wait for engine bytes")
    t.add_argument("--connect-timeout", type=float, default=_default("connect_timeout"))
    t.add_argument("--eject-after-failures", type=int, default=_default("eject_after_failures"))
    t.add_argument("--eject-seconds", type=float, default=_default("eject_seconds"))
    t.add_argument("--feed-interval", type=float, default=_default("feed_interval"),
                   help="least seconds between two cache feed requests to one engine")
    t.add_argument("--feed-wait", type=float, default=_default("feed_wait"),
                   help="cache feed long-poll: seconds an engine may hold a request until it has news "
                        "(0: plain polls every --feed-interval)")
    t.add_argument("--scrape-interval", type=float, default=_default("scrape_interval"),
                   help="seconds between /metrics and /ready polls")
    add_autoscale_args(p)
    add_head_limit_args(p)
    add_observability_args(p)
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    return GatewayConfig(
        endpoints=[u for u in (args.endpoints or "").split(",") if u.strip()],
        kube_service=args.kube_service, namespace=args.namespace, host=args.host, port=args.port,
        routing=args.routing, load_bound=args.load_bound, load_floor=args.load_floor,
        affinity_depth=args.affinity_depth, pending_ttl=args.pending_ttl, api_keys_file=args.api_keys,
        engine_api_key=args.engine_api_key,
        max_body_bytes=args.max_body_bytes, body_read_timeout=args.body_read_timeout,
        head_limits=head_limits_from_args(args), route_headers=args.route_headers, max_attempts=args.max_attempts,
        upstream_timeout=args.upstream_timeout, connect_timeout=args.connect_timeout,
        eject_after_failures=args.eject_after_failures, eject_seconds=args.eject_seconds,
        feed_interval=args.feed_interval, feed_wait=args.feed_wait, scrape_interval=args.scrape_interval,
        ring_key_blocks=args.ring_key_blocks, hold_timeout=hold_timeout_from_args(args),
        autoscale=autoscaler_config_from_args(args), llmservice=args.llmservice,
        observability=observability_from_args(args),
        **({"tokenize_workers": args.tokenize_workers} if args.tokenize_workers is not None else {}))


def run(args: argparse.Namespace) -> int:
    import sys

    try:
        import uvicorn

        from pagedkube.gateway.app import create_app
    except ImportError as e:
        print(f"pagedkube gateway needs the gateway extra: pip install 'pagedkube[gateway]' ({e})", file=sys.stderr)
        return 2
    try:
        config = config_from_args(args)
        app = create_app(config)
    except ValueError as e:
        print(f"pagedkube gateway: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from pagedkube.gateway.errors import error_body

    uvicorn.run(app, host=config.host, port=config.port, log_level=args.log_level, access_log=False,
                http=limited_http_protocol(config.head_limits, error_body))
    return 0
