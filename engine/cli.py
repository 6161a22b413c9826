"""Subcommands of the engine part: `generate`, `serve`, `serve-worker` and `download` (torch-free at import)."""


def register(subparsers) -> None:
    """Adds this part's subcommands."""
    from pagedkube.engine.generate_cli import add_generate_parser
    add_generate_parser(subparsers)
    from pagedkube.engine.server.serve_cli import add_serve_parser
    add_serve_parser(subparsers)
    from pagedkube.engine.serve_worker_cli import add_serve_worker_parser
    add_serve_worker_parser(subparsers)
    from pagedkube.engine.download_cli import add_download_parser
    add_download_parser(subparsers)
