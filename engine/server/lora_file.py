"""--lora-modules-file FILE: the adapters listed in a file, followed while the server runs.

The file is one JSON list of vLLM's --lora-modules objects, [{"name": ..., "path": ...}, ...],
each path a PEFT folder or a Hub repo id (lora_routes.load_adapter). The LLMService operator
writes it into a ConfigMap that the kubelet keeps fresh in every engine pod
(operator/builders/adapters.py), so an adapter added to or removed from the spec reaches the
running engines with no restart and no caller holding the engine's key:

    start-up      every listed adapter is loaded; one that fails is logged and left out: a bad
                  adapter costs its own name, never the engine (--lora-modules fails start-up)
    every POLL_S  the file is read again: names it dropped (or whose path changed) are
                  unloaded, with their requests in flight finishing; names it added are loaded;
                  one that failed is tried again after RETRY_S (a Hub that was away)

Only adapters this follower loaded are ever unloaded by it: those of --lora-modules and of
POST /v1/load_lora_adapter are not the file's to take away.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pagedkube.engine.lora.modules import LoRAModule
from pagedkube.engine.server.errors import APIError
from pagedkube.engine.server.lora_routes import load_adapter, unload_adapter

logger = logging.getLogger("pagedkube.lora")

POLL_S = 5.0      # the kubelet refreshes a ConfigMap volume about once a minute; this adds little to that
RETRY_S = 60.0    # a failed adapter is tried again this often while the file still lists it


def read_lora_modules_file(path: Path) -> tuple[LoRAModule, ...]:
    """ValueError (OSError for an unreadable file) when the file is not a list of {name, path}."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"--lora-modules-file {path}: not valid JSON: {e}") from None
    if not isinstance(data, list) or not all(
            isinstance(m, dict) and set(m) <= {"name", "path", "base_model_name"} for m in data):
        raise ValueError(f"--lora-modules-file {path}: expected a JSON list of {{\"name\", \"path\"}} objects")
    modules = tuple(LoRAModule(m.get("name"), m.get("path"), m.get("base_model_name")) for m in data)
    names = [m.name for m in modules]
    if len(set(names)) != len(names):
        raise ValueError(f"--lora-modules-file {path} names an adapter twice: {names}")
    return modules


@dataclass(frozen=True, slots=True)
class Failure:
    path: str
    reason: str
    at: float


@dataclass
class LoRAFileFollower:
    path: Path
    poll_s: float = POLL_S
    retry_s: float = RETRY_S
    clock: Callable[[], float] = time.monotonic
    loaded: dict[str, str] = field(default_factory=dict)     # name -> path, loaded from the file
    failed: dict[str, Failure] = field(default_factory=dict)

    async def sync(self, state: Any) -> None:
        """Serves what the file lists now (ValueError/OSError when it cannot be read: nothing changes)."""
        wanted = {m.name: m for m in read_lora_modules_file(self.path)}
        for name, path in list(self.loaded.items()):
            if name not in wanted or wanted[name].path != path:
                unload_adapter(state, name)
                del self.loaded[name]
                logger.info("LoRA adapter %s unloaded: %s no longer lists it (from %s)", name, self.path, path)
        for name in [n for n in self.failed if n not in wanted]:
            del self.failed[name]
        for name, module in wanted.items():
            if name in self.loaded:
                continue
            failure = self.failed.get(name)
            if failure is not None and failure.path == module.path and self.clock() - failure.at < self.retry_s:
                continue
            try:
                await load_adapter(state, module)
            except APIError as e:
                self.failed[name] = Failure(module.path, e.message, self.clock())
                logger.warning("LoRA adapter %s from %s not loaded: %s", name, module.path, e.message)
                continue
            self.loaded[name] = module.path
            self.failed.pop(name, None)
            logger.info("LoRA adapter %s loaded from %s", name, module.path)

    async def run(self, state: Any) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self.sync(state)
            except (ValueError, OSError) as e:   # a half-written or vanished file: next round
                logger.warning("%s; the adapters stay as they are", e)
