"""Subcommands of the gateway part (torch-free at import)."""


def register(subparsers) -> None:
    """Adds this part's subcommands (none yet)."""
