"""LoRA adapters on the server, as vLLM serves them (docs/server.md "LoRA adapters").

    --enable-lora --lora-modules NAME=PATH ...   adapters served from start-up
    request {"model": NAME}                      runs under adapter NAME (404 for an unknown name)
    GET  /v1/models                              the base model, then each adapter with parent = the base
    POST /v1/load_lora_adapter   {"lora_name", "lora_path"}     with --allow-runtime-lora-updating
    POST /v1/unload_lora_adapter {"lora_name"}                  (off by default: a file path is privileged)

`LoRARegistry` is the one map from names to LoRARequests; it lives in the HTTP process,
so an unload takes effect for the next request at once: after the unload returns, a
request for the adapter is a 404, while the requests already handed to the engine carry
their LoRARequest and finish.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from pagedkube.echo import echo
from pagedkube.engine.lora.modules import LoRAModule, check_lora_name
from pagedkube.engine.lora.request import LoRARequest
from pagedkube.engine.server.errors import APIError
from pagedkube.hub_download import resolve_adapter_path
from pagedkube.openai_errors import MODEL_NOT_FOUND

router = APIRouter()


@dataclass
class LoRARegistry:
    adapters: dict[str, LoRARequest] = field(default_factory=dict)   # name -> request, in load order
    # every name's path since start: an adapter's blocks are cached under its name (pagedkube/hashing.py),
    # so a name never comes back with other weights while blocks of the old ones may be in the pool
    paths: dict[str, str] = field(default_factory=dict)
    _num_loaded: int = 0      # lora_int_id source: never reused, so a reloaded name gets fresh slots

    def get(self, name: str | None) -> LoRARequest | None:
        return None if name is None else self.adapters.get(name)

    def new_request(self, module: LoRAModule, local_path: str) -> LoRARequest:
        self._num_loaded += 1
        return LoRARequest(module.name, self._num_loaded, local_path, module.base_model_name)


def _state(request: Request):
    return request.app.state.server


async def load_adapter(state, module: LoRAModule) -> LoRARequest:
    """Has the engine read and check `module`, then serves it under its name (APIError if not)."""
    registry: LoRARegistry = state.loras
    if module.name in registry.adapters or module.name == state.model_name:
        raise APIError(400, f"The lora adapter '{echo(module.name)}' has already been loaded.", param="lora_name")
    if registry.paths.get(module.name, module.path) != module.path:
        raise APIError(400, f"The lora adapter name '{echo(module.name)}' was served from "
                       f"{echo(registry.paths[module.name])} before: the prefix cache may hold that adapter's "
                       "blocks under the name, so other weights need a new name.", param="lora_name")
    try:   # a Hub repo id is fetched into the Hub cache, off the event loop
        local_path = await asyncio.to_thread(resolve_adapter_path, module.path)
    except ValueError as e:
        raise APIError(400, f"The lora adapter '{echo(module.name)}' cannot be fetched: {echo(str(e))}",
                       param="lora_path") from None
    lora = registry.new_request(module, local_path)
    await state.engine.load_lora(lora)
    if module.name in registry.adapters:      # a concurrent load of the same name won
        raise APIError(400, f"The lora adapter '{echo(module.name)}' has already been loaded.", param="lora_name")
    registry.adapters[module.name] = lora
    registry.paths[module.name] = module.path
    return lora


def unload_adapter(state, name: str) -> bool:
    """Stops serving adapter `name` at once (requests already in the engine finish); False if unknown."""
    lora = state.loras.adapters.pop(name, None)
    if lora is None:
        return False
    state.engine.unload_lora(lora.lora_int_id)
    return True


def _fields(body: object, names: tuple[str, ...]) -> dict:
    if not isinstance(body, dict):
        raise APIError(400, "the body must be a JSON object")
    return {n: body.get(n) for n in names}


async def _json(request: Request) -> object:
    try:
        return await request.json()
    except ValueError:
        raise APIError(400, "the body is not valid JSON") from None


@router.post("/v1/load_lora_adapter")
async def load_lora_adapter(request: Request) -> PlainTextResponse:
    state = _state(request)
    state.check_accepting()
    got = _fields(await _json(request), ("lora_name", "lora_path"))
    if not got["lora_name"] or not got["lora_path"]:
        raise APIError(400, "Both 'lora_name' and 'lora_path' must be provided.")
    try:
        check_lora_name(got["lora_name"])
        module = LoRAModule(got["lora_name"], got["lora_path"])
    except ValueError as e:
        raise APIError(400, str(e), param="lora_name") from None
    await load_adapter(state, module)
    return PlainTextResponse(f"Success: LoRA adapter '{module.name}' added successfully.")


@router.post("/v1/unload_lora_adapter")
async def unload_lora_adapter(request: Request) -> PlainTextResponse:
    state = _state(request)
    got = _fields(await _json(request), ("lora_name", "lora_int_id"))
    name = got["lora_name"]
    if not name:
        raise APIError(400, "'lora_name' must be provided.")
    if not (isinstance(name, str) and unload_adapter(state, name)):
        raise APIError(404, f"The lora adapter '{echo(str(name))}' cannot be found.", param="lora_name",
                       code=MODEL_NOT_FOUND)
    return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")


def adapter_cards(state) -> list[dict]:
    """/v1/models entries of the adapters (vLLM's: root = the adapter's path as given, a folder or
    a Hub repo id; parent = the base)."""
    return [{"id": name, "object": "model", "created": state.created, "owned_by": "pagedkube",
             "root": state.loras.paths.get(name, lora.lora_path), "parent": lora.base_model_name or state.model_name,
             "max_model_len": state.info.max_model_len}
            for name, lora in state.loras.adapters.items()]


def resolve_model(state, model: str | None) -> LoRARequest | None:
    """The adapter a request's `model` names, None for the base model; APIError 404 otherwise."""
    if model is None or model == state.model_name:
        return None
    lora = state.loras.get(model)
    if lora is None:
        raise APIError(404, f"The model `{echo(model)}` does not exist.", param="model", code=MODEL_NOT_FOUND)
    return lora
