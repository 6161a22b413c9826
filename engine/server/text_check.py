"""TextCheckedRoute: the engine's routes answer 400 naming the field for a body whose text
is not Unicode (a lone UTF-16 surrogate, pagedkube/unicode_text.py), before FastAPI and
pydantic see it and before any of it reaches the tokenizer (a 500 there, once).

A route class, not middleware: it runs after the body limits and the API key, and its
answer goes through the app's own error shape. The body is decoded a second time only
when its raw bytes hold a surrogate escape at all."""
from __future__ import annotations

import json
from typing import Any, Callable, Coroutine

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from pagedkube.engine.server.errors import bad_request, error_response
from pagedkube.unicode_text import MESSAGE, field_path, lone_surrogate


class TextCheckedRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def checked(request: Request) -> Response:
            if request.method == "POST":
                raw = await request.body()   # kept by the request: the handler reads it again for free
                try:
                    loc = lone_surrogate(raw, json.loads(raw)) if b"\\u" in raw else None
                except (ValueError, RecursionError):
                    loc = None   # not JSON: the handler answers that
                if loc is not None:
                    path = field_path(loc)
                    return error_response(bad_request(f"{path}: {MESSAGE}", param=path))
            return await handler(request)

        return checked
