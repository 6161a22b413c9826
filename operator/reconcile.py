"""Reconciliation: desired children -> server-side apply, status from what runs.

Handlers (handlers.py) only route kopf's callbacks here. Everything talks to
the cluster through `Kube` and reports through `emit(body, type, reason,
message)` (in production `Kube.create_event`), so tests can drive it against
an emulated API server.
"""
from __future__ import annotations

import datetime
import fnmatch
import secrets
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from pagedkube.operator import naming
from pagedkube.operator.builders import build_children
from pagedkube.operator.builders.monitoring import SERVICEMONITOR_CRD
from pagedkube.operator.builders.rbac import build_gateway_lease
from pagedkube.operator.builders.security import (
    KEYS_VERSION_ANNOTATION, SECRET_VERSION_ANNOTATION, build_engine_secret, build_gateway_keys_secret,
    generates_gateway_key, secret_version)
from pagedkube.operator.drift import needs_apply, with_hash
from pagedkube.operator.kube import Kube
from pagedkube.operator.spec import LLMServiceSpec
from pagedkube.operator.status import Problem, compute_status

Emit = Callable[[Mapping[str, Any], str, str, str], None]   # (body, "Normal"|"Warning", reason, message)
SECRET_BYTES = 32   # 256 random bits each for the engine key and the hash seed (Python's `secrets` advice)


def random_token() -> str:
    return secrets.token_urlsafe(SECRET_BYTES)


def utcnow() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def child_key(obj: Mapping[str, Any]) -> tuple[str, str, str]:
    return obj["apiVersion"], obj["kind"], obj["metadata"]["name"]


@dataclass
class Reconciler:
    kube: Kube
    emit: Emit
    now: Callable[[], str] = utcnow
    token: Callable[[], str] = random_token
    allow_gateway_image: bool = False   # `pagedkube operator --allow-gateway-image`: spec.gateway.image is used
    model_cache_host_path: str = ""     # `pagedkube operator --model-cache-host-path`: the node-local model cache

    def desired(self, body: Mapping[str, Any], svc: LLMServiceSpec | None = None) -> list[dict[str, Any]]:
        """`svc`: the parsed spec of `body` (parsed here when not given; raises ValueError for an
        invalid spec). Creates the engine Secret if it is missing."""
        svc = svc if svc is not None else LLMServiceSpec.from_body(body)
        with_monitor = svc.monitoring_enabled and self.kube.crd_exists(SERVICEMONITOR_CRD)
        engine = self._created_once(body, build_engine_secret(svc, api_key=self.token(), hash_seed=self.token()),
                                    "engine API key and cache hash seed")
        version = secret_version(engine) if engine else self._live_annotation(svc, SECRET_VERSION_ANNOTATION)
        keys = ""
        if generates_gateway_key(svc):   # closed by default: the client key the user reads
            made = self._created_once(body, build_gateway_keys_secret(svc, api_key=self.token()),
                                      "the gateway's API key: read it from key api-key")
            keys = secret_version(made) if made else self._live_annotation(svc, KEYS_VERSION_ANNOTATION)
        self._created_once(body, build_gateway_lease(svc), "the autoscaler's, empty")
        return [with_hash(c) for c in build_children(svc, with_service_monitor=with_monitor,
                                                     secret_version=version, keys_version=keys,
                                                     allow_gateway_image=self.allow_gateway_image,
                                                     model_cache_host_path=self.model_cache_host_path)]

    def _created_once(self, body: Mapping[str, Any], obj: dict[str, Any], what: str) -> dict[str, Any] | None:
        """Creates `obj` if no object of its name exists; the new object, or None when one existed.

        The generated Secrets are made this way, with fresh random values, and never changed
        afterwards (no rotation by reconcile; docs/operator.md). Create-only, never read: the
        operator holds no `get` on Secrets, which would reach every Secret in the cluster."""
        created = self.kube.create(obj)
        if created is not None:
            self.emit(body, "Normal", "Created", f"{obj['kind']} {obj['metadata']['name']} ({what})")
        return created

    def _live_annotation(self, svc: LLMServiceSpec, annotation: str) -> str:
        """The pod-template annotation a Secret's digest went into when it was made: the live
        engine Deployment's, else the gateway's ("" when neither exists: new pods anyway)."""
        for name in (naming.engine_name(svc.name), naming.gateway_name(svc.name)):
            live = self.kube.get("apps/v1", "Deployment", svc.namespace, name)
            value = (((live or {}).get("spec") or {}).get("template") or {}).get("metadata", {}).get(
                "annotations", {}).get(annotation)
            if value:
                return value
        return ""

    def reconcile(self, body: Mapping[str, Any], restoring: bool = False) -> dict[str, Any]:
        """Applies every child that differs from its desired state; returns the new status.

        restoring: differences are drift to put back (the resync), not the user's new spec."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        if not self.owner_is_live(body):
            # A stale event about an LLMService deleted meanwhile (kopf may still hold one):
            # applying now would re-create children for the garbage collector to remove.
            return dict(body.get("status") or {})
        try:
            svc = LLMServiceSpec.from_body(body)
            children = self.desired(body, svc)
        except ValueError as e:  # reported once, through the conditions' change (_announce)
            return self.status(body, None, invalid_spec=str(e))
        if self._lws_missing(svc):   # reported by status(): applying would be a 404
            children = [c for c in children if c["kind"] != naming.LWS_KIND]
        for child in children:
            applied = self._sync(body, child, self.kube.get(*self._where(child, namespace)), restoring=restoring)
            if applied and child["kind"] == "Deployment" and svc.gateway.image and not self.allow_gateway_image \
                    and child["metadata"]["name"] == naming.gateway_name(name):
                self.emit(body, "Warning", "GatewayImageIgnored",
                          f"spec.gateway.image {svc.gateway.image!r} is ignored: the operator runs the gateway "
                          f"from {naming.GATEWAY_IMAGE} unless started with --allow-gateway-image")
        self._delete_other_workload(body, svc)
        if not any(c["kind"] == "NetworkPolicy" for c in children):   # switched off: do not leave it behind
            if self.kube.delete("networking.k8s.io/v1", "NetworkPolicy", namespace, naming.engine_name(name)):
                self.emit(body, "Normal", "Deleted", f"NetworkPolicy {naming.engine_name(name)}")
        monitored = any(c["kind"] == "ServiceMonitor" for c in children)
        if not monitored and self.kube.crd_exists(SERVICEMONITOR_CRD):  # monitoring switched off
            if self.kube.delete("monitoring.coreos.com/v1", "ServiceMonitor", namespace, name):
                self.emit(body, "Normal", "Deleted", f"ServiceMonitor {name}")
        return self.status(body, svc)

    def _lws_missing(self, svc: LLMServiceSpec) -> bool:
        """A multi-node engine asked for where the LeaderWorkerSet API is not installed."""
        return svc.engine.nodes_per_replica > 1 and not self.kube.crd_exists(naming.LWS_CRD)

    def _delete_other_workload(self, body: Mapping[str, Any], svc: LLMServiceSpec) -> None:
        """nodesPerReplica crossed 1: the engine's old owner (Deployment or LeaderWorkerSet) goes."""
        namespace, name = svc.namespace, naming.engine_name(svc.name)
        if svc.engine.nodes_per_replica > 1:
            gone = self.kube.delete("apps/v1", "Deployment", namespace, name)
            what = f"Deployment {name} (the engine is a {naming.LWS_KIND} now)"
        else:
            gone = self.kube.crd_exists(naming.LWS_CRD) and self.kube.delete(
                naming.LWS_API_VERSION, naming.LWS_KIND, namespace, name)
            what = f"{naming.LWS_KIND} {name} (the engine is a Deployment now)"
        if gone:
            self.emit(body, "Normal", "Deleted", what)

    def _engine_workload(self, svc: LLMServiceSpec | None, namespace: str, name: str) -> dict[str, Any] | None:
        """The engine Deployment, or a multi-node engine's LeaderWorkerSet seen as one: its
        replicas, readyReplicas and updatedReplicas count groups (a group is ready when all its
        pods are, LWS's own rule); LWS's status has no observedGeneration, so its generation is
        taken as seen."""
        if svc is None or svc.engine.nodes_per_replica == 1:
            return self.kube.get("apps/v1", "Deployment", namespace, naming.engine_name(name))
        if not self.kube.crd_exists(naming.LWS_CRD):
            return None
        lws = self.kube.get(naming.LWS_API_VERSION, naming.LWS_KIND, namespace, naming.engine_name(name))
        if lws is None:
            return None
        generation = (lws.get("metadata") or {}).get("generation") or 0
        return {**lws, "status": {"observedGeneration": generation, **(lws.get("status") or {})}}

    def owner_is_live(self, body: Mapping[str, Any]) -> bool:
        """The LLMService still exists, is the same object (uid), and is not being deleted."""
        meta = body["metadata"]
        live = self.kube.get(naming.API_VERSION, naming.KIND, meta["namespace"], meta["name"])
        return (live is not None and live["metadata"].get("uid") == meta.get("uid")
                and not live["metadata"].get("deletionTimestamp"))

    def sync_child(self, owner: Mapping[str, Any], live: Mapping[str, Any], deleted: bool) -> bool:
        """A child changed or vanished: put it back if it drifted. True if it was re-applied."""
        if owner["metadata"].get("deletionTimestamp"):
            return False  # the owner is going away; let the garbage collector finish
        try:
            children = self.desired(owner)
        except ValueError:
            return False
        key = child_key(live)
        for child in children:
            if child_key(child) == key:
                return self._sync(owner, child, None if deleted else live, restoring=True)
        return False

    def _where(self, child: Mapping[str, Any], namespace: str) -> tuple[str, str, str, str]:
        return child["apiVersion"], child["kind"], namespace, child["metadata"]["name"]

    def _sync(self, owner: Mapping[str, Any], child: dict[str, Any], live: Mapping[str, Any] | None,
              restoring: bool = False) -> bool:
        if not needs_apply(child, live):
            return False
        self.kube.apply(child)
        what = f"{child['kind']} {child['metadata']['name']}"
        if restoring:
            self.emit(owner, "Normal", "Restored", f"{what} was {'deleted' if live is None else 'edited'}; "
                                                  f"re-applied")
        else:
            self.emit(owner, "Normal", "Created" if live is None else "Updated", what)
        return True

    def status(self, body: Mapping[str, Any], svc: LLMServiceSpec | None,
               invalid_spec: str | None = None) -> dict[str, Any]:
        """`svc`: the parsed spec, None when it is invalid (then `invalid_spec` says why)."""
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        deployment = self._engine_workload(svc, namespace, name)
        pods = self.kube.list("v1", "Pod", namespace, naming.engine_selector(name)) if deployment else []
        if deployment is not None and deployment.get("kind") == naming.LWS_KIND:   # workers fail too: say which
            pods += self.kube.list("v1", "Pod", namespace,
                                   naming.selector_string(naming.selector_labels(name, naming.ENGINE_WORKER)))
        blocked = None
        if svc is not None and deployment is None and self._lws_missing(svc):
            blocked = Problem("LeaderWorkerSetMissing",
                              f"spec.engine.nodesPerReplica {svc.engine.nodes_per_replica} runs each engine as a "
                              f"{naming.LWS_KIND}, but its API ({naming.LWS_CRD}) is not installed: install "
                              f"LeaderWorkerSet (docs/deploy.md) or set nodesPerReplica to 1")
        old = body.get("status") or {}
        new = compute_status(
            name=name, namespace=namespace, generation=int(meta.get("generation") or 0),
            # An invalid spec's conditions say only why it is invalid: no count to compare with.
            desired_replicas=svc.replicas if svc is not None else 0,
            deployment=deployment, pods=pods,
            old_conditions=old.get("conditions") or [], now=self.now(), invalid_spec=invalid_spec, blocked=blocked)
        self._announce(body, old.get("conditions") or [], new["conditions"])
        return new

    def resync_all(self, namespace_patterns: list[str]) -> int:
        """Reconciles every LLMService in scope (the periodic safety net); returns how many."""
        count = 0
        for item in self.kube.list(naming.API_VERSION, naming.KIND, None):
            body = {**item, "apiVersion": naming.API_VERSION, "kind": naming.KIND}
            namespace = body["metadata"]["namespace"]
            if body["metadata"].get("deletionTimestamp") or (
                    namespace_patterns and not any(fnmatch.fnmatchcase(namespace, p) for p in namespace_patterns)):
                continue
            status = self.reconcile(body, restoring=True)
            old = body.get("status") or {}
            if any(old.get(k) != v for k, v in status.items()):   # keys others write (status.adapters) aside
                self.kube.patch_status(namespace, body["metadata"]["name"], status)
            count += 1
        return count

    def refresh_status(self, body: Mapping[str, Any]) -> None:
        """Status of an LLMService from outside its own handlers (a child changed)."""
        try:
            svc, invalid = LLMServiceSpec.from_body(body), None
        except ValueError as e:
            svc, invalid = None, str(e)
        new = self.status(body, svc, invalid_spec=invalid)
        old = body.get("status") or {}
        if any(old.get(k) != v for k, v in new.items()):
            self.kube.patch_status(body["metadata"]["namespace"], body["metadata"]["name"], new)

    def _announce(self, body: Mapping[str, Any], old: list[Mapping[str, Any]], new: list[dict[str, Any]]) -> None:
        """An Event whenever Ready or Degraded changes status or reason (one per distinct news)."""
        before = {c.get("type"): (c.get("status"), c.get("reason")) for c in old}
        posted: set[tuple[str, str]] = set()
        for cond in new:
            if cond["type"] == "Progressing" or before.get(cond["type"]) == (cond["status"], cond["reason"]):
                continue
            if (cond["reason"], cond["message"]) in posted:  # e.g. Ready=False and Degraded=True, same cause
                continue
            posted.add((cond["reason"], cond["message"]))
            bad = (cond["type"] == "Degraded") == (cond["status"] == "True")
            self.emit(body, "Warning" if bad else "Normal", cond["reason"], cond["message"])
