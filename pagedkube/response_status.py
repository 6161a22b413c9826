"""Running an ASGI app and learning how its response ended, for the middlewares that
count every response (engine/server/http_counting.py, gateway/counting.py): the
status it sent (None: it sent no response) and whether it raised, reported once,
however the app ends. Torch-free; only starlette's ASGI types."""
from __future__ import annotations

from typing import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send


async def call_and_report_status(app: ASGIApp, scope: Scope, receive: Receive, send: Send,
                                 report: Callable[[int | None, bool], None]) -> None:
    """Runs app(scope, receive, send); then report(status sent or None, whether it raised),
    also when it raises or is cancelled (the exception goes on after the report)."""
    status: int | None = None

    async def watch(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        await send(message)

    raised = False
    try:
        await app(scope, receive, watch)
    except BaseException:
        raised = True
        raise
    finally:
        report(status, raised)
