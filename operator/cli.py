"""`pagedkube operator`: runs the kopf operator (torch-free; kopf imported on use)."""
from __future__ import annotations

import argparse
import logging
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "operator", help="run the Kubernetes operator for LLMService resources",
        description="Turns each LLMService into engine and gateway Deployments, Services, RBAC, "
                    "a PodDisruptionBudget and a ServiceMonitor (docs/operator.md).")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("--namespace", "-n", action="append", default=[], metavar="NS",
                       help="watch this namespace (repeatable; kopf globs like 'team-*' allowed)")
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace (default)")
    p.add_argument("--standalone", action="store_true",
                   help="no kopf peering (run exactly one operator replica)")
    p.add_argument("--liveness", metavar="URL", default=None,
                   help="serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz")
    p.add_argument("--resync-interval", type=float, default=300.0, metavar="S",
                   help="re-apply every LLMService's children this often, as a safety net (default 300)")
    p.add_argument("--allow-gateway-image", action="store_true",
                   help="let LLMServices choose their gateway image (spec.gateway.image); off by default, since "
                        "the gateway runs with a ServiceAccount that may scale engines and read EndpointSlices")
    p.add_argument("--model-cache-host-path", default="", metavar="PATH",
                   help="a node folder every engine pod of a Hub model mounts as its download cache (HF_HOME), "
                        "unless its LLMService names spec.model.cache (default: none, an emptyDir per pod)")
    p.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        import kopf
    except ImportError as e:  # the operator extra is not installed
        raise SystemExit(f"pagedkube operator needs kopf and kubernetes: pip install 'pagedkube[operator]' ({e})") from None
    from pagedkube.operator.handlers import register_handlers
    from pagedkube.operator.kube import Kube, default_api_client
    from pagedkube.operator.reconcile import Reconciler

    if args.resync_interval <= 0:
        raise SystemExit("--resync-interval must be > 0")
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    registry = kopf.OperatorRegistry()
    kopf.on.login(registry=registry)(kopf.login_via_client)
    register_handlers(registry, namespaces=args.namespace, resync_interval_s=args.resync_interval)
    kube = Kube(default_api_client())
    memo = kopf.Memo(reconciler=Reconciler(kube=kube, emit=kube.create_event,
                                           allow_gateway_image=args.allow_gateway_image,
                                           model_cache_host_path=args.model_cache_host_path))
    kopf.run(registry=registry, memo=memo, standalone=args.standalone, liveness_endpoint=args.liveness,
             clusterwide=not args.namespace, namespaces=args.namespace)
    return 0
