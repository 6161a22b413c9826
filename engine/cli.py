"""Subcommands of the engine part: `generate` and `serve` (torch-free at import)."""


def register(subparsers) -> None:
    """Adds this part's subcommands (none yet)."""
