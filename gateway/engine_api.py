"""The engine endpoints a client reaches through the gateway besides generation: what vLLM's
server offers and the openai client and routers call (`models.retrieve`, /tokenize, ...).

    GET  /v1/models/{id}   the model's card, from the engines' merged /v1/models (404 if none serves it)
    POST /tokenize         \\
    POST /detokenize        } forwarded to a ready engine serving the body's `model`, with the
    GET  /version          /  engine key; the engine's answer (status and JSON) passes through

Every engine of a fleet serves the same model and tokenizer, so any ready one answers alike;
the gateway picks one by the least load it tracks. Each route authenticates as /v1/models does.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from pagedkube.gateway.errors import GatewayError, bad_request, model_not_found, no_endpoint

if TYPE_CHECKING:
    from pagedkube.gateway.app import Gateway

FORWARDED = (("POST", "/tokenize"), ("POST", "/detokenize"), ("GET", "/version"))


def install(app: FastAPI, gateway: Gateway) -> None:
    @app.get("/v1/models/{model:path}")
    async def retrieve_model(model: str, request: Request) -> Response:
        try:
            gateway.authenticate(request, rate_limit=False)
            card = next((m for m in (await gateway.merged_models())["data"] if m.get("id") == model), None)
            if card is None:
                raise model_not_found(model)
        except GatewayError as e:
            return e.response()
        return JSONResponse(card)

    for method, path in FORWARDED:
        app.add_api_route(path, _forwarder(gateway, path), methods=[method], include_in_schema=False)


def _forwarder(gateway: Gateway, path: str):
    async def forward(request: Request) -> Response:
        try:
            gateway.authenticate(request, rate_limit=False)
            body = await request.body() if request.method == "POST" else b""
            model = _model_of(body)
            known = gateway.watcher.known_models() if gateway.watcher else None
            if model is not None and known is not None and model not in known:
                raise model_not_found(model)
            routable = gateway.endpoints.routable()
            if not routable:
                raise no_endpoint()
            loads = gateway.endpoints.loads(routable)
            url = min(routable, key=lambda u: (loads.get(u, 0), u))
            try:
                r = await gateway.control.request(request.method, f"{url}{path}", content=body or None,
                                                  headers={"Content-Type": "application/json"} if body else None)
            except httpx.HTTPError:
                raise no_endpoint() from None
        except GatewayError as e:
            return e.response()
        return Response(r.content, status_code=r.status_code, media_type=r.headers.get("content-type"))
    return forward


def _model_of(body: bytes) -> str | None:
    """The body's `model`, when it is a JSON object naming one (the engine validates the rest)."""
    if not body:
        return None
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise bad_request("request body is not valid JSON") from None
    model = data.get("model") if isinstance(data, dict) else None
    return model if isinstance(model, str) else None
