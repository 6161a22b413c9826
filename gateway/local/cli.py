"""`pagedkube up`: the local stack (engines + gateway on this machine). Torch-free at import."""
from __future__ import annotations

import argparse
import sys

from pagedkube.access_log import ACCESS_LOG_FORMATS
from pagedkube.defaults import default_of
from pagedkube.engine.server.engine_flags import add_engine_args, passthrough_argv
from pagedkube.gateway.autoscaler.flags import add_autoscale_args, autoscaler_config_from_args, hold_timeout_from_args
from pagedkube.gateway.autoscaler.policy import DEFAULT_HOLD_TIMEOUT_S
from pagedkube.gateway.local.config import UpConfig
from pagedkube.gateway.routing.types import ROUTING_POLICIES

ENGINE_GROUP = "engine options (passed to every `pagedkube serve`)"
# `pagedkube up` takes these for every process it starts, the gateway and the engines
# (docs/observability.md), so they are passed through as well.
OBSERVABILITY_FLAGS = ("--access-log", "--otlp-traces-endpoint")


def _default(name: str):
    """UpConfig's default for a field: the flags' defaults are the config's."""
    return default_of(UpConfig, name)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "up", help="run engines and the gateway on this machine (the local stack)",
        description="Start engine processes and the cache-aware gateway in front of them; Ctrl-C stops all.")
    p.add_argument("--replicas", type=int, default=_default("replicas"),
                   help=f"engines to start (default {_default('replicas')})")
    p.add_argument("--host", default=_default("host"), help="the gateway's address (engines listen on 127.0.0.1)")
    p.add_argument("--port", type=int, default=_default("port"), help=f"the gateway's port (default {_default('port')})")
    p.add_argument("--routing", choices=ROUTING_POLICIES, default=_default("routing"))
    p.add_argument("--route-headers", action="store_true",
                   help="the gateway adds x-pagedkube-endpoint / x-pagedkube-route to responses (default off)")
    p.add_argument("--hold-timeout", type=float, default=None,
                   help=f"seconds to hold requests while no engine is ready (default 0; {DEFAULT_HOLD_TIMEOUT_S:g} with --autoscale)")
    flags = add_engine_args(p, passthrough=True, title=ENGINE_GROUP)
    obs = p.add_argument_group("observability (docs/observability.md)")
    obs.add_argument("--access-log", choices=ACCESS_LOG_FORMATS, default=None,
                     help="text (default), json or off, for every process")
    obs.add_argument("--otlp-traces-endpoint", metavar="URL", default=None,
                     help="OTLP/HTTP collector for every process's spans")
    add_autoscale_args(p, kube=False)
    p.set_defaults(func=run, engine_flags=[*flags, *OBSERVABILITY_FLAGS])


def engine_args(args: argparse.Namespace) -> list[str]:
    """The engine options the user gave, as `pagedkube serve` arguments for every engine."""
    return passthrough_argv(args, args.engine_flags)


def model_name(args: argparse.Namespace) -> str:
    from pagedkube.model_source import model_name as name_of

    if args.served_model_name:
        return args.served_model_name
    return name_of(args.model)


def check_engine_args(argv: list[str]) -> None:
    """Parses them as `pagedkube serve` would, so a bad value fails now, not in N engines."""
    from pagedkube.engine.server.serve_cli import add_serve_parser

    parser = argparse.ArgumentParser(prog="pagedkube up", add_help=False)
    add_serve_parser(parser.add_subparsers()).prog = "pagedkube up (engine options)"
    parser.parse_args(["serve", *argv])


def run(args: argparse.Namespace) -> int:
    import asyncio

    from pagedkube.access_log import DEFAULT_ACCESS_LOG
    from pagedkube.engine.server.serve_cli import resolve_model
    from pagedkube.gateway.local.supervisor import Supervisor
    from pagedkube.hub_download import log_progress_to_stderr
    from pagedkube.model_source import hub_model_of, with_revision
    from pagedkube.observability import ObservabilityConfig

    argv = engine_args(args)
    check_engine_args(argv)
    log_progress_to_stderr()
    try:
        model = with_revision(args.model, args.revision)
        if hub_model_of(model) is not None:   # fetched once here, not by each engine
            resolve_model(model)
        config = UpConfig(replicas=args.replicas, host=args.host, port=args.port, engine_args=argv,
                          model_name=model_name(args), autoscale=autoscaler_config_from_args(args),
                          hold_timeout=hold_timeout_from_args(args), routing=args.routing,
                          route_headers=args.route_headers,
                          drain_timeout=args.drain_timeout if args.drain_timeout is not None else _default("drain_timeout"),
                          observability=ObservabilityConfig(args.access_log or DEFAULT_ACCESS_LOG,
                                                            args.otlp_traces_endpoint))
    except ValueError as e:
        print(f"pagedkube up: error: {e}", file=sys.stderr)
        return 2
    return asyncio.run(Supervisor(config).run())
