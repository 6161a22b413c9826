"""The `pagedkube` command line.

Each part registers its own subcommands from a torch-free module, so
`pagedkube --help` (and the gateway and operator images) work without torch;
the heavy imports happen only inside the chosen subcommand.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from pagedkube import __version__

# module -> it defines register(subparsers) adding its subcommands, each of
# which sets `func(args) -> int` with parser.set_defaults(func=...).
SUBCOMMAND_MODULES = (
    "pagedkube.engine.cli",
    "pagedkube.gateway.cli",
    "pagedkube.gateway.local.cli",
    "pagedkube.operator.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pagedkube",
        description="Serve open LLMs with a paged-KV engine, a cache-aware gateway and a Kubernetes operator.",
    )
    parser.add_argument("--version", action="version", version=f"pagedkube {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in SUBCOMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
