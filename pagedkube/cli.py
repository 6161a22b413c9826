"""The `pagedkube` command line.

Each part registers its own subcommands from a torch-free module, so
`pagedkube --help` (and the gateway and operator images) work without torch;
the heavy imports happen only inside the chosen subcommand.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

from pagedkube import __version__

# module -> it defines register(subparsers) adding its subcommands, each of
# which sets `func(args) -> int` with parser.set_defaults(func=...).
SUBCOMMAND_MODULES = (
    "pagedkube.engine.cli",
    "pagedkube.gateway.cli",
    "pagedkube.gateway.local.cli",
    "pagedkube.operator.cli",
)

# Subcommands that start work before their flags are parsed: module.early_start(argv)
EARLY_STARTS = {"serve": "pagedkube.engine.server.core_launch"}


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """--help shows every option's default: appended where its help does not already say it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (not action.option_strings or action.default is None or action.default is False
                or action.default == argparse.SUPPRESS or "default" in text.lower()):
            return action.help
        return f"{text} (default: %(default)s)".lstrip()


class SubcommandParser(argparse.ArgumentParser):
    """Every subcommand's parser: defaults in --help, and no abbreviated flags (a mistyped
    `--max-num-seq` is an error, not silently --max-num-seqs)."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pagedkube",
        description="Serve open LLMs with a paged-KV engine, a cache-aware gateway and a Kubernetes operator.",
    )
    parser.add_argument("--version", action="version", version=f"pagedkube {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=SubcommandParser)
    for module_name in SUBCOMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    for sub in subparsers.choices.values():
        for action in sub._actions:   # argparse shows nothing for an option without help: say its default
            if action.help is None and action.option_strings and action.default is not None \
                    and action.default is not False:
                action.help = "(default: %(default)s)"
    return parser


def _subcommand(parser: argparse.ArgumentParser, name: str | None) -> argparse.ArgumentParser:
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            return action.choices[name]
    return parser


def start_early(argv: list[str]) -> Any:
    """What a subcommand starts before the parsers are built (EARLY_STARTS): `pagedkube serve`'s
    engine core process, whose imports then overlap this process's start. An object with
    cancel(), or None."""
    module = EARLY_STARTS.get(argv[0]) if argv else None
    return importlib.import_module(module).early_start(argv) if module else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    launch = start_early(argv)
    try:
        parser = build_parser()
        args, unknown = parser.parse_known_args(argv)
        args.core_launch = launch
        if unknown:   # the subcommand's own usage, not the top level's: it is the one that was mistyped
            _subcommand(parser, getattr(args, "command", None)).error(f"unrecognized arguments: {' '.join(unknown)}")
        if getattr(args, "func", None) is None:
            parser.print_help()
            return 2
        return int(args.func(args) or 0)
    finally:
        if launch is not None:
            launch.cancel()     # a no-op once `serve` gave it its engine


if __name__ == "__main__":
    sys.exit(main())
