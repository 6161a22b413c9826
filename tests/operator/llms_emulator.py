"""kmock's Kubernetes emulator, taught the few API-server behaviours the operator relies on.

kmock (by kopf's author) keeps objects in memory and merges every PATCH as a
JSON merge patch. A real cluster also does these, so the test server does too:

* server-side apply (`application/apply-patch+yaml`): creates a missing object,
  and replaces the applier's fields of an existing one (one field manager here,
  so "its fields" are the whole applied object; status and server metadata stay);
* uid, resourceVersion, generation and creationTimestamp in metadata, and
  names from generateName (kopf posts Events that way);
* `labelSelector` on lists (equality selectors, as the operator sends);
* ownerReference garbage collection on delete (kube-controller-manager's job).
"""
from __future__ import annotations

import copy
import datetime
import itertools
import uuid
from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock._internal import enums, rendering

APPLY = "application/apply-patch+yaml"
SERVER_METADATA = ("uid", "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp", "finalizers")


@attrs.define(kw_only=True)
class ClusterEmulator(kmock.KubernetesEmulator):
    _versions: Any = attrs.field(factory=lambda: itertools.count(1), init=False)

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if request.resource is not None and request.action == enums.action.CREATE and request.data:
            self._stamp(request.data, None)
        if request.resource is not None and request.action == enums.action.UPDATE and request.name \
                and not request.subresource and isinstance(request.data, dict):
            self._bump_generation(request, request.data)
        if request.resource is not None and request.method == enums.method.PATCH \
                and request.headers.get("Content-Type", "").startswith(APPLY):
            return await self._apply(request)
        response = await super()._handle(request)
        if request.resource is not None and request.action in (enums.action.DELETE, enums.action.UPDATE):
            await self._collect_garbage()  # an UPDATE that drops the last finalizer deletes too
        return response

    def _stamp(self, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        old_meta = (old or {}).get("metadata", {})
        for key in SERVER_METADATA:
            if key in old_meta:
                meta[key] = old_meta[key]
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        meta.setdefault("generation", 1)
        if old is not None and obj.get("spec") != old.get("spec"):
            meta["generation"] = int(old_meta.get("generation", 1)) + 1
        meta["resourceVersion"] = str(next(self._versions))

    def _bump_generation(self, request: rendering.Request, patch: dict[str, Any]) -> None:
        key = (request.resource, request.namespace, request.name)
        if key in self.objects and not self.objects[key].deleted:
            meta = patch.setdefault("metadata", {})
            old_meta = self.objects[key].get("metadata", {})
            if "spec" in patch:
                meta["generation"] = int(old_meta.get("generation", 1)) + 1
            meta["resourceVersion"] = str(next(self._versions))

    async def _apply(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        key = (request.resource, request.namespace, request.name)
        obj = copy.deepcopy(request.data)
        async with self._lock:
            exists = key in self.objects and not self.objects[key].deleted
            old = self.objects[key].raw if exists else None
            self._stamp(obj, old)
            if old is not None and "status" in old:
                obj["status"] = old["status"]
            if exists:
                self.objects[key].history.append(obj)
            else:
                self.objects[key] = obj
            await self._buses[request.resource].put({"type": "MODIFIED" if exists else "ADDED", "object": obj})
        await self._collect_garbage()  # an object created with a dead owner goes at once, as in a cluster
        return aiohttp.web.json_response(obj, status=200 if exists else 201)

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        result = await super()._serve_list(request)
        selector = request.params.get("labelSelector")
        if selector:
            wanted = dict(term.split("=", 1) for term in selector.split(","))
            result["items"] = [o for o in result["items"]
                               if wanted.items() <= (o.get("metadata", {}).get("labels") or {}).items()]
        return result

    async def _collect_garbage(self) -> None:
        """Delete every object whose owners are all gone, until nothing changes."""
        while True:
            async with self._lock:
                alive = {o.get("metadata", {}).get("uid") for _, o in self.objects.items() if not o.deleted}
                orphans = [(key, o) for key, o in self.objects.items() if not o.deleted
                           and (refs := o.get("metadata", {}).get("ownerReferences"))
                           and not any(r.get("uid") in alive for r in refs)]
                for key, o in orphans:
                    raw = o.raw
                    o.delete()
                    await self._buses[key[0]].put({"type": "DELETED", "object": raw})
            if not orphans:
                return
