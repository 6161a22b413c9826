"""The cache feed the gateway follows (DESIGN.md §5, docs/interfaces.md).

    GET /v1/cache/config              block size, hash algorithm and seed, engine_id
    GET /v1/cache/events?after=SEQ    stored/removed block hashes since SEQ, or a snapshot
    GET /v1/cache/tokenizer           the tokenizer files, so a router tokenizes as we do

Handlers read `state.info.kv_events` directly: with the engine-core process that is
the HTTP process's mirror of the core's KVEventLog (same engine_id and sequence
numbers, fed with every step message); with --engine-in-process it is the engine's
own log (thread-safe, it takes its own lock).
"""
from __future__ import annotations

from fastapi import APIRouter, Query, Request

from pagedkube import hashing
from pagedkube.engine.server.errors import APIError
from pagedkube.engine.server.state import ServerState

router = APIRouter()


def _state(request: Request) -> ServerState:
    state: ServerState = request.app.state.server
    if state.info is None:
        raise APIError(503, "the engine is not ready", headers={"Retry-After": "1"})
    return state


@router.get("/v1/cache/config")
async def cache_config(request: Request) -> dict:
    state = _state(request)
    return {**hashing.cache_config(state.info.block_size, state.info.hash_seed), "engine_id": state.engine_id}


@router.get("/v1/cache/events")
async def cache_events(request: Request, after: int = Query(0, ge=-(2 ** 63), le=2 ** 63 - 1)) -> dict:
    state = _state(request)
    return state.info.kv_events.events_after(after)


@router.get("/v1/cache/tokenizer")
async def cache_tokenizer(request: Request) -> dict:
    state = _state(request)
    return {"files": dict(state.info.tokenizer.files)}
