"""kopf handlers: thin routes from kopf's callbacks to the Reconciler.

    LLMService created / changed / operator restarted -> apply children, write status
    every `resync_interval_s`, every LLMService        -> the same (a safety net)
    a child edited or deleted                          -> re-apply that child
    the engine Deployment or an engine pod changed     -> recompute the owner's status

Children carry ownerReferences, so deleting an LLMService lets the garbage
collector remove them; the operator never re-creates a child of an owner that
is being deleted. Handlers go into a registry the caller makes (no global one).
"""
from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from typing import Any

import kopf

from pagedkube.operator import naming

LLMSERVICES = (naming.GROUP, naming.VERSION, naming.PLURAL)
# Children the operator watches for drift (ServiceMonitors rely on the resync timer).
CHILD_RESOURCES = (  # (group, version, plural, kind)
    ("apps", "v1", "deployments", "Deployment"),
    ("", "v1", "services", "Service"),
    ("", "v1", "configmaps", "ConfigMap"),
    ("", "v1", "serviceaccounts", "ServiceAccount"),
    ("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    ("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    ("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget"),
    ("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy"),
)
# The generated engine Secret is not watched (that would need list/watch on every Secret in the
# cluster): a deleted one is made anew by the next reconcile or resync, and its new digest rolls
# the engine and gateway pods onto the new key together (builders/security.py).
MANAGED = {"app.kubernetes.io/managed-by": naming.MANAGED_BY}
DEFAULT_RESYNC_INTERVAL_S = 300.0


def _owner(body: kopf.Body, namespace: str | None, memo: Any) -> dict[str, Any] | None:
    """The LLMService that controls this child, or None (gone, or not really ours)."""
    owner_name = body.metadata.labels.get(naming.OWNER_LABEL)
    if not owner_name or namespace is None:   # every child is namespaced
        return None
    owner = memo.reconciler.kube.get(naming.API_VERSION, naming.KIND, namespace, owner_name)
    if owner is None:
        return None
    uids = {ref.get("uid") for ref in body.metadata.get("ownerReferences") or []}
    return owner if owner["metadata"].get("uid") in uids else None


async def _resync_forever(reconciler: Any, interval_s: float, namespaces: list[str],
                          logger: logging.Logger | logging.LoggerAdapter[Any]) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            count = await asyncio.to_thread(reconciler.resync_all, namespaces)
            logger.debug("resync: %d LLMServices checked", count)
        except Exception:  # a failed round must not end the loop; the next one retries
            logger.exception("resync failed")


def register_handlers(registry: kopf.OperatorRegistry, *, namespaces: list[str] | tuple[str, ...] = (),
                      resync_interval_s: float = DEFAULT_RESYNC_INTERVAL_S) -> None:
    """namespaces: kopf's patterns ([] = all), for the resync's scope."""

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        # Our own annotations, not kopf.zalando.org, and only real news as Events
        # (ours come from Reconciler.emit), not one per handler run.
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=naming.GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=naming.GROUP)
        settings.persistence.finalizer = f"{naming.GROUP}/operator"
        settings.posting.level = logging.WARNING

    @kopf.on.resume(*LLMSERVICES, registry=registry)
    @kopf.on.create(*LLMSERVICES, registry=registry)
    @kopf.on.update(*LLMSERVICES, registry=registry)
    def reconcile(body: kopf.Body, patch: kopf.Patch, memo: Any, **_: Any) -> None:
        patch["status"] = memo.reconciler.reconcile(_raw(body))

    # The resync is a plain background task, not a kopf timer: kopf puts a finalizer on every
    # object with a timer, and then deleting an LLMService hangs whenever the operator is down.
    @kopf.on.startup(registry=registry)
    async def start_resync(memo: Any, logger: logging.Logger | logging.LoggerAdapter[Any], **_: Any) -> None:
        memo.resync_task = asyncio.create_task(
            _resync_forever(memo.reconciler, resync_interval_s, list(namespaces), logger), name="resync")

    @kopf.on.cleanup(registry=registry)
    async def stop_resync(memo: Any, **_: Any) -> None:
        task = getattr(memo, "resync_task", None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    for group, version, plural, kind in CHILD_RESOURCES:
        api_version = f"{group}/{version}" if group else version

        # type: ignore: kopf's WatchingFn gives `param` a default; this handler is always registered with one
        @kopf.on.event(group, version, plural, labels=MANAGED, registry=registry, id=f"child-{plural}",  # type: ignore[arg-type]
                       param=(api_version, kind))
        def child_changed(body: kopf.Body, type: str, namespace: str | None,  # noqa: A002  (kopf passes `type`)
                          param: tuple[str, str], memo: Any, **_: Any) -> None:
            owner = _owner(body, namespace, memo)
            if owner is None:
                return
            live = {**_raw(body), "apiVersion": param[0], "kind": param[1]}
            memo.reconciler.sync_child(owner, live, deleted=type == "DELETED")
            if param[1] == "Deployment" and body.metadata.labels.get("app.kubernetes.io/component") == "engine":
                memo.reconciler.refresh_status(owner)

    # a multi-node engine's worker pods (engine_lws.py) count for its problems as much as its leaders
    @kopf.on.event("", "v1", "pods", labels={**MANAGED, "app.kubernetes.io/component": "engine"},
                   registry=registry)
    @kopf.on.event("", "v1", "pods", labels={**MANAGED, "app.kubernetes.io/component": naming.ENGINE_WORKER},
                   registry=registry, id="engine_worker_pod_changed")
    def engine_pod_changed(body: kopf.Body, namespace: str | None, memo: Any, **_: Any) -> None:
        owner_name = body.metadata.labels.get(naming.OWNER_LABEL)
        if not owner_name or namespace is None:
            return
        owner = memo.reconciler.kube.get(naming.API_VERSION, naming.KIND, namespace, owner_name)
        if owner is not None and not owner["metadata"].get("deletionTimestamp"):
            memo.reconciler.refresh_status(owner)


def _raw(body: kopf.Body) -> dict[str, Any]:
    """A plain dict copy (builders and drift checks work on plain JSON)."""
    return copy.deepcopy({key: body[key] for key in body})
