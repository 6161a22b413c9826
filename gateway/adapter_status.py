"""`status.adapters` of the LLMService a gateway fronts: which of its LoRA adapters the engines serve.

The operator cannot see that (it holds no engine key, and the engines' NetworkPolicy admits only
the gateway and the scraper), so the gateway, which reads every engine's /v1/models, writes it.
Every `interval` seconds:

    GET   /apis/pagedkube.io/v1alpha1/namespaces/NS/llmservices/NAME          spec.adapters (the wish)
    PATCH /apis/pagedkube.io/v1alpha1/namespaces/NS/llmservices/NAME/status   merge {"status":{"adapters":[...]}}

the PATCH only when the list differs from the one the object holds. One entry per adapter of the
spec, in its order:

    {"name": "vet-triage", "ready": true, "engines": 2, "message": "served by 2 of 2 ready engines"}

`ready` means every ready engine serves it (they all follow the same adapter list, so anything
less is an adapter still loading or one that failed: the engine logs say which). With no ready
engine nothing is ready. The gateway's Role allows exactly these two calls on its own LLMService
(resourceNames); the operator's own status patches merge other keys and leave this one alone.
Several gateway replicas compute the same list from the same engines; a write only on change keeps
them from fighting.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Mapping

from pagedkube.gateway.autoscaler.kube import MERGE_PATCH, KubeApi
from pagedkube.llmservice import collection_path

log = logging.getLogger("pagedkube.gateway")

DEFAULT_INTERVAL_S = 10.0


def adapter_status(wanted: list[str], served: Mapping[str, set[str]]) -> list[dict[str, Any]]:
    """The status entries for the adapters `wanted` (spec order), given what each ready engine
    (URL -> adapter names from its /v1/models) serves."""
    ready_engines = len(served)
    entries = []
    for name in wanted:
        count = sum(name in names for names in served.values())
        ready = ready_engines > 0 and count == ready_engines
        if ready_engines == 0:
            message = "no ready engine"
        elif count == 0:
            message = f"served by none of {ready_engines} ready engines (loading, or failed: see the engine logs)"
        else:
            message = f"served by {count} of {ready_engines} ready engines"
        entries.append({"name": name, "ready": ready, "engines": count, "message": message})
    return entries


def wanted_adapters(llmservice: Mapping[str, Any]) -> list[str]:
    """The adapter names an LLMService's spec lists (an odd entry is the CRD's and operator's business)."""
    adapters = (llmservice.get("spec") or {}).get("adapters") or []
    return [a["name"] for a in adapters if isinstance(a, Mapping) and isinstance(a.get("name"), str)]


class AdapterStatusReporter:
    """Keeps `status.adapters` of one LLMService in step with what its engines serve.
    `served()`: ready engine URL -> the adapter names its /v1/models lists (EngineWatcher.served_adapters)."""

    def __init__(self, api: KubeApi, namespace: str, llmservice: str, served: Callable[[], Mapping[str, set[str]]],
                 interval: float = DEFAULT_INTERVAL_S):
        self.api = api
        self.path = f"{collection_path(namespace)}/{llmservice}"
        self.served = served
        self.interval = interval
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="adapter status")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await self.report_once()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001  the API server away, RBAC missing: logged, retried next time
                log.warning("status.adapters not written: %s", e)
            await asyncio.sleep(self.interval)

    async def report_once(self) -> bool:
        """One comparison, and the PATCH when the status is stale; True when it wrote."""
        body = await asyncio.to_thread(self.api.ok, "GET", self.path)
        wanted = wanted_adapters(body)
        entries = adapter_status(wanted, self.served()) if wanted else None
        if (body.get("status") or {}).get("adapters") == entries:
            return False
        await asyncio.to_thread(self.api.ok, "PATCH", self.path + "/status",
                                body={"status": {"adapters": entries}}, content_type=MERGE_PATCH)
        return True
